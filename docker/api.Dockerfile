# syntax=docker/dockerfile:1
# tokenrelay API image: FastAPI + uvicorn, no torch. Build from the repository root:
#   docker build -f docker/api.Dockerfile -t tokenrelay-api:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-trixie

# --- build: install the `api` extra into a self-contained virtualenv ---------------------
FROM ${PYTHON_IMAGE} AS build
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
RUN pip install --no-cache-dir "./[api,client]"

# --- runtime: the virtualenv and an unprivileged user, nothing else ------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
RUN groupadd --system --gid "${UID}" tokenrelay \
    && useradd --system --uid "${UID}" --gid tokenrelay --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin tokenrelay \
    && mkdir -p /var/cache/tokenrelay \
    && chown "${UID}:${UID}" /var/cache/tokenrelay
COPY --from=build /opt/venv /opt/venv
# DL3064 fires on the word TOKEN in TOKENRELAY_CACHE_DIR: a folder path, not a secret.
# hadolint ignore=DL3064
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TOKENRELAY_CACHE_DIR=/var/cache/tokenrelay
WORKDIR /var/cache/tokenrelay
USER ${UID}:${UID}
EXPOSE 8000
# /healthz answers while the process is alive; /readyz also needs Redis.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
# uvicorn finishes in-flight requests on SIGTERM (Docker's and Kubernetes' stop signal).
ENTRYPOINT ["tokenrelay"]
CMD ["api", "--host", "0.0.0.0", "--port", "8000"]
