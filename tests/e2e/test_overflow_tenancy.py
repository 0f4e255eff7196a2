"""Issue 20, items 5, 6 and 14 over real HTTP: what an overflow answer may teach, and to whom.

* A validation answer that echoes the request (FastAPI's default 422) teaches nothing,
  whatever the client planted in it (item 5).
* A window learned for one model name is never another name's or another tenant's
  (item 6): keys are length-prefixed.
* A retry after an overflow is always smaller than what was rejected, even when the
  stated limit is far above what was sent (item 14, DashScope).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from proxy.config import Settings
from tests.support.faulty_upstream import (
    FaultyUpstream,
    answer,
    completion,
    fastapi_validation,
    in_turn,
)
from tests.support.servers import RedisServer, proxy_settings

CONFIGURED = 32768
MODEL = "vm"


@pytest.fixture
def faulty() -> Iterator[FaultyUpstream]:
    with FaultyUpstream() as up:
        yield up


def settings(upstream: str, **compaction: Any) -> Any:
    return proxy_settings(
        upstream,
        # fnmatch: "vm|anonymous" resolves to the same configured window as "vm".
        models=[{"match": f"{MODEL}*", "context_window": CONFIGURED, "max_output_tokens": 256}],
        compaction={"summary_max_tokens": 400, **compaction},
    )


def post(url: str, key: str | None, messages: list[dict[str, Any]], **extra: Any) -> Any:
    headers = dict(extra.pop("headers", {}))
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = {"model": extra.pop("model", MODEL), "messages": messages, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def hello() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hello " * 200}]


def window_of(response: Any) -> int:
    return int(response.headers["x-context-window"])


def shared_gauges(url: str) -> list[str]:
    metrics = httpx.get(f"{url}/metrics").text
    return re.findall(r"^compaction_proxy_learned_window_tokens\{.*$", metrics, re.M)


# --- item 5: validation answers echo the request -----------------------------------------

PLANTED = [
    # llama.cpp's structured fields, planted in a content part FastAPI echoes as "input".
    {"type": "text", "text": "hi", "n_ctx": 600, "n_prompt_tokens": 9999},
    # Its sentence, and a type naming the context, in the part's text.
    {
        "type": "exceed_context_size_error",
        "text": "request (9999 tokens) exceeds the available context size (600 tokens), "
        "n_ctx: 600, n_prompt_tokens: 9999",
    },
]


@pytest.mark.parametrize("part", PLANTED, ids=["structured", "sentence"])
def test_a_planted_limit_echoed_by_a_fastapi_422_teaches_no_window(
    faulty: FaultyUpstream, start_proxy: Callable[..., str], part: dict[str, Any]
) -> None:
    faulty.chat = fastapi_validation()
    # quorum 1: one report would lower everyone's window, were it believed.
    url = start_proxy(settings(faulty.url, learned_window_quorum=1))
    for key in ("made-up-1", "made-up-2"):
        attack = post(url, key, [{"role": "user", "content": [part]}])
        assert attack.status_code == 422, attack.text  # FastAPI's own answer, unchanged
        assert attack.json()["detail"][0]["loc"] == ["body", "messages", 0, "content"]
    # One upstream request each: a validation answer is no overflow, so no retry.
    assert len(faulty.requests()) == 2
    assert shared_gauges(url) == []
    for key in ("made-up-1", "innocent"):
        r = post(url, key, hello())
        assert r.status_code == 200, r.text
        assert window_of(r) >= CONFIGURED * 0.9, key


def test_a_limit_whose_number_the_request_holds_is_not_shared(
    faulty: FaultyUpstream, start_proxy: Callable[..., str]
) -> None:
    """An upstream that words an overflow with a number quoted from the request: whatever
    the sentence, a number the client sent is not the provider's word about the model."""
    overflow = orjson.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 600 tokens. However, your "
                "messages resulted in 9999 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    )
    url = start_proxy(settings(faulty.url, learned_window_quorum=1))
    for key in ("made-up-1", "made-up-2"):
        faulty.chat = in_turn(answer(400, overflow), answer())
        messages = [
            {"role": "user", "content": "set n_ctx: 600 " + "word " * 300},
            {"role": "assistant", "content": "ok " * 300},
            {"role": "user", "content": "and now?"},
        ]
        assert post(url, key, messages).status_code == 200
    assert shared_gauges(url) == []
    assert window_of(post(url, "innocent", hello())) >= CONFIGURED * 0.9


# --- item 6: one model's window is never another name's ----------------------------------


