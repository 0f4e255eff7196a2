"""An OpenAI-compatible model simulator: deterministic, free, and strict.

It answers chat completions like a real server would, including the errors a
compacting proxy has to survive (context overflow in several providers'
formats, broken tool-call pairing, strict role alternation), and replies in a
small language (``FACT``/``RECALL``/``CALL``, see ``replies.py``) that makes
compaction observable. It speaks the Responses API (responses.py) and Anthropic's
Messages API (messages.py) on the same rules. Tests and benchmarks use it as the
upstream; users run it with ``compaction-proxy simulate-upstream``.
"""

from __future__ import annotations

from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig, load_simulator_config
from proxy.simulator.server import serve_simulator

__all__ = ["SimulatorConfig", "create_simulator_app", "load_simulator_config", "serve_simulator"]
