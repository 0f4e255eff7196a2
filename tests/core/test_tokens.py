"""tokens.py and encodings.py: what the proxy counts, checked against tiktoken itself.

Expected figures come from OpenAI's own documentation (the cookbook's 129-token
example, the 85-token low-detail image) or from encoding the raw text directly
with cl100k_base; the counter's per-message arithmetic is never restated.
Counting in a worker thread beside other threads: tests/e2e/test_tokens_e2e.py.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.digest import digests_and_sizes, message_digests, tenant_seed
from proxy.core.encodings import Encoder, EstimateEncoder, TiktokenEncoder
from proxy.core.tokens import REPLY_PRIMING, TokenCounter, bounded_by, output_reserve, upper_bound
from proxy.types import ChatMessage, ChatRequest
from tests.support.encoders import ENCODER, _tiktoken_encoding
from tests.support.examples import examples

PROPERTY = settings(
    max_examples=examples(150),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def tok(text: str) -> int:
    """The oracle: tokens of raw text under cl100k_base."""
    return ENCODER.count(text)


def count(message: ChatMessage) -> int:
    return TokenCounter(ENCODER).message(message)


def exact_total(request: ChatRequest) -> int:
    counter = TokenCounter(ENCODER)
    messages = request["messages"]
    return sum(counter.messages(messages, message_digests(messages))) + counter.fixed(request)


def test_cl100k_is_available_offline_and_exact() -> None:
    assert ENCODER.exact
    assert tok("tiktoken is great!") == 6  # the cookbook's own cl100k_base example


# OpenAI cookbook, "How to count tokens with tiktoken": these six messages are
# 129 prompt tokens for gpt-3.5-turbo-0613 and gpt-4-0613 (the API's usage.prompt_tokens).
COOKBOOK_MESSAGES: list[ChatMessage] = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate "
        "jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities "
        "for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client "
        "deliverable.",
    },
]


def test_cookbook_example_counts_129_prompt_tokens() -> None:
    counter = TokenCounter(ENCODER)
    counts = counter.messages(COOKBOOK_MESSAGES, message_digests(COOKBOOK_MESSAGES))
    assert sum(counts) + REPLY_PRIMING == 129
    assert counter.fixed({"model": "gpt-4-0613", "messages": COOKBOOK_MESSAGES}) == REPLY_PRIMING


def test_content_parts_count_each_text_part() -> None:
    first, second = "The quick brown fox jumps over the lazy dog.", "Ünïcödé and 日本語 text."
    empty = count({"role": "user", "content": []})
    parts = count(
        {
            "role": "user",
            "content": [{"type": "text", "text": first}, {"type": "text", "text": second}],
        }
    )
    assert parts - empty == tok(first) + tok(second)


def test_images_add_a_per_image_estimate_low_detail_less_than_high() -> None:
    def with_images(*details: str | None) -> ChatMessage:
        parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in these pictures?"}]
        for detail in details:
            image: dict[str, Any] = {"url": "https://example.com/cat.png"}
            if detail is not None:
                image["detail"] = detail
            parts.append({"type": "image_url", "image_url": image})
        return {"role": "user", "content": parts}

    none = count(with_images())
    low = count(with_images("low")) - none
    high = count(with_images("high")) - none
    auto = count(with_images(None)) - none
    assert low == 85  # OpenAI: a low-detail image costs a flat 85 tokens
    assert high > low
    assert auto == high  # unspecified detail may be high: count it as high
    assert count(with_images("high", "low")) - none == high + low
    # The URL itself is not text the model reads as tokens.
    long_url = with_images("low")
    long_url["content"][1]["image_url"]["url"] += "x" * 5000  # type: ignore[index]
    assert count(long_url) - none == low


def assistant_call(name: str, arguments: str) -> ChatMessage:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def test_tool_call_names_and_arguments_count() -> None:
    bare = count({"role": "assistant", "content": None})
    short_args, long_args = '{"city": "Paris"}', '{"city": "Paris", "days": 14, "unit": "celsius"}'
    one = count(assistant_call("get_weather", short_args))
    assert one - bare >= tok("get_weather") + tok(short_args)
    longer = count(assistant_call("get_weather", long_args))
    assert longer - one == tok(long_args) - tok(short_args)
    renamed = count(assistant_call("get_weather_forecast_for_city", short_args))
    assert renamed - one == tok("get_weather_forecast_for_city") - tok("get_weather")

    two = assistant_call("get_weather", short_args)
    two["tool_calls"].append(
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    )
    assert count(two) - one >= tok("get_time") + tok("{}")


def test_tool_results_count_their_content() -> None:
    output = "temperature: 21C, humidity 40%, wind 12 km/h from the north-west"
    empty = count({"role": "tool", "tool_call_id": "call_1", "content": ""})
    full = count({"role": "tool", "tool_call_id": "call_1", "content": output})
    assert full - empty == tok(output)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "weather_report",
        "schema": {
            "type": "object",
            "properties": {"summary": {"type": "string"}, "temperature_c": {"type": "number"}},
        },
    },
}


@pytest.mark.parametrize(
    ("key", "value", "texts"),
    [
        ("tools", [WEATHER_TOOL], ["get_current_weather", "Get the current weather"]),
        ("functions", [WEATHER_TOOL["function"]], ["get_current_weather", "The city and state"]),
        ("response_format", SCHEMA_FORMAT, ["weather_report", "temperature_c"]),
    ],
)
def test_definitions_and_response_format_count_in_fixed(
    key: str, value: Any, texts: list[str]
) -> None:
    counter = TokenCounter(ENCODER)
    plain: ChatRequest = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with_definition: Any = {**plain, key: value}
    extra = counter.fixed(with_definition) - counter.fixed(plain)
    assert extra >= sum(tok(t) for t in texts)
    # Every byte of the definition is in the request, and no token is shorter than a byte.
    assert extra <= len(json.dumps(value).encode())


@dataclass
class CountingEncoder:
    """Wraps the real encoder and records every text it is asked to count."""

    inner: Encoder
    calls: list[str] = field(default_factory=list)
    name: str = "cl100k_base"
    exact: bool = True

    def count(self, text: str) -> int:
        self.calls.append(text)
        return self.inner.count(text)


def test_cache_returns_identical_counts_and_tokenizes_only_new_messages() -> None:
    history: list[ChatMessage] = [
        {"role": "system", "content": "SYSTEM-PROMPT be brief"},
        {"role": "user", "content": "OLD-USER what is a monad?"},
        {"role": "assistant", "content": "OLD-ASSISTANT a monoid in the category of endofunctors"},
    ]
    spy = CountingEncoder(ENCODER)
    counter = TokenCounter(spy)
    first = counter.messages(history, message_digests(history))
    assert first == TokenCounter(ENCODER).messages(history, message_digests(history))
    assert spy.calls, "the first call must tokenize"

    spy.calls.clear()
    assert counter.messages(history, message_digests(history)) == first
    assert spy.calls == [], "an unchanged history must come entirely from the cache"

    grown: list[ChatMessage] = [
        *history,
        {"role": "user", "content": "NEW-USER and a functor?"},
        {"role": "assistant", "content": "NEW-ASSISTANT a structure-preserving map"},
    ]
    counts = counter.messages(grown, message_digests(grown))
    assert counts[:3] == first
    assert counts == TokenCounter(ENCODER).messages(grown, message_digests(grown))
    counted = [text for text in spy.calls if text not in ("user", "assistant", "system")]
    assert sorted(counted) == [
        "NEW-ASSISTANT a structure-preserving map",
        "NEW-USER and a functor?",
    ]


def test_cache_tells_apart_messages_that_differ_only_in_role_or_name() -> None:
    counter = TokenCounter(ENCODER)
    named: ChatMessage = {
        "role": "user",
        "name": "a_long_participant_name",
        "content": "same words",
    }
    messages: list[ChatMessage] = [
        {"role": "user", "content": "same words"},
        named,
        {"role": "assistant", "content": "same words"},
    ]
    counts = counter.messages(messages, message_digests(messages))
    fresh = [TokenCounter(ENCODER).message(m) for m in messages]
    assert counts == fresh
    assert counts[1] > counts[0]


def image_part(detail: str = "high") -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA", "detail": detail},
    }


UPPER_BOUND_BODIES: list[tuple[str, dict[str, Any], bool]] = [
    ("empty conversation", {"model": "m", "messages": []}, False),
    ("one empty message", {"model": "m", "messages": [{"role": "user", "content": ""}]}, False),
    (
        "many tiny messages",
        {"model": "m", "messages": [{"role": "user", "content": "a"}] * 50},
        False,
    ),
    ("plain english", {"model": "m", "messages": COOKBOOK_MESSAGES}, False),
    (
        "cjk and emoji, raw utf-8",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "日本語のテキスト 🎉🚀👩‍👩‍👧 " * 20}],
        },
        False,
    ),
    (
        "cjk and emoji, \\u escaped",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "日本語のテキスト 🎉🚀👩‍👩‍👧 " * 20}],
        },
        True,
    ),
    (
        "quotes, backslashes, control characters",
        {
            "model": "m",
            "messages": [{"role": "user", "content": 'say "hi"\\n\n\t\x00\x1f ' * 30}],
        },
        False,
    ),
    (
        "special-token text",
        {"model": "m", "messages": [{"role": "user", "content": "<|endoftext|><|im_start|>" * 9}]},
        False,
    ),
    (
        "images only",
        {"model": "m", "messages": [{"role": "user", "content": [image_part()] * 4}]},
        False,
    ),
    (
        "low and high images with text",
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "compare"},
                        image_part("low"),
                        image_part(),
                    ],
                }
            ],
        },
        False,
    ),
    (
        "audio input",
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
                    ],
                }
            ],
        },
        False,
    ),
    (
        "many parallel tool calls with short names",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"c{i}",
                            "type": "function",
                            "function": {"name": "f", "arguments": ""},
                        }
                        for i in range(40)
                    ],
                },
                *[{"role": "tool", "tool_call_id": f"c{i}", "content": ""} for i in range(40)],
            ],
        },
        False,
    ),
    (
        "tools, functions and a response schema",
        {
            "model": "m",
            "messages": [{"role": "user", "name": "n", "content": "weather?"}],
            "tools": [WEATHER_TOOL],
            "functions": [WEATHER_TOOL["function"]],
            "response_format": SCHEMA_FORMAT,
        },
        True,
    ),
    (
        "unknown content part kind",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}
            ],
        },
        False,
    ),
]


@pytest.mark.parametrize(
    ("request_body", "ascii_only"),
    [pytest.param(body, ascii_only, id=name) for name, body, ascii_only in UPPER_BOUND_BODIES],
)
def test_upper_bound_is_never_below_the_exact_count(
    request_body: dict[str, Any], ascii_only: bool
) -> None:
    raw = json.dumps(request_body, ensure_ascii=ascii_only).encode()
    compact = orjson.dumps(request_body)
    for body in (raw, compact):
        parsed = orjson.loads(body)
        assert upper_bound(body, parsed["messages"]) >= exact_total(parsed)


_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"]),  # lone surrogates are not JSON
    max_size=80,
)
_part = st.one_of(
    _text.map(lambda t: {"type": "text", "text": t}),
    st.sampled_from(["low", "high", "auto"]).map(image_part),
)
_call = st.builds(
    lambda i, name, args: {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    },
    st.integers(0, 99),
    _text,
    _text,
)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
        "content": st.one_of(st.none(), _text, st.lists(_part, max_size=4)),
    },
    optional={
        "name": _text,
        "tool_calls": st.lists(_call, min_size=1, max_size=5),
        "tool_call_id": _text,
    },
)


@PROPERTY
@given(
    messages=st.lists(_message, max_size=12),
    tools=st.one_of(st.none(), st.just([WEATHER_TOOL])),
    ascii_only=st.booleans(),
)
def test_upper_bound_holds_for_any_request(
    messages: list[dict[str, Any]], tools: list[Any] | None, ascii_only: bool
) -> None:
    request: dict[str, Any] = {"model": "m", "messages": messages}
    if tools:
        request["tools"] = tools
    body = json.dumps(request, ensure_ascii=ascii_only).encode()
    parsed = orjson.loads(body)
    assert upper_bound(body, parsed["messages"]) >= exact_total(parsed)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, 999),
        ({"max_tokens": 100}, 100),
        ({"max_completion_tokens": 50}, 50),
        ({"max_completion_tokens": 50, "max_tokens": 100}, 50),
        ({"max_completion_tokens": 500, "max_tokens": 100}, 500),
        ({"max_completion_tokens": None, "max_tokens": 100}, 100),
        ({"max_completion_tokens": 0, "max_tokens": 100}, 100),
        ({"max_completion_tokens": 0, "max_tokens": 0}, 999),
        ({"max_completion_tokens": None, "max_tokens": None}, 999),
        ({"max_tokens": -5}, 999),
    ],
)
def test_output_reserve_precedence(fields: dict[str, Any], expected: int) -> None:
    request: dict[str, Any] = {"model": "m", "messages": [], **fields}
    assert output_reserve(request, 999) == expected  # type: ignore[arg-type]


# --- counting off the event loop ----------------------------------------------------------


class ListOnlyEncoding:
    """tiktoken's Encoding with only its public ``encode``: the counter's fallback path."""

    def __init__(self, encoding: Any) -> None:
        self.encode = encoding.encode


@PROPERTY
@given(
    text=st.one_of(
        st.text(max_size=200),  # lone surrogates included
        st.lists(st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", " x", "é", "\ud800"])).map(
            "".join
        ),
    )
)
def test_count_equals_tiktokens_own_encode_without_special_tokens(text: str) -> None:
    encoding = _tiktoken_encoding()
    expected = len(encoding.encode(text, disallowed_special=()))
    assert ENCODER.count(text) == expected
    fallback = TiktokenEncoder(name="cl100k_base", exact=True, _encoding=ListOnlyEncoding(encoding))
    assert fallback.count(text) == expected


def test_pending_bytes_is_what_the_cache_lacks() -> None:
    counter = TokenCounter(ENCODER)
    old: list[ChatMessage] = [{"role": "user", "content": f"turn {i}"} for i in range(3)]
    request: ChatRequest = {"model": "m", "messages": old, "tools": [WEATHER_TOOL]}
    digests, sizes = digests_and_sizes(old)
    tools_size = len(orjson.dumps([WEATHER_TOOL]))
    assert sizes == [len(orjson.dumps(m, option=orjson.OPT_SORT_KEYS)) for m in old]
    assert counter.pending_bytes(request, digests, sizes) == sum(sizes) + tools_size
    counter.messages(old, digests)
    counter.fixed(request)
    assert counter.pending_bytes(request, digests, sizes) == 0
    new: ChatMessage = {"role": "user", "content": "a new turn " * 50}
    grown = [*old, new]
    digests, sizes = digests_and_sizes(grown)
    assert counter.pending_bytes({**request, "messages": grown}, digests, sizes) == sizes[-1]


def test_one_tenant_s_cached_counts_are_not_another_s() -> None:
    """Digests are seeded per tenant, so nothing one credential sends can stand for
    another's messages or definitions in the shared caches."""
    counter = TokenCounter(ENCODER)
    messages: list[ChatMessage] = [{"role": "user", "content": f"turn {i}"} for i in range(3)]
    request: ChatRequest = {"model": "m", "messages": messages, "tools": [WEATHER_TOOL]}
    ours, sizes = digests_and_sizes(messages, tenant_seed("a"))
    theirs, _ = digests_and_sizes(messages, tenant_seed("b"))
    assert not set(ours) & set(theirs)
    counter.messages(messages, ours)
    counter.fixed(request, tenant_seed("a"))
    assert counter.pending_bytes(request, ours, sizes, tenant_seed("a")) == 0
    tools_size = len(orjson.dumps([WEATHER_TOOL]))
    pending = counter.pending_bytes(request, theirs, sizes, tenant_seed("b"))
    assert pending == sum(sizes) + tools_size


