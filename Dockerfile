# compaction-proxy: the same install and start steps CI runs (pip install . with
# -c constraints.txt, the exact versions the suite passed on; `compaction-proxy serve`),
# configured through PROXY_* environment variables or a mounted YAML file (--config).
FROM python:3.11-slim

# TIKTOKEN_CACHE_DIR is where the baked tokenizers are read from: a path, no secret.
# hadolint ignore=DL3064
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TIKTOKEN_CACHE_DIR=/opt/tiktoken \
    PROXY_SERVER__HOST=0.0.0.0 \
    PROXY_SERVER__PORT=8080

WORKDIR /app
COPY constraints.txt pyproject.toml README.md ./
COPY proxy ./proxy
# Every dependency at its pinned version, then the exact tokenizers, fetched once at build
# time (the build has network; the cluster may not). A failed download fails the build:
# an image that approximates o200k_base would count tokens unlike the one CI tested.
RUN pip install --no-cache-dir -c constraints.txt '.[encryption]' \
    && python -c "import tiktoken; [tiktoken.get_encoding(n) for n in ('o200k_base', 'cl100k_base')]"

USER 65534:65534
EXPOSE 8080
# /healthz on the port the proxy listens on (PROXY_SERVER__PORT; a port set in a mounted
# config file instead needs PROXY_SERVER__PORT set to match), bounded by --timeout.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PROXY_SERVER__PORT', '8080'), timeout=4)"]
# Exec form: the proxy is PID 1 and gets SIGTERM itself. PID 1 ignores a signal it has no
# handler for, so `serve` installs one first thing (proxy/__main__.py, tests/e2e/test_pid1.py:
# within ~0.1 s of exec, before the seconds of start-up), and drains on SIGTERM once
# serving. It forks no children it does not wait for (workers are its own), so no init
# (tini, --init) is needed to reap zombies.
CMD ["compaction-proxy", "serve"]
