"""The process edge: the uvicorn server, workers, shutdown, client limits and the demo.

``serve(settings)`` is ``compaction-proxy serve``: one process (server.py), or with
``server.workers`` > 1 a supervisor and that many workers (workers.py), each serving as
the one process does. Here, above both, so neither imports the other back.
"""

from __future__ import annotations

from proxy.config import Settings


def serve(settings: Settings) -> int:
    """Run until SIGINT/SIGTERM, then drain (proxy.serve.shutdown); the exit status.

    A ``store.url`` that names one node of a Redis Cluster is refused first, before any
    worker starts (``ConfigError``: the command line prints it and exits 2)."""
    import asyncio

    from proxy.store import refuse_cluster_node

    asyncio.run(refuse_cluster_node(settings.store.url))
    if settings.server.workers > 1:
        from proxy.serve.workers import run_workers

        return run_workers(settings)
    from proxy.serve.server import serve_process

    serve_process(settings)
    return 0
