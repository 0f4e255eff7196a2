"""Issue 20, items 1-3: nothing a client or an upstream sends grows the proxy without bound.

- Strings the proxy keys anything by (the model name, session names) are capped at
  parse with a 400, so every per-process table, bounded in entries, is bounded in
  bytes: ever-new 1 MB model names and 64 KB session names leave the process's
  memory where it was.
- A request's log line copies a bounded amount of any client-chosen value.
- ``/metrics`` stays a few hundred series whatever models, paths and upstream
  statuses go by: no label value comes from a client or an upstream as it is.

The caps and the closed label sets here; a real proxy fed ever-new names and statuses:
tests/e2e/test_bounds_e2e.py.
"""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import Gauge

from proxy.errors import InvalidRequest
from proxy.observe.metrics.series import ModelGauge, status_label
from proxy.observe.recorder import LOGGED_VALUE_CHARS, clipped
from proxy.routes.parse import parse_chat_request
from proxy.routes.responses import parse_responses_request
from tests.support.chat import HELLO

# Model ids real clients send: all well under the default cap of 512 bytes.
REAL_MODELS = (
    "gpt-4o-2024-08-06",
    "hf.co/bartowski/Llama-3.3-70B-Instruct-GGUF:Q4_K_M",
    "ft:gpt-4o-mini-2024-07-18:my-org:custom-suffix:9pQj2kXy",
    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
    "/models/hub/models--Qwen--Qwen2.5-72B-Instruct/snapshots/" + "0" * 40,
)


# --- the caps, as pure logic ------------------------------------------------------------


@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_model_ids_pass_the_cap(model: str) -> None:
    body = orjson.dumps({"model": model, "messages": HELLO})
    assert parse_chat_request(body)["model"] == model
    assert parse_responses_request(body, 10)["model"] == model


@pytest.mark.parametrize("model", ["m" * 513, "\u00e9" * 257])  # bytes, not characters
def test_a_model_name_over_the_cap_is_refused_naming_the_field(model: str) -> None:
    body = orjson.dumps({"model": model, "messages": HELLO, "input": "hi"})
    for parse in (parse_chat_request, lambda b: parse_responses_request(b, 10)):
        with pytest.raises(InvalidRequest) as refused:
            parse(body)
        assert refused.value.param == "model"
        assert refused.value.code == "string_above_max_length"
    assert parse_chat_request(body, max_model_bytes=1024)["model"] == model


def test_status_labels_are_a_closed_set() -> None:
    labels = {status_label(status) for status in range(0, 1000)}
    assert labels == {"none", "1xx", "2xx", "3xx", "4xx", "5xx", "429", "499", "other"}
    assert status_label(200) == "2xx"
    assert status_label(503) == "5xx"


def test_the_learned_window_gauge_is_labelled_by_configured_entry() -> None:
    from prometheus_client import CollectorRegistry

    gauge = ModelGauge(Gauge("g", "g", ["model"], registry=CollectorRegistry()))
    gauge.labels(model="x" * 500).set(1)
    gauge.entry_of = lambda name: "gpt-4o*" if name.startswith("gpt-4o") else "other"
    gauge.labels(model="gpt-4o-mini").set(2)
    labels = {s.labels["model"] for m in gauge.gauge.collect() for s in m.samples}
    assert labels == {"other", "gpt-4o*"}


def test_logged_values_are_clipped() -> None:
    assert clipped("short") == "short"
    long = clipped("p" * 100_000)
    assert len(long) < LOGGED_VALUE_CHARS + 32
    assert long.endswith("(100000 chars)")


# --- memory -----------------------------------------------------------------------------


# --- log lines --------------------------------------------------------------------------


# --- metrics ----------------------------------------------------------------------------
