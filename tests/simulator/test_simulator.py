"""The upstream simulator, served for real by uvicorn and driven by the official SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall

from proxy.core.encodings import load_encoder
from proxy.errors import ConfigError
from proxy.simulator import SimulatorConfig, create_simulator_app, load_simulator_config
from proxy.simulator.config import resolve_model
from proxy.simulator.errors import SimError
from proxy.simulator.replies import Ask, Voice, build_reply
from proxy.simulator.validate import check_tool_pairing
from tests.support.servers import run_server

CONFIG = SimulatorConfig.model_validate(
    {
        "models": [
            {"match": "sim-small", "context_window": 4096, "max_output_tokens": 1024},
            {"match": "strict-*", "strict_alternation": True},
            {"match": "llama-*", "context_window": 64, "error_format": "llamacpp"},
        ],
        "stream": {"chunk_chars": 8},
        "reply_tokens": 24,
    }
)
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "run_step",
            "description": "Run one step.",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    }
]
HELLO: Any = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with run_server(create_simulator_app(CONFIG)) as url:
        yield url


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(base_url: str) -> Iterator[openai.OpenAI]:
    # No retries: a simulated 429/5xx must surface, not be retried away.
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)
    yield client
    client.close()


def function_calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    calls = message.tool_calls or []
    assert all(isinstance(c, ChatCompletionMessageFunctionToolCall) for c in calls)
    return [c for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]


def chat(http: httpx.Client, body: dict[str, Any], **headers: str) -> httpx.Response:
    return http.post("/v1/chat/completions", json=body, headers=headers)


def stats(http: httpx.Client) -> dict[str, int]:
    result: dict[str, int] = http.get("/_sim/stats").json()
    return result


def error_message(response: httpx.Response) -> str:
    message: str = response.json()["error"]["message"]
    return message


# --- replies ---------------------------------------------------------------


def test_plain_reply_has_openai_shape_and_counted_usage(sdk: openai.OpenAI) -> None:
    result = sdk.chat.completions.create(model="sim-small", messages=HELLO)
    choice = result.choices[0]
    assert result.id.startswith("chatcmpl-")
    assert result.object == "chat.completion"
    assert result.model == "sim-small"
    assert choice.message.role == "assistant"
    assert choice.message.content is not None
    assert choice.message.content.startswith("ok: ")
    assert choice.finish_reason == "stop"
    assert result.usage is not None
    # 3 per message + "user" + "hello" + 3 to prime the reply.
    assert result.usage.prompt_tokens == 3 + 1 + 1 + 3
    assert 20 <= result.usage.completion_tokens <= 28  # about reply_tokens (24)
    assert result.usage.total_tokens == result.usage.prompt_tokens + 24


def test_prompt_count_covers_names_tool_calls_images_and_tools(http: httpx.Client) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    base = {"model": "sim-small", "messages": [{"role": "user", "content": "hi"}]}
    richer = {
        "model": "sim-small",
        "messages": [
            {"role": "user", "name": "bob", "content": [{"type": "text", "text": "hi"}, image]},
        ],
    }
    plain = chat(http, base).json()["usage"]["prompt_tokens"]
    with_extras = chat(http, richer).json()["usage"]["prompt_tokens"]
    assert with_extras == plain + 85 + 2  # image flat 85; "bob" 1 token + 1 for a name
    with_tools = chat(http, {**base, "tools": TOOLS}).json()["usage"]["prompt_tokens"]
    assert with_tools > plain + 20


def test_same_request_gets_byte_identical_answer(http: httpx.Client) -> None:
    body = {"model": "sim-small", "messages": [{"role": "user", "content": "determinism"}]}
    first, second = chat(http, body), chat(http, body)
    assert first.status_code == 200
    assert first.content == second.content
    other = chat(http, {**body, "messages": [{"role": "user", "content": "something else"}]})
    assert other.json()["id"] != first.json()["id"]
    assert (
        other.json()["choices"][0]["message"]["content"]
        != first.json()["choices"][0]["message"]["content"]
    )


def test_filler_is_cut_to_max_tokens_with_finish_length(sdk: openai.OpenAI) -> None:
    result = sdk.chat.completions.create(model="sim-small", messages=HELLO, max_tokens=5)
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None
    assert 1 <= result.usage.completion_tokens <= 5


def test_recall_answers_the_last_fact_from_any_message(sdk: openai.OpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": "FACT colour=red FACT size=3"},
        {"role": "user", "content": "FACT colour=blue"},
        {"role": "assistant", "content": "noted, FACT city=Paris"},
        {"role": "user", "content": "RECALL colour RECALL city RECALL size RECALL missing"},
    ]
    result = sdk.chat.completions.create(model="sim-small", messages=messages)
    assert result.choices[0].message.content == "colour=blue city=Paris size=3 missing=UNKNOWN"


def test_recall_reads_a_value_stated_in_plain_words_anywhere_as_a_reader_would(
    sdk: openai.OpenAI,
) -> None:
    """Not only ``FACT k=v`` or the proxy's ``- role: `k=v``` quoting: a value is found
    wherever the prompt states it in plain words, the last statement winning, and an
    earlier ``k=UNKNOWN`` answer is no value."""
    messages: Any = [
        {"role": "system", "content": "Summary: region is eu-west-3; the owner: Dana."},
        {"role": "user", "content": "Please note: k3 is v21x. Also k6: v42x, k9 = v63x."},
        {"role": "assistant", "content": "k12=UNKNOWN"},
        {"role": "user", "content": "k12 was set to v84x this morning; k15 is now v105x."},
        {"role": "assistant", "content": "- user: `port: 8443` (quoted)"},
        {"role": "user", "content": "Correction: k3 = v22x."},
        {"role": "user", "content": "RECALL k3 RECALL k6 RECALL k9 RECALL k12 RECALL k15"},
    ]
    result = sdk.chat.completions.create(model="sim-small", messages=messages)
    answer = result.choices[0].message.content
    assert answer == "k3=v22x k6=v42x k9=v63x k12=v84x k15=v105x"
    messages[-1] = {"role": "user", "content": "RECALL region RECALL port RECALL k1 RECALL k"}
    result = sdk.chat.completions.create(model="sim-small", messages=messages)
    assert result.choices[0].message.content == "region=eu-west-3 port=8443 k1=UNKNOWN k=UNKNOWN"


def test_a_plain_summarizer_keeps_every_stated_fact_and_writes_no_heading() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Write the sections.\n## Active task\n## Critical values"},
        {"role": "user", "content": "FACT k0=v0x. Please note: k3 is v21x; k6: v42x."},
        {"role": "assistant", "content": "ok: noted"},
        {"role": "user", "content": "k9 was set to v63x, and the port is 8443."},
    ]
    voice = Voice(load_encoder("cl100k_base"), 24, "plain")
    reply = build_reply({}, messages, Ask(b"seed" * 4, 120, summarize=True), voice)
    content = str(reply.content)
    assert reply.finish_reason == "stop"
    assert "#" not in content
    assert "Active task" not in content
    for fact in ("k0 is v0x", "k3 is v21x", "k6 is v42x", "k9 is v63x", "port is 8443"):
        assert fact in content


def test_summarize_carries_every_fact_forward_and_is_counted(http: httpx.Client) -> None:
    before = stats(http)["summaries"]
    messages = [
        {"role": "user", "content": "FACT zeta=1 and FACT alpha=old"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "FACT alpha=new FACT mid=x.y"}]},
    ]
    body = {"model": "sim-small", "messages": messages, "max_tokens": 40}
    answer = chat(http, body, **{"X-Compaction-Purpose": "summarize"}).json()
    content = answer["choices"][0]["message"]["content"]
    fact_lines = [line for line in content.splitlines() if line.startswith("FACT ")]
    assert fact_lines == ["FACT alpha=new", "FACT mid=x.y", "FACT zeta=1"]
    assert answer["usage"]["completion_tokens"] <= 40
    assert stats(http)["summaries"] == before + 1
    # Facts survive a budget too small for them; only the filler goes.
    tiny = chat(http, {**body, "max_tokens": 2}, **{"X-Compaction-Purpose": "summarize"}).json()
    assert "FACT zeta=1" in tiny["choices"][0]["message"]["content"]


def test_call_n_makes_parallel_tool_calls_and_results_round_trip(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "please CALL 3"}]
    first = sdk.chat.completions.create(model="sim-small", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    calls = function_calls(choice.message)
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert [c.function.name for c in calls] == ["run_step"] * 3
    assert [orjson.loads(c.function.arguments) for c in calls] == [
        {"step": 1},
        {"step": 2},
        {"step": 3},
    ]
    assert len({c.id for c in calls}) == 3
    messages.append(choice.message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "done"} for c in calls]
    second = sdk.chat.completions.create(model="sim-small", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "observed 3 tool results"
    assert second.choices[0].finish_reason == "stop"


def test_call_without_tools_is_plain_text(http: httpx.Client) -> None:
    answer = chat(http, {"model": "sim-small", "messages": [{"role": "user", "content": "CALL 2"}]})
    message = answer.json()["choices"][0]["message"]
    assert "tool_calls" not in message
    assert message["content"].startswith("ok:")


# --- streaming -------------------------------------------------------------


def test_stream_reassembles_to_the_non_streamed_reply(sdk: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "stream me"}]
    whole = sdk.chat.completions.create(model="sim-small", messages=messages)
    stream = sdk.chat.completions.create(
        model="sim-small", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage
    assert all(c.id == whole.id for c in chunks)


def test_stream_without_include_usage_sends_no_usage_chunk(sdk: openai.OpenAI) -> None:
    chunks = list(sdk.chat.completions.create(model="sim-small", messages=HELLO, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_stream_tool_calls_reassemble(sdk: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "CALL 2"}]
    whole = sdk.chat.completions.create(model="sim-small", messages=messages, tools=TOOLS)
    chunks = list(
        sdk.chat.completions.create(model="sim-small", messages=messages, tools=TOOLS, stream=True)
    )
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            assert delta.function is not None
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
    expected = {
        i: {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for i, c in enumerate(function_calls(whole.choices[0].message))
    }
    assert calls == expected
    assert len(calls) == 2
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_stream_wire_format_and_delays(http: httpx.Client) -> None:
    body = {"model": "sim-small", "messages": HELLO, "stream": True, "max_tokens": 6}
    headers = {"X-Sim-First-Byte-Delay-Ms": "150", "X-Sim-Chunk-Delay-Ms": "40"}
    start = time.monotonic()
    arrivals: list[float] = []
    raw = b""
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for piece in response.iter_raw():
            arrivals.append(time.monotonic() - start)
            raw += piece
    events = raw.split(b"\n\n")
    assert events[-1] == b""
    assert events[-2] == b"data: [DONE]"
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert arrivals[0] >= 0.14  # the first byte waited
    # Chunks arrive one by one, spread over the chunk delays, not in one burst.
    assert len(arrivals) >= 4
    assert arrivals[-1] - arrivals[0] >= 0.04 * (len(events) - 3)


def test_errors_come_before_the_stream_starts(http: httpx.Client) -> None:
    body = {"model": "sim-small", "messages": [{"role": "tool", "content": "x"}], "stream": True}
    response = chat(http, body)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"


# --- structure validation --------------------------------------------------

_CALL = {"id": "call_a", "type": "function", "function": {"name": "run_step", "arguments": "{}"}}
_CALL_B = {**_CALL, "id": "call_b"}


@pytest.mark.parametrize(
    ("messages", "message", "param"),
    [
        pytest.param(
            [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "x", "content": ""},
            ],
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'.",
            "messages.[1].role",
            id="orphan-tool",
        ),
        pytest.param(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [_CALL, _CALL_B]},
                {"role": "tool", "tool_call_id": "call_a", "content": "a"},
                {"role": "user", "content": "next"},
            ],
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            "response messages: call_b",
            "messages.[1].role",
            id="unanswered-call",
        ),
        pytest.param(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [_CALL]}],
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            "response messages: call_a",
            "messages.[1].role",
            id="unanswered-at-end",
        ),
        pytest.param(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [_CALL]},
                {"role": "tool", "tool_call_id": "call_zzz", "content": "a"},
            ],
            "Invalid parameter: 'tool_call_id' of 'call_zzz' not found in 'tool_calls' of "
            "previous message.",
            "messages.[2].tool_call_id",
            id="unknown-tool-call-id",
        ),
        pytest.param(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [_CALL]},
                {"role": "tool", "tool_call_id": "call_a", "content": "a"},
                {"role": "assistant", "content": "done"},
                {"role": "tool", "tool_call_id": "call_a", "content": "again"},
            ],
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'.",
            "messages.[4].role",
            id="tool-after-plain-assistant",
        ),
        pytest.param(
            [{"role": "robot", "content": "hi"}],
            "Invalid value: 'robot'. Supported values are: 'system', 'assistant', 'user', "
            "'function', 'tool', and 'developer'.",
            "messages[0].role",
            id="bad-role",
        ),
    ],
)
def test_broken_message_structure_is_rejected_like_openai(
    sdk: openai.OpenAI, http: httpx.Client, messages: Any, message: str, param: str
) -> None:
    before = stats(http)["rejected_structure"]
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="sim-small", messages=messages)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["message"] == message
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert stats(http)["rejected_structure"] == before + 1


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        pytest.param(b"{not json", 400, "could not parse the JSON body", id="not-json"),
        pytest.param(b"[1, 2]", 400, "expected an object", id="not-object"),
        pytest.param(b'{"messages": []}', 400, "you must provide a model parameter", id="no-model"),
        pytest.param(
            b'{"model": "m"}', 400, "Missing required parameter: 'messages'", id="no-msgs"
        ),
        pytest.param(b'{"model": "m", "messages": []}', 400, "empty array", id="empty-msgs"),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            400,
            "integer below minimum value",
            id="zero-max-tokens",
        ),
    ],
)
def test_malformed_requests_get_openai_errors(
    http: httpx.Client, body: bytes, status: int, fragment: str
) -> None:
    response = http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    assert fragment in error_message(response)
    assert response.json()["error"]["type"] == "invalid_request_error"


_TOOL_TURN = [
    {"role": "assistant", "tool_calls": [_CALL]},
    {"role": "tool", "tool_call_id": "call_a", "content": "a"},
]


@pytest.mark.parametrize(
    ("roles_and_turns", "ok"),
    [
        pytest.param([{"role": "user", "content": "q"}], True, id="user"),
        pytest.param(
            [
                {"role": "system", "content": "s"},
                {"role": "developer", "content": "d"},
                {"role": "user", "content": "q"},
                *_TOOL_TURN,
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q2"},
                *_TOOL_TURN,
            ],
            True,
            id="tool-turns-count-as-assistant",
        ),
        pytest.param(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            False,
            id="user-user",
        ),
        pytest.param(
            [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
            False,
            id="assistant-first",
        ),
        pytest.param(
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"},
                {"role": "user", "content": "d"},
            ],
            False,
            id="assistant-assistant",
        ),
        pytest.param(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            False,
            id="ends-on-assistant",
        ),
        pytest.param(
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "system", "content": "late"},
                {"role": "user", "content": "c"},
            ],
            False,
            id="system-mid-conversation",
        ),
    ],
)
def test_strict_alternation(http: httpx.Client, roles_and_turns: Any, ok: bool) -> None:
    by_model = chat(http, {"model": "strict-7b", "messages": roles_and_turns})
    by_header = chat(
        http,
        {"model": "sim-small", "messages": roles_and_turns},
        **{"X-Sim-Strict-Alternation": "1"},
    )
    lenient = chat(http, {"model": "sim-small", "messages": roles_and_turns})
    assert lenient.status_code == 200
    for response in (by_model, by_header):
        if ok:
            assert response.status_code == 200
        else:
            assert response.status_code == 400
            assert response.json() == {
                "error": {
                    "message": "Conversation roles must alternate "
                    "user/assistant/user/assistant/...",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }


# --- context window --------------------------------------------------------


def _long_messages(words: int) -> Any:
    return [{"role": "user", "content": " the" * words}]


def test_openai_overflow_texts(http: httpx.Client) -> None:
    # " the" is one token: 3 + 1 ("user") + 200 + 3.
    window = {"X-Sim-Context-Window": "150"}
    alone = chat(http, {"model": "sim-small", "messages": _long_messages(200)}, **window)
    assert alone.status_code == 400
    assert alone.json() == {
        "error": {
            "message": "This model's maximum context length is 150 tokens. However, your "
            "messages resulted in 207 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    fits = {"model": "sim-small", "messages": _long_messages(100), "max_tokens": 60}
    with_completion = chat(http, fits, **window)
    assert error_message(with_completion) == (
        "This model's maximum context length is 150 tokens. However, you requested 167 tokens "
        "(107 in the messages, 60 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    tools = {"model": "sim-small", "messages": _long_messages(140), "tools": TOOLS}
    with_tools = chat(http, tools, **window)
    assert "in the functions). Please reduce the length of the messages or functions." in (
        error_message(with_tools)
    )
    # max_completion_tokens counts like max_tokens; without it the same prompt fits.
    assert chat(http, {**fits, "max_tokens": None}, **window).status_code == 200
    newer = {**fits, "max_tokens": None, "max_completion_tokens": 60}
    assert chat(http, newer, **window).status_code == 400


def test_sdk_raises_bad_request_for_overflow(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model="sim-small",
            messages=_long_messages(5000),
        )
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in caught.value.message


@pytest.mark.parametrize(
    ("fmt", "status", "check"),
    [
        pytest.param(
            "vllm",
            400,
            lambda b: (
                b["error"]["type"] == "BadRequestError"
                and b["error"]["code"] == 400
                and b["error"]["message"]
                == "This model's maximum context length is 100 tokens. However, your request has "
                "207 input tokens. Please reduce the length of the input messages."
            ),
            id="vllm",
        ),
        pytest.param(
            "vllm_legacy",
            400,
            lambda b: (
                b["object"] == "error"
                and b["code"] == 400
                and b["message"]
                == "This model's maximum context length is 100 tokens. However, you requested "
                "207 tokens (207 in the messages, 0 in the completion). Please reduce the length "
                "of the messages or completion."
            ),
            id="vllm_legacy",
        ),
        pytest.param(
            "anthropic",
            400,
            lambda b: (
                b
                == {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": "prompt is too long: 207 tokens > 100 maximum",
                    },
                }
            ),
            id="anthropic",
        ),
        pytest.param(
            "llamacpp",
            400,
            lambda b: (
                b
                == {
                    "error": {
                        "code": 400,
                        "message": "the request exceeds the available context size, try "
                        "increasing it",
                        "type": "exceed_context_size_error",
                        "n_prompt_tokens": 207,
                        "n_ctx": 100,
                    }
                }
            ),
            id="llamacpp",
        ),
    ],
)
def test_overflow_error_formats(http: httpx.Client, fmt: str, status: int, check: Any) -> None:
    before = stats(http)["overflows"]
    headers = {"X-Sim-Error-Format": fmt, "X-Sim-Context-Window": "100"}
    response = chat(http, {"model": "sim-small", "messages": _long_messages(200)}, **headers)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert check(response.json())
    assert stats(http)["overflows"] == before + 1


def test_overflow_with_max_tokens_in_vllm_and_anthropic_wording(http: httpx.Client) -> None:
    body = {"model": "sim-small", "messages": _long_messages(50), "max_tokens": 60}
    window = {"X-Sim-Context-Window": "100"}
    vllm = chat(http, body, **window, **{"X-Sim-Error-Format": "vllm"})
    assert error_message(vllm) == (
        "'max_tokens' or 'max_completion_tokens' is too large: 60. This model's maximum "
        "context length is 100 tokens and your request has 57 input tokens (60 > 100 - 57)."
    )
    anthropic = chat(http, body, **window, **{"X-Sim-Error-Format": "anthropic"})
    assert anthropic.json()["error"]["message"] == (
        "input length and `max_tokens` exceed context limit: 57 + 60 > 100, decrease input "
        "length or `max_tokens` and try again"
    )


def test_gateway413_is_an_nginx_html_page(http: httpx.Client) -> None:
    headers = {"X-Sim-Error-Format": "gateway413", "X-Sim-Context-Window": "100"}
    response = chat(http, {"model": "sim-small", "messages": _long_messages(200)}, **headers)
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("text/html")
    assert "<title>413 Request Entity Too Large</title>" in response.text
    assert "<center>nginx</center>" in response.text


def test_llamacpp_model_rejects_only_the_prompt_and_stops_at_the_window(
    http: httpx.Client,
) -> None:
    # llama-* has a 64-token window and the llamacpp format (per-model override).
    fits = chat(http, {"model": "llama-3", "messages": _long_messages(50), "max_tokens": 100})
    answer = fits.json()
    assert fits.status_code == 200
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["total_tokens"] <= 64
    too_long = chat(http, {"model": "llama-3", "messages": _long_messages(80)})
    assert too_long.json()["error"]["type"] == "exceed_context_size_error"


def test_max_tokens_above_model_limit(sdk: openai.OpenAI, http: httpx.Client) -> None:
    before = stats(http)["rejected_output"]
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="sim-small", messages=HELLO, max_tokens=99999)
    assert caught.value.body == {
        "message": "max_tokens is too large: 99999. This model supports at most 1024 "
        "completion tokens, whereas you provided 99999.",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": None,
    }
    assert stats(http)["rejected_output"] == before + 1


# --- simulated failures and overrides --------------------------------------


@pytest.mark.parametrize(
    ("status", "exc", "code"),
    [
        (401, openai.AuthenticationError, "invalid_api_key"),
        (404, openai.NotFoundError, "model_not_found"),
        (429, openai.RateLimitError, "rate_limit_exceeded"),
        (500, openai.InternalServerError, None),
        (502, openai.InternalServerError, "502"),  # Cloudflare's body: "code": 502
        (503, openai.InternalServerError, None),
    ],
)
def test_x_sim_fail_answers_realistic_errors(
    sdk: openai.OpenAI, status: int, exc: type[openai.APIStatusError], code: str | None
) -> None:
    with pytest.raises(exc) as caught:
        sdk.chat.completions.create(
            model="sim-small",
            messages=HELLO,
            extra_headers={"X-Sim-Fail": str(status)},
        )
    assert caught.value.status_code == status
    assert caught.value.code == code
    assert caught.value.message


def test_rate_limit_carries_retry_after(http: httpx.Client) -> None:
    before = stats(http)
    response = chat(http, {"model": "sim-small", "messages": HELLO}, **{"X-Sim-Fail": "429"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "tokens"
    after = stats(http)
    assert after["failures"] == before["failures"] + 1
    assert after["requests"] == before["requests"] + 1


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Sim-Context-Window", "lots"),
        ("X-Sim-Error-Format", "cohere"),
        ("X-Sim-Fail", "200"),
        ("X-Sim-Strict-Alternation", "maybe"),
        ("X-Sim-Latency-Ms", "-5"),
    ],
)
def test_bad_override_headers_are_client_errors(
    http: httpx.Client, header: str, value: str
) -> None:
    response = chat(http, {"model": "sim-small", "messages": HELLO}, **{header: value})
    assert response.status_code == 400
    assert header in error_message(response)


def test_latency_header_delays_the_answer(http: httpx.Client) -> None:
    start = time.monotonic()
    response = chat(http, {"model": "sim-small", "messages": HELLO}, **{"X-Sim-Latency-Ms": "120"})
    assert response.status_code == 200
    assert time.monotonic() - start >= 0.11


# --- observability ---------------------------------------------------------


def test_requests_are_recorded_with_relevant_headers_and_cleared(http: httpx.Client) -> None:
    assert http.delete("/_sim/requests").status_code == 204
    body = {"model": "sim-small", "messages": [{"role": "user", "content": "record me"}]}
    chat(
        http,
        body,
        authorization="Bearer sk-rec",
        **{"X-Session-Id": "s-1", "X-Compaction-Purpose": "chat", "User-Agent": "pytest"},
    )
    chat(http, {"model": "sim-small", "messages": [{"role": "tool", "content": "x"}]})
    recorded = http.get("/_sim/requests").json()
    assert [r["body"] for r in recorded] == [
        body,
        {"model": "sim-small", "messages": [{"role": "tool", "content": "x"}]},
    ]
    assert recorded[0]["headers"] == {
        "authorization": "Bearer sk-rec",
        "x-session-id": "s-1",
        "x-compaction-purpose": "chat",
    }
    assert stats(http) == {
        "requests": 2,
        "overflows": 0,
        "summaries": 0,
        "rejected_structure": 1,
        "rejected_output": 0,
        "failures": 0,
        "streams_abandoned": 0,
        "calls_abandoned": 0,
        "slot_waits": 0,
        "prompt_tokens_read": 0,
        "compactions": 0,
    }
    http.delete("/_sim/requests")
    assert http.get("/_sim/requests").json() == []
    assert stats(http)["requests"] == 0


def test_recording_is_bounded_by_count_and_size() -> None:
    from proxy.simulator.recorder import Recorder

    recorder = Recorder(max_requests=3, max_bytes=10_000)
    for i in range(5):
        recorder.record({}, orjson.dumps({"i": i}))
    assert [r["body"]["i"] for r in orjson.loads(recorder.requests_json())] == [2, 3, 4]
    small = Recorder(max_requests=100, max_bytes=200)
    for i in range(5):
        small.record({}, orjson.dumps({"i": i, "pad": "x" * 60}))
    kept = orjson.loads(small.requests_json())
    assert len(kept) == 2
    assert kept[-1]["body"]["i"] == 4


# --- non-chat endpoints ----------------------------------------------------


def test_models_lists_the_exact_model_names(sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == ["sim-small"]


def test_embeddings_are_deterministic_unit_vectors(sdk: openai.OpenAI) -> None:
    first = sdk.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"])
    again = sdk.embeddings.create(model="text-embedding-3-small", input="alpha")
    floats = sdk.embeddings.create(
        model="text-embedding-3-small", input="alpha", encoding_format="float"
    )
    alpha, beta = (d.embedding for d in first.data)
    assert len(alpha) == 16
    assert alpha != beta
    assert again.data[0].embedding == alpha == floats.data[0].embedding
    assert abs(sum(v * v for v in alpha) - 1.0) < 1e-5
    assert first.usage.prompt_tokens == 2
    sized = sdk.embeddings.create(model="e", input="alpha", dimensions=64)
    assert len(sized.data[0].embedding) == 64


def test_legacy_completions(sdk: openai.OpenAI) -> None:
    result = sdk.completions.create(model="sim-small", prompt="Say something", max_tokens=5)
    assert result.object == "text_completion"
    assert result.choices[0].finish_reason == "length"
    assert result.usage is not None
    assert result.usage.completion_tokens <= 5
    again = sdk.completions.create(model="sim-small", prompt="Say something", max_tokens=5)
    assert again.choices[0].text == result.choices[0].text != ""


def test_unknown_paths_answer_like_openai(http: httpx.Client) -> None:
    response = http.post("/chat/completions", json={})
    assert response.status_code == 404
    assert error_message(response) == "Invalid URL (POST /chat/completions)"
    assert http.get("/v1/chat/completions").status_code == 405


# --- configuration and pure parts ------------------------------------------


def test_config_file_resolves_exact_names_before_globs(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    path.write_text(
        "models:\n"
        "  - {match: 'gpt-*', context_window: 1000, error_format: vllm}\n"
        "  - {match: 'gpt-4o', context_window: 2000}\n"
        "default: {context_window: 3000, max_output_tokens: 100}\n"
        "strict_alternation: true\n",
        encoding="utf-8",
    )
    cfg = load_simulator_config(path)
    exact, glob, other = (resolve_model(cfg, n) for n in ("gpt-4o", "gpt-5", "claude"))
    assert (exact.context_window, exact.error_format) == (2000, "openai")
    assert (glob.context_window, glob.error_format, glob.max_output_tokens) == (1000, "vllm", 100)
    assert (other.context_window, other.strict_alternation) == (3000, True)
    assert load_simulator_config(None) == SimulatorConfig()


@pytest.mark.parametrize(
    "text",
    ["models: [{match: x, context_window: -1}]", "error_format: cohere", "- a list", "a: [b"],
)
def test_bad_config_raises_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "sim.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError):
        load_simulator_config(path)


_ids = st.lists(st.integers(1, 4), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(turns=_ids, drop=st.integers(0, 1000))
def test_tool_pairing_accepts_complete_turns_and_rejects_any_dropped_result(
    turns: list[int], drop: int
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    results: list[int] = []
    for t, calls in enumerate(turns):
        ids = [f"call_{t}_{k}" for k in range(calls)]
        messages.append({"role": "assistant", "tool_calls": [{**_CALL, "id": i} for i in ids]})
        for i in reversed(ids):  # answers may come in any order
            results.append(len(messages))
            messages.append({"role": "tool", "tool_call_id": i, "content": "r"})
        messages.append({"role": "user", "content": "more"})
    check_tool_pairing(messages)
    broken = messages[: results[drop % len(results)]] + messages[results[drop % len(results)] + 1 :]
    with pytest.raises(SimError):
        check_tool_pairing(broken)
