"""Calibration end to end (issue 3): a model the proxy undercounts stays inside its window
once the provider's usage.prompt_tokens has corrected the estimate. In-process:
tests/upstream/test_calibrate.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from tests.support.chat import FILLER, Chat, small_window_settings, stats
from tests.support.servers import run_server


@pytest.fixture
def inflating_sim() -> Iterator[str]:
    """A provider that counts 50% more tokens than the client's tokenizer shows."""
    config = SimulatorConfig(models=(ModelRule(match="sim-4k", token_scale=1.5),))
    with run_server(create_simulator_app(config)) as url:
        yield url


def test_reported_usage_keeps_an_undercounted_model_inside_its_window(
    inflating_sim: str, start_proxy: Callable[..., str]
) -> None:
    # Recovery off: without calibration the proxy would plan against a window
    # 50% larger than the provider's and the first overflow would fail a turn.
    url = start_proxy(small_window_settings(inflating_sim, recover_overflow=False))
    chat = Chat(url, session="inflated")
    chat.say("FACT tool=hammer")
    for turn in range(60):
        chat.say(f"Turn {turn}: {FILLER}")
    assert chat.say("RECALL tool") == "tool=hammer"
    assert stats(inflating_sim)["overflows"] == 0
    assert chat.statuses["compacted"] >= 1
