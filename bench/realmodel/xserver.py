"""``llama-server``'s command line over the prebuilt ``xllamacpp`` wheel.

    python xserver.py -m MODEL.gguf -c 4096 -t 1 -np 1 --host 127.0.0.1 --port 8080 \
        --jinja --metrics [--cache-reuse 256]

``xllamacpp.Server`` runs llama.cpp's own C++ server (its HTTP routes, slots, prompt cache,
chat templates and ``/metrics``) inside this process, so a wheel from PyPI stands in for a
``llama-server`` built from source (minutes instead of a quarter of an hour on two cores).
``setup.sh server`` installs the wheel into a venv of its own and writes a ``llama-server``
script that runs this file; ``run.py`` starts it with the flags it gives a built binary.
Only those flags are read. The process serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("-np", "--parallel", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--jinja", action="store_true")
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--cache-reuse", type=int, default=0)
    args = parser.parse_args(argv)

    import xllamacpp  # type: ignore[import-not-found]  # only in setup.sh's venv

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    # One KV cache per slot, each a share of -c: what run.py's "-c WINDOW x NP" assumes.
    params.kv_unified = False
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.hostnames = [args.host]
    params.port = args.port
    params.use_jinja = args.jinja
    params.endpoint_metrics = args.metrics
    # Cached chunks of at least this many tokens reused at a shifted position: a prompt
    # whose oldest turns were dropped is read from the cache, not again (0: off).
    params.n_cache_reuse = args.cache_reuse
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    print(f"xllamacpp {xllamacpp.__version__} serving on {server.listening_address}", flush=True)
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
