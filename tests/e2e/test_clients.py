"""Client compatibility: real client libraries, the real proxy, the simulator upstream.

Each client runs one long conversation in a 4k window: a fact planted at turn 1,
tool rounds, streamed turns, at least two compactions, then the fact recalled.
Where the client exposes response headers, the ``X-Compaction-*`` headers are
checked on every answer; elsewhere ``GET /sessions/{id}`` shows the compactions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.support.chat import FILLER, TOOLS, chat_requests, small_window_settings, stats

TURNS = 36
HEADERS = {"X-Sim-Context-Window": "4096"}


def user_text(turn: int) -> str:
    """Turn 0 plants the fact; every fifth asks for a tool call."""
    fact = " FACT code=k7q2" if turn == 0 else ""
    call = " CALL 1" if turn % 5 == 4 else ""
    return f"Turn {turn}: {FILLER}{fact}{call}"


def check_headers(headers: httpx.Headers | Any, statuses: Counter[str]) -> None:
    status = headers["x-compaction-status"]
    assert status in {"passthrough", "snapshot", "compacted"}, status
    assert int(headers["x-context-tokens"]) <= int(headers["x-context-window"]) == 4096
    assert int(headers["x-compaction-version"]) >= 0
    statuses[status] += 1


def compacted_versions(proxy: str, session: str, key: str) -> int:
    found = httpx.get(f"{proxy}/sessions/{session}", headers={"Authorization": f"Bearer {key}"})
    assert found.status_code == 200
    return int(found.json()["version"])


def check_upstream(sim: str) -> None:
    sim_stats = stats(sim)
    assert sim_stats["rejected_structure"] == 0
    assert sim_stats["overflows"] == 0


@pytest.fixture
def proxy4k(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    return start_proxy(small_window_settings(sim_reset))


class Recall(BaseModel):
    answer: str


def test_openai_python_sync_stream_tools_and_parse(proxy4k: str, sim_reset: str) -> None:
    client = openai.OpenAI(
        base_url=f"{proxy4k}/v1",
        api_key="sk-py",
        max_retries=0,
        default_headers={**HEADERS, "X-Session-Id": "py-sync"},
    )
    statuses: Counter[str] = Counter()
    history: list[Any] = [{"role": "system", "content": "You are a helpful assistant."}]
    with client:
        for turn in range(TURNS):
            history.append({"role": "user", "content": user_text(turn)})
            stream = turn % 3 == 1
            raw = client.chat.completions.with_raw_response.create(
                model="sim-4k", messages=history, tools=TOOLS, stream=stream
            )
            check_headers(raw.headers, statuses)
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
                history.append({"role": "assistant", "content": text})
                continue
            message = raw.parse().choices[0].message
            history.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                assert json.loads(call.function.arguments) == {"step": 1}
                history.append({"role": "tool", "tool_call_id": call.id, "content": "x " * 300})
            if message.tool_calls:
                reply = client.chat.completions.create(
                    model="sim-4k", messages=history, tools=TOOLS
                )
                assert reply.choices[0].message.content == "observed 1 tool results"
                history.append({"role": "assistant", "content": reply.choices[0].message.content})
        history.append({"role": "user", "content": "RECALL code"})
        parsed = client.chat.completions.parse(
            model="sim-4k", messages=history, response_format=Recall
        )
    assert parsed.choices[0].message.parsed == Recall(answer="code=k7q2")
    assert statuses["compacted"] >= 2, statuses
    assert compacted_versions(proxy4k, "py-sync", "sk-py") >= 2
    check_upstream(sim_reset)


async def test_openai_python_async_stream(proxy4k: str, sim_reset: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{proxy4k}/v1",
        api_key="sk-py",
        max_retries=0,
        default_headers={**HEADERS, "X-Session-Id": "py-async"},
    )
    statuses: Counter[str] = Counter()
    history: list[Any] = [{"role": "system", "content": "You are a helpful assistant."}]
    async with client:
        for turn in range(2 * TURNS):  # no tool outputs: more turns to fill the window twice
            history.append({"role": "user", "content": user_text(turn).replace(" CALL 1", "")})
            raw = await client.chat.completions.with_raw_response.create(
                model="sim-4k", messages=history, stream=True
            )
            check_headers(raw.headers, statuses)
            text = "".join([c.choices[0].delta.content or "" async for c in raw.parse()])
            history.append({"role": "assistant", "content": text})
        history.append({"role": "user", "content": "RECALL code"})
        answer = await client.chat.completions.create(model="sim-4k", messages=history)
    assert answer.choices[0].message.content == "code=k7q2"
    assert statuses["compacted"] >= 2, statuses
    check_upstream(sim_reset)


def test_langchain_chat_openai(proxy4k: str, sim_reset: str) -> None:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def read_file(step: int) -> str:
        """Read a file."""
        return "x " * 300

    llm = ChatOpenAI(
        model="sim-4k",
        base_url=f"{proxy4k}/v1",
        api_key="sk-lc",  # type: ignore[arg-type]
        max_retries=0,
        default_headers={**HEADERS, "X-Session-Id": "langchain"},
    ).bind_tools([read_file])
    history: list[BaseMessage] = [SystemMessage("You are a helpful assistant.")]
    for turn in range(TURNS):
        history.append(HumanMessage(user_text(turn)))
        if turn % 3 == 1:
            chunks = list(llm.stream(history))
            merged = chunks[0]
            for chunk in chunks[1:]:
                merged = merged + chunk
            history.append(AIMessage(str(merged.content)))
            continue
        message = llm.invoke(history)
        history.append(message)
        for call in getattr(message, "tool_calls", []):
            assert call["name"] == "read_file"
            assert call["args"] == {"step": 1}
            history.append(ToolMessage(read_file.invoke(call["args"]), tool_call_id=call["id"]))
        if getattr(message, "tool_calls", []):
            reply = llm.invoke(history)
            assert reply.content == "observed 1 tool results"
            history.append(reply)
    history.append(HumanMessage("RECALL code"))
    assert llm.invoke(history).content == "code=k7q2"
    assert compacted_versions(proxy4k, "langchain", "sk-lc") >= 2
    check_upstream(sim_reset)


async def test_agents_sdk_on_chat_completions(proxy4k: str, sim_reset: str) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    @function_tool
    def read_file(step: int) -> str:
        """Read the file for a step of the task."""
        return f"step {step}: " + "line of file content\n" * 30

    set_tracing_disabled(True)
    statuses: Counter[str] = Counter()

    async def count(response: httpx.Response) -> None:
        check_headers(response.headers, statuses)

    client = openai.AsyncOpenAI(
        base_url=f"{proxy4k}/v1",
        api_key="sk-agents",
        max_retries=0,
        http_client=httpx.AsyncClient(event_hooks={"response": [count]}),
        default_headers={**HEADERS, "X-Session-Id": "agents-chat"},
    )
    agent = Agent(
        name="worker",
        instructions="You work through the task step by step.",
        model=OpenAIChatCompletionsModel(model="sim-4k", openai_client=client),
        tools=[read_file],
    )
    run = RunConfig(tracing_disabled=True)
    history: list[Any] = []
    try:
        for turn in range(TURNS):
            text = user_text(turn)
            if turn % 3 == 1:
                streamed = Runner.run_streamed(
                    agent, [*history, {"role": "user", "content": text}], run_config=run
                )
                async for _ in streamed.stream_events():
                    pass
                result: Any = streamed
            else:
                result = await Runner.run(
                    agent, [*history, {"role": "user", "content": text}], run_config=run
                )
            if "CALL 1" in text:
                assert result.final_output == "observed 1 tool results"
            history = result.to_input_list()
        recall = [*history, {"role": "user", "content": "RECALL code"}]
        result = await Runner.run(agent, recall, run_config=run)
    finally:
        await client.close()
    assert result.final_output == "code=k7q2"
    assert statuses["compacted"] >= 2, statuses
    check_upstream(sim_reset)


NODE_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "node"


def _openai_node() -> Path:
    """The npm package ``openai``, installed once into .cache/node (gitignored). No node
    or npm is a failure, not a skip: CI installs them (scripts/test)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node, "node is needed for the openai-node test (scripts/test installs it)"
    assert npm, "npm is needed for the openai-node test (scripts/test installs it)"
    if not (NODE_CACHE / "node_modules" / "openai" / "package.json").exists():
        subprocess.run(
            [npm, "install", "--prefix", str(NODE_CACHE), "--no-audit", "--no-fund", "openai@6"],
            check=True,
            timeout=300,
            capture_output=True,
        )
    return NODE_CACHE / "node_modules"


