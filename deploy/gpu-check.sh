#!/usr/bin/env bash
# The one device check of the CUDA path (`make gpu-check`), for a CUDA machine with torch, Triton,
# transformers and pytest but no internet (tested against torch 2.11 + CUDA 13, Triton 3.6,
# transformers 5.17, Python 3.12): the wheels it lacks come along in .whl/ (fetched beforehand,
# where pip works, by deploy/gpu-check-wheels.sh). It runs
#   1. the CUDA parity tests (LLM_TEST_DEVICE=cuda): the Triton kernels against the torch backend
#      (float32, float16, bfloat16), the tiny models' logits against transformers through the
#      Triton backend and the captured decode graphs, padded graph replays against unpadded steps,
#      greedy tokens on CUDA against the CPU engine, the profile run, async scheduling against the
#      plain loop;
#   2. the CUDA benchmark (python -m benchmarks.cuda, which is python -m benchmarks --device cuda):
#      nano-vllm's offline shape on Qwen3-0.6B's architecture, batch-1 TPOT with graphs (async
#      scheduling on and off) and eager, then torch.profiler's tables of decode steps at 1 and 256
#      sequences (gpu-check-profile.txt);
# and prints one table. The logs go to $OUT (or /tmp/gpu-check). The default model's weights (94 MB)
# are not part of it: the CUDA machine gets only what travels with the checkout. Budget: under 8
# minutes in all (270 s of tests with the Triton compiles, 200 s of benchmark, each a hard limit).
#
#   bash deploy/gpu-check.sh --cpu
# rehearses the same script end to end on a CPU, so a broken script never reaches a device (a GPU
# is lent rarely and for minutes): the same pytest command line and plugins (pytest-timeout where
# installed), the same test files on their CPU parametrization under Triton's interpreter, and the
# benchmark's own code (`python -m benchmarks.cuda --device cpu`) on a tiny model at toy sizes;
# logs in $OUT (or /tmp/gpu-check-cpu). `make test` runs it (tests/deploy/test_gpu_check_cpu.py).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") mode=cuda ;;
    --cpu) mode=cpu ;;
    *) echo "usage: bash deploy/gpu-check.sh [--cpu]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# The CPU reference engines of the parity tests use torch's ops: the native CPU kernels (built at
# install, which this check skips) are not what it tests.
export LLM_NATIVE_KERNELS=0

if [ "$mode" = cuda ]; then
    LOGS=${OUT:-/tmp/gpu-check}
    export LLM_TEST_DEVICE=cuda
    unset TRITON_INTERPRET
    bench_args=(--device cuda)
else
    LOGS=${OUT:-/tmp/gpu-check-cpu}
    export LLM_TEST_DEVICE=cpu TRITON_INTERPRET=1
    # Qwen3's layout at toy sizes: the benchmark runs any config folder on random weights
    mkdir -p "$LOGS/tiny-qwen3"
    cat > "$LOGS/tiny-qwen3/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": false, "bos_token_id": 1,
 "eos_token_id": 2, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
 "max_position_embeddings": 4096, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
 "vocab_size": 512}
JSON
    bench_args=(--device cpu --model "$LOGS/tiny-qwen3" --num-seqs 6 --lengths 8,24 --tpot-tokens 8,12
                --kv-cache-memory $((16 << 20)))
fi
mkdir -p "$LOGS"

if compgen -G ".whl/*.whl" >/dev/null; then
    if [ "$mode" = cuda ]; then
        $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/gpu-check-site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "(--cpu: the wheels in .whl/ are for the CUDA machine's Python and are not installed here)"
    fi
fi
$PYTHON - "$mode" <<'PY' || exit 1
import sys
import torch, triton, transformers
device = torch.cuda.get_device_name(0) if sys.argv[1] == "cuda" else "CPU (rehearsal: --cpu)"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"transformers {transformers.__version__}; {device}")
PY

# One hung test must not take the check's whole budget: pytest-timeout where installed. pytest loads
# an installed plugin by its entry point already; naming it again (-p pytest_timeout) registers it
# twice and pytest stops before any test runs, so -p only where autoloading is off.
per_test=()
case "$($PYTHON - <<'PY'
import importlib.metadata, importlib.util, os
if importlib.util.find_spec("pytest_timeout") is None:
    print("none")
elif os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") or not any(
        e.value == "pytest_timeout" for e in importlib.metadata.entry_points(group="pytest11")):
    print("explicit")
else:
    print("autoloaded")
PY
)" in
    autoloaded) per_test=(--timeout 90) ;;
    explicit) per_test=(-p pytest_timeout --timeout 90) ;;
esac
start=$(date +%s)
timeout 270 $PYTHON -m pytest -q -p no:cacheprovider -rfE --tb=short "${per_test[@]}" \
    tests/engine/test_triton_attention.py tests/engine/test_decode_graphs.py tests/engine/test_model_parity.py \
    tests/engine/test_backend_agreement.py tests/engine/test_profile_run.py tests/engine/test_cuda_bench.py \
    tests/engine/test_async_scheduling.py \
    2>&1 | tee "$LOGS/gpu-check-tests.log"
tests_rc=${PIPESTATUS[0]}
tests_s=$(( $(date +%s) - start ))

start=$(date +%s)
rm -f "$LOGS/gpu-check-bench.json"
timeout 200 $PYTHON -m benchmarks.cuda "${bench_args[@]}" --json "$LOGS/gpu-check-bench.json" \
    --profile "$LOGS/gpu-check-profile.txt" 2>&1 \
    | tee "$LOGS/gpu-check-bench.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$(( $(date +%s) - start ))
# a benchmark that exits 0 without its figures is a failure too
[ "$bench_rc" -eq 0 ] && [ ! -s "$LOGS/gpu-check-bench.json" ] && bench_rc=1

echo
if [ "$mode" = cuda ]; then echo "=== GPU check ==="; else echo "=== GPU check, rehearsed on the CPU ==="; fi
printf '%-22s %-8s %6s s  %s\n' "parity tests" "$tests_rc" "$tests_s" "$(grep -E '(passed|failed|error)' "$LOGS/gpu-check-tests.log" | tail -n 1)"
printf '%-22s %-8s %6s s\n' "benchmark" "$bench_rc" "$bench_s"
sed -n '/architecture, random weights/,$p' "$LOGS/gpu-check-bench.log"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
