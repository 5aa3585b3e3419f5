#!/usr/bin/env bash
# The wheels the GPU check needs beyond the CUDA machine's own packages (it has torch, triton,
# transformers, numpy, safetensors, tqdm and pytest, for Python 3.12, and no internet), fetched here
# into .whl/ (ignored by git), for the check to carry and install there (deploy/gpu-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$(grep '^msgspec==' requirements.txt)"
ls .whl
