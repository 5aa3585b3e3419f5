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
#   2. the CUDA benchmark (python -m engine.bench --device cuda): nano-vllm's offline shape on
#      Qwen3-0.6B's architecture, batch-1 TPOT with graphs (async scheduling on and off) and eager,
#      then torch.profiler's tables of decode steps at 1 and 256 sequences (gpu-check-profile.txt);
# and prints one table. The logs go to $OUT (or /tmp/gpu-check). The default model's weights (94 MB) are not part of it: the CUDA machine
# gets only what travels with the checkout. Budget: under 8 minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOGS=${OUT:-/tmp/gpu-check}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 LLM_TEST_DEVICE=cuda
unset TRITON_INTERPRET
# The CPU reference engines of the parity tests use torch's ops: building the native CPU kernels
# (a minute of compiling) is not what this check tests.
export LLM_NATIVE_KERNELS=0

if compgen -G ".whl/*.whl" >/dev/null; then
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-check-site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
fi
$PYTHON - <<'PY'
import torch, triton, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"transformers {transformers.__version__}; {torch.cuda.get_device_name(0)}")
PY

# one hung test must not take the check's whole budget (pytest-timeout, where installed)
per_test=()
$PYTHON -c "import pytest_timeout" 2>/dev/null && per_test=(-p pytest_timeout --timeout 90)
start=$(date +%s)
timeout 270 $PYTHON -m pytest -q -p no:cacheprovider -rfE --tb=short "${per_test[@]}" \
    tests/engine/test_triton_attention.py tests/engine/test_decode_graphs.py tests/engine/test_model_parity.py \
    tests/engine/test_backend_agreement.py tests/engine/test_profile_run.py tests/engine/test_cuda_bench.py \
    tests/engine/test_async_scheduling.py \
    2>&1 | tee "$LOGS/gpu-check-tests.log"
tests_rc=${PIPESTATUS[0]}
tests_s=$(( $(date +%s) - start ))

start=$(date +%s)
timeout 200 $PYTHON -m engine.bench --device cuda --json "$LOGS/gpu-check-bench.json" \
    --profile "$LOGS/gpu-check-profile.txt" 2>&1 \
    | tee "$LOGS/gpu-check-bench.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$(( $(date +%s) - start ))

echo
echo "=== GPU check ==="
printf '%-22s %-8s %6s s  %s\n' "parity tests" "$tests_rc" "$tests_s" "$(grep -E '(passed|failed|error)' "$LOGS/gpu-check-tests.log" | tail -n 1)"
printf '%-22s %-8s %6s s\n' "benchmark" "$bench_rc" "$bench_s"
sed -n '/^Qwen3-0.6B architecture/,$p' "$LOGS/gpu-check-bench.log"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