def test_openai_node(proxy4k: str, sim_reset: str) -> None:
    run_node_client(_openai_node().parent, "openai_node.mjs", proxy4k)
    check_upstream(sim_reset)


def run_node_client(folder: Path, name: str, proxy: str) -> None:
    """Run the client script clients/``name`` with node against ``proxy`` and check the
    result it reports. Node resolves an .mjs import from the script's folders upwards;
    NODE_PATH is for CommonJS only, so the script runs from a copy in ``folder``, beside
    the installed packages' node_modules."""
    runner = folder / name
    shutil.copyfile(Path(__file__).parent / "clients" / name, runner)
    done = subprocess.run(
        ["node", str(runner), proxy, FILLER.strip()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    check_script_result(done.stdout)


def check_script_result(stdout: str) -> None:
    """What a client script (openai-node, LiteLLM) reports on its last line, as JSON."""
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["recall"] == "code=k7q2"
    assert result["statuses"].get("compacted", 0) >= 2, result["statuses"]
    assert set(result["statuses"]) <= {"passthrough", "snapshot", "compacted"}
    assert result["windows"] == ["4096"]
    # Turns 9, 14, 24 and 29 call the tool unstreamed (the streamed ones read text).
    assert result["toolArgs"] == [{"step": 1}] * 4
    assert result["afterTools"] == ["observed 1 tool results"] * 4


# LiteLLM runs in a venv of its own: every release that installs pins openai<3, which the
# Agents SDK in the test venv excludes. Pinned to the newest that installs (1.103.8 and
# later need a certifi release the registry does not have yet; 1.109 allows openai 3).
LITELLM = "1.103.7"
LITELLM_VENV = NODE_CACHE.parent / f"litellm-{LITELLM}"


def _litellm_python() -> Path:
    """The Python of a venv with ``litellm`` pinned, made once under .cache (gitignored);
    a stamp marks a finished install, so an interrupted one is made again."""
    python = LITELLM_VENV / "bin" / "python"
    stamp = LITELLM_VENV / ".installed"
    if not stamp.exists():
        shutil.rmtree(LITELLM_VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True, timeout=120)
        subprocess.run(
            # No byte-compiling of its thousands of modules: half the install time; the
            # few the client imports compile on first use.
            [str(python), "-m", "pip", "install", "-q", "--no-compile", f"litellm=={LITELLM}"],
            check=True,
            timeout=600,
            capture_output=True,
        )
        stamp.touch()
    return python


def test_litellm(proxy4k: str, sim_reset: str) -> None:
    python = _litellm_python()
    script = Path(__file__).parent / "clients" / "litellm_client.py"
    done = subprocess.run(
        [str(python), str(script), proxy4k, FILLER.strip()],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        # The model price list bundled with the package, not fetched at import.
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    check_script_result(done.stdout)
    assert compacted_versions(proxy4k, "litellm", "sk-litellm") >= 2
    check_upstream(sim_reset)


# The Vercel AI SDK, pinned: 6 is the newest major whose packages support the Node.js the
# CI installs (Debian's 20; ai 7 and @ai-sdk/openai 4 need 22). Installed like openai-node,
# into a folder of its own (both pins together), a stamp marking a finished install.
VERCEL_AI = ("ai@6.0.325", "@ai-sdk/openai@3.0.141")
VERCEL_AI_CACHE = NODE_CACHE.parent / "vercel-ai-6.0.325"


def _vercel_ai() -> Path:
    npm = shutil.which("npm")
    assert npm, "npm is needed for the Vercel AI SDK test (scripts/test installs it)"
    stamp = VERCEL_AI_CACHE / ".installed"
    if not stamp.exists():
        shutil.rmtree(VERCEL_AI_CACHE, ignore_errors=True)
        VERCEL_AI_CACHE.mkdir(parents=True)
        subprocess.run(
            [npm, "install", "--prefix", str(VERCEL_AI_CACHE), "--no-audit", "--no-fund",
             *VERCEL_AI],
            check=True,
            timeout=300,
            capture_output=True,
        )  # fmt: skip
        stamp.touch()
    return VERCEL_AI_CACHE


def test_vercel_ai_sdk_on_responses(proxy4k: str, sim_reset: str) -> None:
    """``openai(model)``: the Responses provider, the session named by
    ``providerOptions.openai.promptCacheKey``, tools run by the SDK (``stopWhen``), and
    ``store`` at its default (true): earlier answers come back as ``item_reference``
    items, which the proxy reads as the output items it relayed (none unresolved)."""
    run_node_client(_vercel_ai(), "vercel_ai.mjs", proxy4k)
    assert compacted_versions(proxy4k, "vercel", "sk-vercel") >= 2
    requests = chat_requests(sim_reset)
    assert requests
    assert all(r["body"]["prompt_cache_key"] == "vercel" for r in requests)
    assert all("input" in r["body"] for r in requests)  # the Responses API, not chat
    references = [
        item
        for r in requests
        for item in r["body"]["input"]
        if isinstance(item, dict) and item.get("type") == "item_reference"
    ]
    assert references, "the SDK sent no item_reference: store is not at its default"
    metrics = httpx.get(f"{proxy4k}/metrics").text
    assert 'compaction_proxy_item_references_total{outcome="unresolved"} 0.0' in metrics
    assert 'compaction_proxy_item_references_total{outcome="resolved"} 0.0' not in metrics
    check_upstream(sim_reset)


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_pydantic_ai(proxy4k: str, sim_reset: str, api: str) -> None:
    """pydantic-ai's agent loop (``Agent.run``, ``run_stream``, a plain tool) on its
    default OpenAI model, the Responses API (the session in ``openai_prompt_cache_key``),
    and on chat completions (the session header on the client)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    statuses: Counter[str] = Counter()

    async def count(response: httpx.Response) -> None:
        check_headers(response.headers, statuses)

    session = f"pydantic-ai-{api}"
    header = {"X-Session-Id": session} if api == "chat" else {}
    client = openai.AsyncOpenAI(
        base_url=f"{proxy4k}/v1",
        api_key="sk-pydantic-ai",
        max_retries=0,
        http_client=httpx.AsyncClient(event_hooks={"response": [count]}),
        default_headers={**HEADERS, **header},
    )
    provider = OpenAIProvider(openai_client=client)
    if api == "chat":
        model: Any = OpenAIChatModel("sim-4k", provider=provider)
    else:
        model = OpenAIResponsesModel(
            "sim-4k", provider=provider, settings={"openai_prompt_cache_key": session}
        )
    agent = Agent(model, instructions="You are a helpful assistant.")
    reads: list[int] = []

    @agent.tool_plain
    def read_file(step: int) -> str:
        """Read a file."""
        reads.append(step)
        return "x " * 300

    history: list[Any] = []
    try:
        for turn in range(TURNS):
            text = user_text(turn)
            if turn % 3 == 1:
                async with agent.run_stream(text, message_history=history) as streamed:
                    output = "".join([d async for d in streamed.stream_text(delta=True)])
                history = streamed.all_messages()
            else:
                result = await agent.run(text, message_history=history)
                output, history = result.output, result.all_messages()
            if "CALL 1" in text:
                assert output == "observed 1 tool results"
        recall = await agent.run("RECALL code", message_history=history)
    finally:
        await client.close()
    assert recall.output == "code=k7q2"
    assert reads == [1] * 7  # turns 4, 9, ..., 34, streamed or not
    assert statuses["compacted"] >= 2, statuses
    assert compacted_versions(proxy4k, session, "sk-pydantic-ai") >= 2
    field = "input" if api == "responses" else "messages"
    assert all(field in r["body"] for r in chat_requests(sim_reset))
    check_upstream(sim_reset)