def test_message_cache_is_bounded_and_forgets_the_oldest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import proxy.core.tokens

    monkeypatch.setattr(proxy.core.tokens, "_CACHE_LIMIT", 3)
    spy = CountingEncoder(ENCODER)
    counter = TokenCounter(spy)
    turns: list[ChatMessage] = [{"role": "user", "content": f"TURN-{i}"} for i in range(5)]
    counter.messages(turns, message_digests(turns))
    spy.calls.clear()
    newest = turns[-3:]
    counter.messages(newest, message_digests(newest))
    assert [c for c in spy.calls if c.startswith("TURN")] == [], "the newest three are kept"
    counter.messages(turns[:1], message_digests(turns[:1]))
    assert "TURN-0" in spy.calls, "the oldest went first"


def test_definitions_cache_keeps_the_recently_used_when_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Agent loops resend the same tools every turn: those must survive one-off definitions."""
    import proxy.core.tokens

    monkeypatch.setattr(proxy.core.tokens, "_FIXED_CACHE_LIMIT", 2)
    spy = CountingEncoder(ENCODER)
    counter = TokenCounter(spy)

    def fixed(tool: str) -> bool:
        """Count a request carrying ``tool``; True if its definitions were tokenized."""
        spy.calls.clear()
        counter.fixed({"model": "m", "messages": [], "tools": [{"name": tool}]})
        return bool(spy.calls)

    assert fixed("agent-tool")
    assert fixed("one-off-1")
    assert not fixed("agent-tool")  # a hit: now the most recently used
    assert fixed("one-off-2")  # full: evicts one-off-1, the least recently used
    assert not fixed("agent-tool")
    assert fixed("one-off-1")


def test_threads_sharing_a_counter_evicting_at_once_get_exact_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests counted in worker threads share one cache; evictions must not collide."""
    import proxy.core.tokens

    monkeypatch.setattr(proxy.core.tokens, "_CACHE_LIMIT", 4)  # every insert evicts
    counter = TokenCounter(EstimateEncoder(name="estimate"))
    batches: list[list[ChatMessage]] = [
        [{"role": "user", "content": f"thread {t} message {i}"} for i in range(3000)]
        for t in range(4)
    ]
    expected = [[TokenCounter(EstimateEncoder(name="e")).message(m) for m in b] for b in batches]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            results[t] = counter.messages(batches[t], message_digests(batches[t]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert [results[t] for t in range(4)] == expected


@PROPERTY
@given(
    body=st.binary(max_size=300),
    messages=st.lists(_message, max_size=12),
    limit=st.integers(-10, 3000),
)
def test_bounded_by_agrees_with_upper_bound(
    body: bytes, messages: list[dict[str, Any]], limit: int
) -> None:
    assert bounded_by(body, messages, limit) == (upper_bound(body, messages) <= limit)


def test_tool_definitions_count_as_a_template_renders_them_when_asked() -> None:
    """Issue 21: an open model's chat template wraps each tool's spaced JSON in fixed
    instructions; counted so when ``templated`` (cached apart from the plain count)."""
    from proxy.core.tokens import TEMPLATE_TOOLS_HEAD, TEMPLATE_TOOLS_TAIL

    counter = TokenCounter(ENCODER)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    request: Any = {"model": "m", "messages": [], "tools": tools}
    rendered = TEMPLATE_TOOLS_HEAD + '\n{"type": "function", "function": {"name": "f", '
    rendered += '"parameters": {"type": "object"}}}' + TEMPLATE_TOOLS_TAIL
    templated = counter.fixed(request, templated=True)
    assert templated == REPLY_PRIMING + ENCODER.count(rendered)
    plain = counter.fixed(request)
    assert plain == REPLY_PRIMING + ENCODER.count(orjson.dumps(tools).decode()) < templated
    assert counter.fixed(request, templated=True) == templated  # from the cache
    plain_chat: Any = {"model": "m", "messages": []}
    assert counter.fixed(plain_chat, templated=True) == counter.fixed(plain_chat) == REPLY_PRIMING
