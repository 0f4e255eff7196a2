"""transcript.py and summarize.py: the transcript the summarizer reads, and chunked summarization.

The end-to-end test runs the real proxy against a simulator whose summarizer
model has a 1500-token window it enforces with real overflow errors, so a
chunk that does not fit fails loudly instead of passing unnoticed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from proxy.compaction.summarize import SummaryRequest, summarize
from proxy.config import Settings
from proxy.core.prompts import CORE, FULL, SIMPLE, TERSER
from proxy.core.transcript import frame_prompt, render_transcript
from proxy.simulator import create_simulator_app
from proxy.simulator.config import ModelRule, SimulatorConfig
from proxy.simulator.replies import collect_facts
from proxy.types import ChatMessage
from proxy.upstream.client import UpstreamClient
from tests.support.chat import FILLER, WINDOW, Chat, small_window_settings, stats
from tests.support.servers import run_server

SUMMARIZER_WINDOW = 1500


def transcript(messages: list[ChatMessage]) -> str:
    return frame_prompt("", render_transcript(messages))


def tool_exchange(output: str, arguments: str = '{"path": "src/app.py"}') -> list[ChatMessage]:
    return [
        {"role": "user", "content": "Open the app module."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": output},
        {"role": "assistant", "content": "The module defines create_app."},
    ]


def test_transcript_has_one_entry_per_message_with_roles() -> None:
    messages: list[ChatMessage] = [
        {"role": "user", "content": "Where is the config loaded?"},
        {"role": "assistant", "content": "In proxy/config.py."},
    ]
    entries = render_transcript(messages)
    assert [(e.role, e.text) for e in entries] == [
        ("user", "Where is the config loaded?"),
        ("assistant", "In proxy/config.py."),
    ]


def test_tool_calls_appear_as_name_with_arguments() -> None:
    text = transcript(tool_exchange("def create_app(): ..."))
    assert 'read_file({"path": "src/app.py"})' in text
    assert "def create_app(): ..." in text  # a short output is kept whole


def test_tool_results_are_labelled_with_the_tool_that_produced_them() -> None:
    entries = render_transcript(tool_exchange("def create_app(): ..."))
    result = next(e for e in entries if "def create_app()" in e.text)
    assert (result.role, result.tool) == ("tool", "read_file")


def test_long_tool_output_is_shortened_and_never_copied_whole() -> None:
    output = "".join(f"row {i:05d}: payload-{i * 37 % 1000:03d}\n" for i in range(2000))
    text = transcript(tool_exchange(output))
    assert output not in text
    assert "row 00000" in text  # the start of the output is still there
    assert "row 01999" not in text  # the tail is not
    assert len(text) < len(output) // 10


def test_long_tool_arguments_are_shortened() -> None:
    arguments = orjson.dumps({"content": "x" * 20_000, "path": "big.txt"}).decode()
    text = transcript(tool_exchange("written", arguments))
    assert arguments not in text
    assert "read_file(" in text
    assert len(text) < 5_000


def test_images_are_marked_not_inlined() -> None:
    data_url = "data:image/png;base64," + "iVBORw0KGgo" * 500
    messages: list[ChatMessage] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What does this chart show?"},
                {"type": "image_url", "image_url": {"url": data_url}},
            ],
        }
    ]
    text = transcript(messages)
    assert "What does this chart show?" in text
    assert "iVBORw0KGgo" not in text
    assert "image" in text


def summarizer_calls(sim: str) -> list[dict[str, Any]]:
    recorded = httpx.get(f"{sim}/_sim/requests").json()
    return [r for r in recorded if r["headers"].get("x-compaction-purpose") == "summarize"]


def new_turns(call: dict[str, Any]) -> str:
    prompt = call["body"]["messages"][-1]["content"]
    match = re.search(r"<new_turns_(\w+)>\n(.*)\n</new_turns_\1>", prompt, re.S)
    assert match, "the summarizer prompt carries the turns to summarize"
    return match.group(2)


async def test_a_span_larger_than_a_chunk_is_folded_call_by_call(sim_reset: str) -> None:
    span: list[ChatMessage] = []
    for i in range(24):
        fact = f" FACT key{i}=value{i}" if i % 4 == 0 else ""
        span.append({"role": "user", "content": f"MSG{i:02d} {FILLER}{fact}"})
    client = UpstreamClient(Settings())
    try:
        request = SummaryRequest(
            client=client,
            api="chat",
            url=f"{sim_reset}/v1/chat/completions",
            headers=[(b"authorization", b"Bearer sk-test")],
            model="sim-summarizer",
            max_tokens=300,
            timeout_s=10,
            max_chunk_chars=1200,
        )
        summary = (await summarize(request, "FACT earlier=kept", span)).text
    finally:
        await client.aclose()

    calls = summarizer_calls(sim_reset)
    assert len(calls) > 1
    seen = [re.findall(r"MSG(\d\d)", new_turns(call)) for call in calls]
    # Every message is summarized exactly once, in order, and never split across calls.
    assert [int(n) for chunk in seen for n in chunk] == list(range(24))
    for call in calls:
        assert len(new_turns(call)) <= 1200
    # Each call updates the previous call's summary, so facts survive every fold.
    for i in range(0, 24, 4):
        assert f"FACT key{i}=value{i}" in summary
    assert "FACT earlier=kept" in summary
    assert "FACT earlier=kept" in calls[-1]["body"]["messages"][-1]["content"]


@pytest.fixture
def small_summarizer_sim() -> Iterator[str]:
    """A simulator whose summarizer model enforces a window of SUMMARIZER_WINDOW tokens."""
    config = SimulatorConfig(
        models=(
            ModelRule(match="sim-4k", context_window=WINDOW, max_output_tokens=256),
            ModelRule(match="sim-summarizer", context_window=SUMMARIZER_WINDOW),
        )
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def test_a_small_summarizer_window_chunks_one_compaction_into_several_calls(
    small_summarizer_sim: str, start_proxy: Callable[..., str]
) -> None:
    url = start_proxy(
        small_window_settings(
            small_summarizer_sim,
            summarizer_model="sim-summarizer",
            summarizer_context_window=SUMMARIZER_WINDOW,
        )
    )
    chat = Chat(url, session="chunked")
    calls_per_compaction: list[int] = []
    for turn in range(60):
        fact = f" FACT k{turn}=v{turn * 3}" if turn % 6 == 0 else ""
        before = stats(small_summarizer_sim)["summaries"]
        chat.say(f"Turn {turn}: {FILLER}{fact}")
        assert chat.last is not None
        if chat.last["x-compaction-status"] == "compacted":
            calls_per_compaction.append(stats(small_summarizer_sim)["summaries"] - before)

    sim = stats(small_summarizer_sim)
    assert sim["overflows"] == 0, "every chunk must fit the summarizer's window"
    assert chat.statuses["trimmed"] == 0
    assert chat.statuses["compacted"] >= 1
    assert len(calls_per_compaction) == chat.statuses["compacted"]
    assert sim["summaries"] > chat.statuses["compacted"]
    assert calls_per_compaction[0] >= 2, "the first compaction spans more than one chunk"
    for turn in range(0, 60, 6):
        assert chat.say(f"RECALL k{turn}") == f"k{turn}=v{turn * 3}"


@pytest.fixture
def short_output_sim() -> Iterator[str]:
    """A simulator whose chat model, like many real ones, caps replies at 256 tokens."""
    config = SimulatorConfig(
        models=(ModelRule(match="sim-4k", context_window=WINDOW, max_output_tokens=256),)
    )
    with run_server(create_simulator_app(config)) as url:
        yield url


def _long_chat(url: str, session: str) -> Chat:
    """A chat whose history is past the trigger, so its next turn compacts."""
    chat = Chat(url, session=session)
    for turn in range(21):
        chat.history.append({"role": "user", "content": f"Turn {turn}: {FILLER}"})
        chat.history.append({"role": "assistant", "content": f"Noted. {FILLER}"})
    return chat


def test_a_summarizer_that_writes_less_is_asked_again_within_its_stated_limit(
    short_output_sim: str, start_proxy: Callable[..., str]
) -> None:
    """summary_max_tokens is 400; this model refuses more than 256 with its output-budget
    error. The chat model's reply reserve is not the summary's budget, so the proxy asks
    for 400 and, refused, once more for the 256 the error states."""
    chat = _long_chat(start_proxy(small_window_settings(short_output_sim)), "capped")
    chat.say("FACT cap=ok and carry on")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    asked = [call["body"]["max_tokens"] for call in summarizer_calls(short_output_sim)]
    assert asked[:2] == [400, 256]


def test_a_configured_summarizer_output_limit_is_asked_for_directly(
    short_output_sim: str, start_proxy: Callable[..., str]
) -> None:
    settings = small_window_settings(short_output_sim, summarizer_max_output_tokens=256)
    chat = _long_chat(start_proxy(settings), "configured")
    chat.say("carry on")
    assert chat.last is not None
    assert chat.last["x-compaction-status"] == "compacted"
    asked = {call["body"]["max_tokens"] for call in summarizer_calls(short_output_sim)}
    assert asked == {256}


# The instructions the summarizer reads besides the conversation: whatever they contain,
# a model may copy into a summary as if the conversation had said it.
_INSTRUCTIONS = (FULL.system, CORE.system, SIMPLE.system, TERSER.format(limit="{limit}"))


@pytest.mark.parametrize("text", _INSTRUCTIONS)
def test_the_summarizer_instructions_hold_no_example_a_model_could_copy_as_a_fact(
    text: str,
) -> None:
    lines = [line for line in text.splitlines() if not line.startswith("## ")]
    prose = "\n".join(lines).replace("{limit}", "")
    assert not re.search(r"\d", prose), "a number is a value a summary could carry"
    # A quote mark, or an apostrophe not inside a word ("user's" is fine).
    quoted = re.search(r"[\"`]|(?<![A-Za-z])'|'(?![A-Za-z])", prose)
    assert not quoted, "a quoted string reads as a value"
    assert "=" not in prose, "a key=value pair reads as a fact"
    assert not re.search(r"\b(e\.g\.|i\.e\.|for example|such as|like)\b", prose, re.I)


@pytest.mark.parametrize("text", _INSTRUCTIONS)
def test_a_model_copying_facts_from_everything_it_reads_finds_none_in_the_instructions(
    text: str,
) -> None:
    # The simulator's summarizer carries forward every FACT it reads, the prompt's too:
    # the old prompt's `"FACT key=value"` put a fact `key` into every simulated summary.
    assert collect_facts([{"role": "system", "content": text}]) == {}
