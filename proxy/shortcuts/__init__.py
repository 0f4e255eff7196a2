"""The machine room: every place the proxy reaches into a framework's internals for speed.

Each module here holds one framework's shortcuts and the public-API path beside them:
``uvicorn_cycle`` (the request-response cycle), ``starlette_request`` (the request and its
headers), ``starlette_routing`` (the compacting routes' POSTs past the router),
``starlette_response`` (whole and peeked answers), ``aiohttp_request`` (the upstream
request). Each asks ``gate.on(framework)`` once, at start-up or at first use: a shortcut
runs only on the release series it was written and tested for, and only while
``COMPACTION_PROXY_SHORTCUTS`` is not ``off`` (docs/architecture.md, "Framework
shortcuts"); otherwise the framework's own path serves, which is the same behaviour.
"""
