"""LiteLLM as a client through the proxy: a long conversation with a planted fact, a
tool and streamed turns. Runs in its own venv (tests/e2e/test_clients.py makes it: every
LiteLLM release pins an older openai than the test venv's), prints one JSON line.
Usage: python litellm_client.py <proxy base URL> <filler text>
"""

import json
import sys
from collections import Counter

import litellm

base, filler = sys.argv[1], sys.argv[2]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    }
]
ARGS = {
    "model": "openai/sim-4k",
    "api_base": f"{base}/v1",
    "api_key": "sk-litellm",
    "num_retries": 0,
    "max_retries": 0,
    "extra_headers": {"X-Sim-Context-Window": "4096", "X-Session-Id": "litellm"},
}
statuses: Counter[str] = Counter()
windows: set[str] = set()
tool_args: list[object] = []
after_tools: list[object] = []


def note(response: object) -> None:
    # LiteLLM hands the provider's headers on as "llm_provider-<name>".
    headers = response._hidden_params["additional_headers"]
    statuses[headers["llm_provider-x-compaction-status"]] += 1
    windows.add(headers["llm_provider-x-context-window"])


history: list[dict[str, object]] = [{"role": "system", "content": "You are a helpful assistant."}]
for turn in range(36):
    fact = " FACT code=k7q2" if turn == 0 else ""
    call = " CALL 1" if turn % 5 == 4 else ""
    history.append({"role": "user", "content": f"Turn {turn}: {filler}{fact}{call}"})
    if turn % 3 == 1:
        stream = litellm.completion(messages=history, tools=TOOLS, stream=True, **ARGS)
        note(stream)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
        history.append({"role": "assistant", "content": text})
        continue
    reply = litellm.completion(messages=history, tools=TOOLS, **ARGS)
    note(reply)
    message = reply.choices[0].message
    history.append(message.model_dump(exclude_none=True))
    for tool_call in message.tool_calls or []:
        tool_args.append(json.loads(tool_call.function.arguments))
        history.append({"role": "tool", "tool_call_id": tool_call.id, "content": "x " * 300})
    if message.tool_calls:
        after = litellm.completion(messages=history, tools=TOOLS, **ARGS)
        note(after)
        after_tools.append(after.choices[0].message.content)
        history.append({"role": "assistant", "content": after.choices[0].message.content})
history.append({"role": "user", "content": "RECALL code"})
recall = litellm.completion(messages=history, **ARGS)
note(recall)
print(
    json.dumps(
        {
            "recall": recall.choices[0].message.content,
            "statuses": statuses,
            "windows": sorted(windows),
            "toolArgs": tool_args,
            "afterTools": after_tools,
        }
    )
)
