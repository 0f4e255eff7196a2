"""``GET /v1/models`` and llama.cpp's ``GET /props``: what the simulator says of its own
models, in the shape of the server it plays (``listing`` in its config), each with the
window it enforces.

Real servers differ, and the proxy must read each as it is:

* vLLM lists ``max_model_len`` per model (``ModelCard`` in its OpenAI protocol module);
* OpenRouter lists ``context_length`` and, for the provider a request goes to,
  ``top_provider.context_length`` and ``top_provider.max_completion_tokens``;
* llama.cpp's ``/v1/models`` carries only ``meta.n_ctx_train``, the length the model was
  trained for, which is not what it serves: the window of a slot is ``/props``'
  ``default_generation_settings.n_ctx`` (``get_props`` in its server), here four times
  smaller than the trained length, as a server started with ``-c`` often is;
* OpenAI lists ids alone, and there is no ``/props``.
"""

from __future__ import annotations

from typing import Any

from proxy.simulator.completion import CREATED
from proxy.simulator.config import SimulatorConfig, resolve_model

# llama.cpp: the trained length, as a multiple of the window served (n_ctx).
_TRAINED_TIMES = 4


def listing_body(config: SimulatorConfig) -> dict[str, Any]:
    """The models listing: the config's rules that are not globs, each described."""
    data = []
    for name in config.listed_models():
        profile = resolve_model(config, name)
        entry: dict[str, Any] = {"id": name, "object": "model", "created": CREATED}
        window, output = profile.context_window, profile.max_output_tokens
        if config.listing == "vllm":
            entry.update(owned_by="vllm", root=name, max_model_len=window)
        elif config.listing == "openrouter":
            entry.update(
                owned_by="simulator",
                context_length=window,
                top_provider={"context_length": window, "max_completion_tokens": output},
            )
        elif config.listing == "llamacpp":
            entry.update(owned_by="llamacpp", meta={"n_ctx_train": window * _TRAINED_TIMES})
        else:
            entry.update(owned_by="simulator")
        data.append(entry)
    return {"object": "list", "data": data}


def props_body(config: SimulatorConfig) -> dict[str, Any] | None:
    """llama.cpp's server properties (its one model's window per slot), or None for a
    server that has no ``/props`` (every other ``listing``)."""
    if config.listing != "llamacpp":
        return None
    listed = config.listed_models()
    window = resolve_model(config, listed[0]).context_window if listed else None
    n_ctx = window or config.default.context_window
    return {
        "default_generation_settings": {"n_ctx": n_ctx, "params": {"n_predict": -1}},
        # As llama.cpp's -np: one when the config says so (a turn queues behind any
        # other request); without a limit, a server with slots to spare.
        "total_slots": config.slots or 4,
        "model_path": f"/models/{listed[0] if listed else 'model'}.gguf",
    }
