"""The simulator's ``/v1/responses``: the checks, shapes and stream the proxy is tested on."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from proxy.simulator.items import seal
from tests.support.servers import OPEN_CLIENTS

TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]


def client(sim: str) -> openai.OpenAI:
    made = openai.OpenAI(base_url=f"{sim}/v1", api_key="sk-sim", max_retries=0)
    OPEN_CLIENTS.append(made)
    return made


def call(call_id: str, item_id: str = "fc_1") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": "f",
        "arguments": "{}",
    }


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def reasoning(item_id: str, content: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "encrypted_content": content}


USER = {"role": "user", "content": "hi"}
SAID = {"role": "assistant", "content": "ok"}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([USER, output("c1")], "No tool call found for function call output with call_id c1."),
        ([USER, call("c1"), USER], "No tool output found for function call c1."),
        (
            [USER, reasoning("rs_1", seal("x")), USER],
            "Item 'rs_1' of type 'reasoning' was provided without its required following item.",
        ),
        (
            [USER, call("c1", "fcr_abc_1"), output("c1")],
            "Item 'fcr_abc_1' of type 'function_call' was provided without its required "
            "'reasoning' item: 'rs_abc'.",
        ),
        (
            [USER, reasoning("rs_1", seal("x") + "0"), SAID, USER],
            "The encrypted content for item rs_1 could not be verified.",
        ),
    ],
)
def test_items_openai_would_reject_are_rejected(
    sim_reset: str, items: list[dict[str, Any]], message: str
) -> None:
    answer = httpx.post(f"{sim_reset}/v1/responses", json={"model": "sim", "input": items})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == message
    assert httpx.get(f"{sim_reset}/_sim/stats").json()["rejected_structure"] == 1


def test_a_reasoning_turn_with_calls_round_trips(sim_reset: str) -> None:
    sdk = client(sim_reset)
    items: list[dict[str, Any]] = [{"role": "user", "content": "CALL 2"}]
    first = sdk.responses.create(
        model="sim",
        input=items,
        tools=TOOLS,
        reasoning={"effort": "low"},
    )
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call", "function_call"]
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items += [output(item.call_id) for item in first.output if item.type == "function_call"]
    second = sdk.responses.create(model="sim", input=items, tools=TOOLS)
    assert second.output_text == "observed 2 tool results"
    assert second.usage is not None
    assert second.usage.input_tokens > 0


def test_the_stream_is_the_sdks_event_sequence(sim_reset: str) -> None:
    sdk = client(sim_reset)
    with sdk.responses.stream(model="sim", input="FACT k=v and RECALL k") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == "k=v"


def test_an_overflow_in_responses_wording_or_in_the_stream(sim_reset: str) -> None:
    body = {"model": "sim", "input": "word " * 500}
    small = {"X-Sim-Context-Window": "200"}
    answer = httpx.post(f"{sim_reset}/v1/responses", json=body, headers=small)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    streamed = httpx.post(
        f"{sim_reset}/v1/responses",
        json={**body, "stream": True},
        headers={**small, "X-Sim-Errors-In-Stream": "1"},
    )
    assert streamed.status_code == 200
    kinds = [line[7:] for line in streamed.text.splitlines() if line.startswith("event: ")]
    assert kinds == ["response.created", "response.in_progress", "response.failed"]


def test_previous_response_id_continues_a_stored_conversation(sim_reset: str) -> None:
    sdk = client(sim_reset)
    first = sdk.responses.create(model="sim", input="FACT pet=cat")
    second = sdk.responses.create(model="sim", previous_response_id=first.id, input="RECALL pet")
    assert second.output_text == "pet=cat"
    with pytest.raises(openai.BadRequestError, match="not found"):
        sdk.responses.create(model="sim", previous_response_id="resp_nope", input="hi")
    unstored = sdk.responses.create(model="sim", input="FACT pet=dog", store=False)
    with pytest.raises(openai.BadRequestError):
        sdk.responses.create(model="sim", previous_response_id=unstored.id, input="RECALL pet")


def test_an_item_reference_stands_for_the_stored_output_item(sim_reset: str) -> None:
    """As api.openai.com: the referenced item is read as if sent whole (same prompt count,
    same answer), whether its response was streamed or not."""
    sdk = client(sim_reset)
    first = sdk.responses.create(model="sim", input="FACT pet=cat and RECALL pet")
    with sdk.responses.stream(model="sim", input="FACT toy=ball and RECALL toy") as stream:
        streamed = stream.get_final_response()
    whole: list[dict[str, Any]] = [{"role": "user", "content": "FACT pet=cat and RECALL pet"}]
    whole += [item.model_dump(exclude_none=True) for item in first.output]
    whole += [{"role": "user", "content": "FACT toy=ball and RECALL toy"}]
    whole += [item.model_dump(exclude_none=True) for item in streamed.output]
    whole += [{"role": "user", "content": "RECALL pet"}]
    referenced = [
        item if "id" not in item else {"type": "item_reference", "id": item["id"]} for item in whole
    ]
    assert sum(item.get("type") == "item_reference" for item in referenced) == 2
    sent_whole = sdk.responses.create(model="sim", input=whole, store=False)
    by_reference = sdk.responses.create(model="sim", input=referenced, store=False)
    assert by_reference.output_text == sent_whole.output_text == "pet=cat"
    assert by_reference.usage is not None
    assert sent_whole.usage is not None
    assert by_reference.usage.input_tokens == sent_whole.usage.input_tokens


def test_an_unknown_item_reference_is_openais_404(sim_reset: str) -> None:
    unstored = client(sim_reset).responses.create(model="sim", input="hi", store=False)
    for item_id in ("msg_nope", unstored.output[0].id):
        body = {
            "model": "sim",
            "input": [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": item_id}],
        }
        answer = httpx.post(f"{sim_reset}/v1/responses", json=body)
        assert answer.status_code == 404
        assert answer.json() == {
            "error": {
                "message": f"Item with id '{item_id}' not found. Items are not persisted when "
                "`store` is set to false. Try again with `store` set to true, or remove this "
                "item from your input.",
                "type": "invalid_request_error",
                "param": "input",
                "code": None,
            }
        }
