#!/usr/bin/env bash
# Build the Dockerfile and serve from the image on a machine without a Docker engine or Docker Hub:
#   1. a Debian bookworm base (Python 3.11 with its headers, as the python:3.11 images) made with
#      debootstrap and `podman import`ed;
#   2. `podman build --isolation chroot` of the Dockerfile on that base, with this machine's CA bundle
#      (PIP_CERT) and local wheel folder (PIP_FIND_LINKS, where the CPU torch lies) mounted in;
#   3. the image's ENTRYPOINT started with the image's ENV, USER and WORKDIR by chroot into a mounted
#      container root (`podman run` cannot set rlimits here), /proc, /sys and /dev bound in;
#   4. /health, the image's own HEALTHCHECK, /v1/models, a streamed chat completion (OpenAI SDK) and
#      /metrics checked by deploy/check_server.py;
#   5. the native kernels: the image's server must name its kernel tier in its log (the image has no
#      compiler: the tiers were built in the build stage), and its output tok/s at 32 concurrent
#      streams must be within 10 % of this checkout's own server on this host, both loaded in turns
#      by one `python -m loadtest` run; then both servers are stopped with SIGTERM;
#   6. everything it made (mounts, container, images, podman storage, base root) removed.
# Needs root. Usage: deploy/docker-test.sh   (PYTHON: a Python with openai and httpx, for step 4)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
# Outside the repository: the build context must stay small, and a failed run must not dirty it.
WORK=${DOCKER_TEST_DIR:-/var/tmp/llm-serve-docker-test}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_TAG=localhost/llm-serve-base:bookworm
IMAGE_TAG=localhost/llm-serve:docker-test
START_TIMEOUT_S=600
# Private storage, so the test neither sees nor touches any other podman images on the machine.
PODMAN=(podman --root "$WORK/storage" --runroot "$WORK/run" --tmpdir "$WORK/libpod" --storage-driver overlay)
SERVER_PID=""
HOST_PID=""
ROOT=""
# the image's c=32 output tok/s against the host's: at least this ratio, at most its inverse
MIN_RATIO=0.9

log() { printf '[docker-test %4ds] %s\n' "$SECONDS" "$*"; }

umount_under() {  # deepest first, so nested binds come off before their parents
    findmnt -rn -o TARGET | grep -E "^$1(/|$)" | sort -r | while read -r target; do
        umount "$target" 2>/dev/null || umount -l "$target"
    done
}

cleanup() {
    local status=$?
    trap - EXIT
    set +e
    local pid
    for pid in "$SERVER_PID" "$HOST_PID"; do
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill -KILL -- "-$pid" 2>/dev/null  # its own session: the server and its children
        fi
    done
    if [[ -d "$WORK" ]]; then
        [[ -n "$ROOT" ]] && umount_under "$ROOT"
        if [[ -d "$WORK/storage" ]]; then
            "${PODMAN[@]}" umount --all >/dev/null 2>&1
            "${PODMAN[@]}" rm --all --force >/dev/null 2>&1
            "${PODMAN[@]}" rmi --all --force >/dev/null 2>&1
        fi
        umount_under "$WORK"
        rm -rf "$WORK"
    fi
    if [[ -e "$WORK" ]] || findmnt -rn -o TARGET | grep -q "^$WORK"; then
        log "cleanup incomplete: $WORK or a mount under it is left"
        status=1
    else
        log "cleaned up: no server left; mounts, container, images, podman storage and $WORK removed"
    fi
    exit "$status"
}

install_tools() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

build_base() {
    # python3-dev: the headers the native kernels compile against, as the python:3.11 images have them
    log "debootstrap bookworm (python3, python3-venv, python3-dev, ca-certificates) from $MIRROR"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
        bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log"; return 1; }
    rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
    tar -C "$WORK/rootfs" -c . | "${PODMAN[@]}" import --quiet - "$BASE_TAG" >/dev/null
    rm -rf "$WORK/rootfs"
    log "base image $BASE_TAG imported"
}

build_image() {
    local args=(--isolation chroot --format docker --build-arg "BASE_IMAGE=$BASE_TAG" -t "$IMAGE_TAG")
    # TLS here is signed by a CA that a fresh Debian root does not trust: lay ours over its bundle.
    [[ -n "${PIP_CERT:-}" ]] && args+=(-v "$PIP_CERT:/etc/ssl/certs/ca-certificates.crt:ro")
    if [[ -n "${PIP_FIND_LINKS:-}" ]]; then
        local dir
        for dir in $PIP_FIND_LINKS; do args+=(-v "$dir:$dir:ro"); done
        # The local folder holds the CPU torch, as it does for `make install` on this machine.
        args+=(--build-arg "PIP_FIND_LINKS=$PIP_FIND_LINKS" --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL-}")
    elif [[ -n "${TORCH_INDEX_URL+set}" ]]; then
        args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
    fi
    log "podman build ${args[*]} $REPO"
    "${PODMAN[@]}" build "${args[@]}" "$REPO" >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; return 1; }
    grep -E '^(\[[0-9]/[0-9]\] )?STEP|^/opt/llm-serve/models' "$WORK/build.log" | sed 's/^/  /' | cut -c1-150
    local size
    size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE_TAG")
    log "built $IMAGE_TAG: $((size / 1000000)) MB"
}

image_field() { "${PODMAN[@]}" image inspect --format "$1" "$IMAGE_TAG"; }