def test_a_window_learned_for_a_model_named_like_a_key_is_nobody_elses(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """Before: keys were ``upstream|model[|tenant]``, so the shared window of model
    ``vm|anonymous`` was keyless callers' own window of ``vm``."""
    url = start_proxy(settings(sim_reset))  # quorum 2: two made-up keys agree
    learn_for_an_odd_name_and_check_keyless_callers(url)


@pytest.mark.redis
def test_in_redis_too_a_window_learned_for_a_model_named_like_a_key_is_nobody_elses(
    sim_reset: str, start_proxy: Callable[..., str], redis_server: RedisServer
) -> None:
    config = settings(sim_reset).model_dump()
    config["store"] = {"url": redis_server.url}
    url = start_proxy(Settings(**config))
    learn_for_an_odd_name_and_check_keyless_callers(url)
    keys = redis.Redis.from_url(redis_server.url).keys("cp:win:*")
    assert keys
    assert all(key.startswith(b"cp:win:w2|") for key in keys), keys


def learn_for_an_odd_name_and_check_keyless_callers(url: str) -> None:
    real = {"X-Sim-Context-Window": "6144"}
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 400}
        for i in range(20)
    ]
    long = [*turns, {"role": "user", "content": "and now?"}]
    for key in ("sybil-1", "sybil-2"):
        r = post(url, key, long, model=f"{MODEL}|anonymous", headers=real)
        assert r.status_code == 200, r.text
    assert len(shared_gauges(url)) == 1  # the odd name's own shared window was lowered
    keyless = post(url, None, hello())
    assert keyless.status_code == 200
    assert window_of(keyless) >= CONFIGURED * 0.9


# --- item 14: a retry is always smaller --------------------------------------------------

# Alibaba DashScope's OpenAI-compatible answer (fixtures/overflow/cases.json,
# dashscope-compat-input-length): a stated limit far above what the proxy sent.
DASHSCOPE = orjson.dumps(
    {
        "error": {
            "code": "invalid_parameter_error",
            "message": "<400> InternalError.Algo.InvalidParameter: Range of input length "
            "should be [1, 983616]",
            "param": None,
            "type": "invalid_request_error",
        },
        "request_id": "81a373d6-28bd-9968-8335-e22a2127c41b",
    }
)


def test_a_retry_after_a_limit_above_what_was_sent_is_smaller(
    faulty: FaultyUpstream, start_proxy: Callable[..., str]
) -> None:
    faulty.chat = in_turn(answer(400, DASHSCOPE), answer(body=completion("fine")))
    # The summarizer is down, so the recovery falls back to trimming against the window
    # it was given: the stated one, far above the request, trims nothing.
    faulty.summary = answer(503, b'{"error": {"message": "overloaded"}}')
    url = start_proxy(settings(faulty.url))
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 300}
        for i in range(20)
    ]  # ~6k tokens: far below the configured window, so sent as is
    r = post(url, "tenant", [*turns, {"role": "user", "content": "and now?"}])
    assert r.status_code == 200, r.text
    first, second = faulty.requests()
    assert len(second.body) < len(first.body) * 0.8
    assert words(second.messages) < words(first.messages) * 0.8
    assert second.messages[-1] == first.messages[-1]  # the newest message is kept whole
    # Nothing learned from a limit that did not explain the refusal.
    assert shared_gauges(url) == []
    assert window_of(post(url, "tenant", hello())) >= CONFIGURED * 0.9


def test_a_request_that_cannot_shrink_is_not_sent_again(
    faulty: FaultyUpstream, start_proxy: Callable[..., str]
) -> None:
    """One message, which neither a summary nor trimming may cut: the same request again
    could only fail again, so the upstream's answer goes back as it wrote it (not the
    proxy's own error, which would quote a window of the proxy's making)."""
    faulty.chat = in_turn(answer(400, DASHSCOPE), answer(body=completion("fine")))
    url = start_proxy(settings(faulty.url))
    r = post(url, "tenant", [{"role": "user", "content": "word " * 6000}])
    assert r.status_code == 400
    assert r.content == DASHSCOPE
    assert len(faulty.requests()) == 1


def words(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", "")).split()) for m in messages)


# --- item 15: newly recognised wordings, end to end -----------------------------------------

CASES = {
    case["id"]: case
    for case in orjson.loads(
        (Path(__file__).parents[1] / "fixtures" / "overflow" / "cases.json").read_bytes()
    )
}


@pytest.mark.parametrize(
    ("case_id", "learns"),
    [
        ("ollama-native-prompt-longer-than-context", True),  # no limit: what was sent
        ("ollama-openai-prompt-longer-than-context", True),
        ("moonshot-model-max-length-exceeded", False),  # 8192: above what was sent
        ("bedrock-max-length-characters", False),  # characters: never a token window
    ],
)
def test_newly_recognised_overflows_are_retried_smaller(
    faulty: FaultyUpstream, start_proxy: Callable[..., str], case_id: str, learns: bool
) -> None:
    case = CASES[case_id]
    rejected = answer(case["status"], case["body"].encode(), case["headers"])
    faulty.chat = in_turn(rejected, answer(body=completion("fine")))
    url = start_proxy(settings(faulty.url))
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 300}
        for i in range(20)
    ]
    r = post(url, "tenant", [*turns, {"role": "user", "content": "and now?"}])
    assert r.status_code == 200, r.text
    first, second = faulty.requests()
    assert len(second.body) < len(first.body)
    assert shared_gauges(url) == []
    own = window_of(post(url, "tenant", hello()))
    assert (own < CONFIGURED * 0.9) is learns, own