# The image's ENV (plus overrides) as `env -i` arguments, and its USER, for a chroot.
prepare_run() {
    mapfile -t IMAGE_ENV < <(image_field '{{range .Config.Env}}{{println .}}{{end}}' | sed '/^$/d')
    IMAGE_USER=$(image_field '{{.Config.User}}')
    IMAGE_WORKDIR=$(image_field '{{.Config.WorkingDir}}')
    mapfile -t ENTRYPOINT < <(image_field '{{range .Config.Entrypoint}}{{println .}}{{end}}' | sed '/^$/d')
    mapfile -t HEALTHCHECK < <(image_field '{{range .HealthCheck.Test}}{{println .}}{{end}}' | sed '/^$/d')
    local uid=${IMAGE_USER%%:*}
    local home
    home=$(awk -F: -v u="$uid" '$1 == u || $3 == u { print $6 }' "$ROOT/etc/passwd")
    [[ -n "$home" ]] || { log "user $IMAGE_USER not in the image's /etc/passwd"; return 1; }
    # Prefix of a command run in the image root as the image's user, with its ENV and WORKDIR, as
    # `docker run` would (HOME from /etc/passwd; LLM_PORT moved to a free port of this host).
    IN_IMAGE=(env -i "${IMAGE_ENV[@]}" HOME="$home" LLM_PORT="$PORT"
              chroot --userspec="$IMAGE_USER" "$ROOT" env --chdir="$IMAGE_WORKDIR")
}

wait_healthy() {  # port, pid, log
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
            "http://127.0.0.1:$1/health" 2>/dev/null; do
        if ! kill -0 "$2" 2>/dev/null || ((SECONDS > deadline)); then
            log "server did not become healthy:"; tail -40 "$3"; return 1
        fi
        sleep 2
    done
}

start_server() {
    local container
    container=$("${PODMAN[@]}" create --network none "$IMAGE_TAG")
    ROOT=$("${PODMAN[@]}" mount "$container")  # writable, like a running container's root
    mount -t proc proc "$ROOT/proc"
    mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys"
    mount --rbind /dev "$ROOT/dev" && mount --make-rslave "$ROOT/dev"
    PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    prepare_run
    log "starting ${ENTRYPOINT[*]} as user $IMAGE_USER in $IMAGE_WORKDIR (LLM_PORT=$PORT; no other argument)"
    setsid "${IN_IMAGE[@]}" "${ENTRYPOINT[@]}" >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    wait_healthy "$PORT" "$SERVER_PID" "$WORK/server.log"
    grep -E 'converting|ready:' "$WORK/server.log" | sed 's/^/  /'
    log "server healthy"
}

# The image's server runs a native kernel tier, and as fast as this checkout's server on this host.
compare_with_host() {
    local tier
    tier=$(grep -o 'kernel tier [a-z0-9_]* ([^)]*)' "$WORK/server.log" | head -n 1)
    [[ -n "$tier" ]] || { log "the image's server names no kernel tier:"; grep -i native "$WORK/server.log"; return 1; }
    log "the image's server runs $tier"
    local host_port
    host_port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    setsid "$PYTHON" -m server --port "$host_port" >"$WORK/host-server.log" 2>&1 &
    HOST_PID=$!
    wait_healthy "$host_port" "$HOST_PID" "$WORK/host-server.log"
    log "this checkout's server healthy on the host: $(grep -o 'kernel tier [a-z0-9_]*' "$WORK/host-server.log" | head -n 1)"
    "$PYTHON" -m loadtest --target "image=http://127.0.0.1:$PORT/v1" --target "host=http://127.0.0.1:$host_port/v1" \
        --concurrency 32 --num-prompts 32 --rounds 2 --input-len 128 --output-len 128 --ignore-eos --warmup 2 \
        --output-dir "$WORK/load" >"$WORK/load.log" 2>&1 || { tail -30 "$WORK/load.log"; return 1; }
    "$PYTHON" - "$WORK/load/results.json" "$MIN_RATIO" <<'PY'
import json, sys
from collections import defaultdict
runs = json.load(open(sys.argv[1]))["runs"]
tokens, seconds = defaultdict(float), defaultdict(float)
for run in runs:  # every round of each target: its output tokens over its time
    tokens[run["target"]] += run["total_output_tokens"]
    seconds[run["target"]] += run["duration"]
rate = {t: tokens[t] / seconds[t] for t in tokens}
ratio = rate["image"] / rate["host"]
print(f"  c=32 output tok/s: image {rate['image']:.1f}, host {rate['host']:.1f}, image / host {ratio:.3f}")
sys.exit(0 if float(sys.argv[2]) <= ratio <= 1 / float(sys.argv[2]) else 1)
PY
    kill -TERM "$HOST_PID"; wait "$HOST_PID" || true; HOST_PID=""
}

stop_server() {
    kill -TERM "$SERVER_PID"
    local deadline=$((SECONDS + 60)) code=0
    while kill -0 "$SERVER_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then log "server ignored SIGTERM for 60 s"; return 1; fi
    wait "$SERVER_PID" || code=$?
    SERVER_PID=""
    log "server stopped on SIGTERM (exit code $code)"
    ((code == 0))
}

main() {
    [[ $(id -u) == 0 ]] || { echo "docker-test needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
    install_tools
    rm -rf "$WORK" && mkdir -p "$WORK"
    trap cleanup EXIT
    build_base
    build_image
    start_server
    [[ "${HEALTHCHECK[0]:-}" == CMD ]] || { log "the image has no exec-form HEALTHCHECK"; exit 1; }
    "${IN_IMAGE[@]}" "${HEALTHCHECK[@]:1}"  # exits non-zero unless /health answers 200
    log "the image's HEALTHCHECK command passes"
    "$PYTHON" "$REPO/deploy/check_server.py" "http://127.0.0.1:$PORT"
    compare_with_host || { log "the image's kernels: not within $MIN_RATIO of the host's (or no tier)"; exit 1; }
    stop_server
    log "all checks passed"
}

main "$@"
