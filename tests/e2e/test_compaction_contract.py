"""OpenAI's compaction contract through a real proxy, with the official ``openai`` SDK,
against the simulator (issue 25 item 2).

Proxy mode (``upstream.compaction: proxy``, and ``auto`` for a non-OpenAI upstream): a
``compaction_trigger`` and ``responses.compact`` are answered by the proxy with a
``compaction`` item it sealed; the next request carries that item and the upstream
sees it expanded into the summary, so a fact planted early is recalled from it; a
misplaced trigger, a forged item and another tenant's item are 400s that reach no
upstream. Pass-through mode: the simulator (playing OpenAI) compacts, and its item
comes back to it untouched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.support.chat import FILLER, chat_requests, small_window_settings, stats
from tests.support.servers import OPEN_CLIENTS, proxy_settings

MODEL = "sim-4k"
TURNS = 10
TRIGGER = {"type": "compaction_trigger"}


def history() -> list[dict[str, Any]]:
    """A conversation with a fact planted at its first turn, then filler turns."""
    items: list[dict[str, Any]] = []
    for turn in range(TURNS):
        fact = " FACT code=k7q2" if turn == 0 else ""
        items.append({"role": "user", "content": f"Turn {turn}: {FILLER}{fact}"})
        items.append({"role": "assistant", "content": f"ok: noted turn {turn}. {FILLER}"})
    return items


def client(base: str, key: str = "sk-contract-a", session: str = "contract") -> openai.OpenAI:
    """Closed at the test's teardown, before its heap is collected: a client dropped in a
    reference cycle is collected with its pooled socket still open (a ResourceWarning,
    an error in a full run)."""
    sdk = openai.OpenAI(
        base_url=f"{base}/v1",
        api_key=key,
        max_retries=0,
        default_headers={"X-Session-Id": session},
    )
    OPEN_CLIENTS.append(sdk)
    return sdk


def _proxy(start_proxy: Callable[..., str], sim: str, mode: str, **sections: Any) -> str:
    plain = small_window_settings(sim)
    settings = proxy_settings(
        sim,
        upstream={"compaction": mode},
        models=[m.model_dump() for m in plain.models],
        compaction={**plain.compaction.model_dump(), "force_interval_s": 0},
        **sections,
    )
    return start_proxy(settings)


@pytest.fixture
def proxied(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    """A proxy that serves the contract itself (``auto``: the simulator is not OpenAI)."""
    return _proxy(start_proxy, sim_reset, "auto")


@pytest.fixture
def passing(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    return _proxy(start_proxy, sim_reset, "passthrough")


def _upstream_inputs(sim: str) -> list[list[dict[str, Any]]]:
    return [r["body"]["input"] for r in chat_requests(sim)]


def _recall(api: openai.OpenAI, items: list[Any]) -> str:
    answer = api.responses.create(
        model=MODEL, input=[*items, {"role": "user", "content": "RECALL code"}]
    )
    return answer.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_a_trigger_is_answered_by_the_proxy_and_the_item_expands_later(
    proxied: str, sim_reset: str, stream: bool
) -> None:
    api = client(proxied)
    if stream:
        with api.responses.stream(model=MODEL, input=[*history(), TRIGGER]) as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        assert kinds[0] == "response.created"
        assert kinds[-1] == "response.completed"
    else:
        response = api.responses.create(model=MODEL, input=[*history(), TRIGGER])
    assert [item.type for item in response.output] == ["compaction"]
    item = response.output[0].model_dump(exclude_none=True, warnings=False)
    assert item["encrypted_content"].startswith("cps1.")  # signed here, not the upstream's
    assert _upstream_inputs(sim_reset) == []  # no generation upstream: the proxy's answer
    assert stats(sim_reset)["summaries"] >= 1
    assert stats(sim_reset)["compactions"] == 0

    assert _recall(api, [item]) == "code=k7q2"
    (sent,) = _upstream_inputs(sim_reset)
    assert all(i.get("type") != "compaction" for i in sent)  # expanded for the upstream
    texts = " ".join(str(i.get("content")) for i in sent)
    assert "FACT code=k7q2" in texts  # from the summary:
    assert "Turn 0:" not in texts  # the turn that planted it is not sent
    assert len(sent) < 2 * TURNS  # the compacted view, not the history
    assert stats(sim_reset)["rejected_structure"] == 0


def test_a_trigger_under_compaction_off_is_still_the_proxys_to_answer(
    proxied: str, sim_reset: str
) -> None:
    """``X-Compaction: off`` bypasses compaction, but the upstream cannot answer a trigger:
    the client asked for a compaction item, and gets one."""
    api = client(proxied).with_options(default_headers={"X-Compaction": "off"})
    response = api.responses.create(model=MODEL, input=[*history(), TRIGGER])
    assert [item.type for item in response.output] == ["compaction"]
    assert stats(sim_reset)["requests"] == stats(sim_reset)["summaries"]  # none but those


def test_responses_compact_is_answered_by_the_proxy(proxied: str, sim_reset: str) -> None:
    api = client(proxied)
    compacted = api.responses.compact(model=MODEL, input=history())
    assert compacted.object == "response.compaction"
    kinds = [(item.type, getattr(item, "role", None)) for item in compacted.output]
    assert kinds == [("message", "user")] * TURNS + [("compaction", None)]
    assert compacted.usage.input_tokens > 0
    assert _upstream_inputs(sim_reset) == []
    # The next request carries the compacted output, as OpenAI's docs say to.
    output = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    assert _recall(api, output) == "code=k7q2"
    assert stats(sim_reset)["compactions"] == 0


def test_a_trigger_not_last_is_a_400_that_reaches_no_upstream(proxied: str, sim_reset: str) -> None:
    api = client(proxied)
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model=MODEL, input=[TRIGGER, {"role": "user", "content": "hi"}])
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"]) == ("input[0]", "invalid_value")
    assert stats(sim_reset)["requests"] == 0


def _forged(item: dict[str, Any]) -> dict[str, Any]:
    head, payload, tag = item["encrypted_content"].split(".")
    data = base64.urlsafe_b64decode(payload + "==").replace(b"k7q2", b"zzzz")
    forged = base64.urlsafe_b64encode(data).decode().rstrip("=")
    return {**item, "encrypted_content": f"{head}.{forged}.{tag}"}


def test_a_forged_or_foreign_item_is_refused(proxied: str, sim_reset: str) -> None:
    owner = client(proxied)
    response = owner.responses.create(model=MODEL, input=[*history(), TRIGGER])
    item = response.output[0].model_dump(exclude_none=True, warnings=False)
    requests = stats(sim_reset)["requests"]
    for api, sent in ((owner, _forged(item)), (client(proxied, key="sk-contract-b"), item)):
        with pytest.raises(openai.BadRequestError) as caught:
            _recall(api, [sent])
        error = caught.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["param"]) == ("invalid_encrypted_content", "input[0]")
    assert stats(sim_reset)["requests"] == requests  # nothing went upstream


def _resigned(item: dict[str, Any], base_url: str, carried: list[Any]) -> dict[str, Any]:
    """``item`` carrying ``carried`` instead, signed as anyone can sign it when the proxy
    has neither ``upstream.api_key`` nor ``store.encryption_keys``: the key derives from
    the documented ``base_url`` alone."""
    head, payload, _ = item["encrypted_content"].split(".")
    data = json.loads(base64.urlsafe_b64decode(payload + "=="))
    data["items"] = carried
    raw = json.dumps(data).encode()
    key = hashlib.sha256(f"compaction-proxy compaction item\0\0{base_url}".encode()).digest()
    tag = hmac.new(key, raw, hashlib.sha256).digest()

    def b64(value: bytes) -> str:
        return base64.urlsafe_b64encode(value).decode().rstrip("=")

    return {**item, "encrypted_content": f"{head}.{b64(raw)}.{b64(tag)}"}


@pytest.fixture
def capped(sim_reset: str, start_proxy: Callable[..., str]) -> str:
    """A proxy serving the contract, at most ``CAP`` input items a request."""
    return _proxy(start_proxy, sim_reset, "auto", server={"max_messages": CAP})


CAP = 50


@pytest.mark.parametrize("carried", [[42], ["x"], [None], [[]]], ids=repr)
def test_a_resigned_item_carrying_a_non_object_is_a_400(
    capped: str, sim_reset: str, carried: list[Any]
) -> None:
    """A forged payload that verifies is still checked as ``input`` is: each carried item an
    object, in OpenAI's error shape, naming the compaction item; nothing goes upstream."""
    api = client(capped)
    item = api.responses.create(model=MODEL, input=[*history(), TRIGGER]).output[0]
    forged = _resigned(item.model_dump(exclude_none=True, warnings=False), f"{sim_reset}/v1", [])
    assert _recall(api, [forged]) is not None  # the re-signed item verifies
    forged = _resigned(forged, f"{sim_reset}/v1", carried)
    requests = stats(sim_reset)["requests"]
    answer = httpx.post(
        f"{capped}/v1/responses",
        json={"model": MODEL, "input": [{"role": "user", "content": "hi"}, forged]},
        headers={"Authorization": "Bearer sk-contract-a", "X-Session-Id": "contract"},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "input[1]")
    assert "items[0]" in error["message"]
    assert stats(sim_reset)["requests"] == requests


def test_a_resigned_item_nested_deeper_than_json_is_written_is_a_400(
    capped: str, sim_reset: str
) -> None:
    """A carried payload may nest deeper than orjson writes (the body the proxy sends on)."""
    api = client(capped)
    item = api.responses.create(model=MODEL, input=[*history(), TRIGGER]).output[0]
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    carried = [{"type": "message", "role": "user", "content": deep}]
    forged = _resigned(
        item.model_dump(exclude_none=True, warnings=False), f"{sim_reset}/v1", carried
    )
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model=MODEL, input=[forged])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "invalid_json"


def test_carried_items_count_toward_the_input_limit(capped: str, sim_reset: str) -> None:
    """``server.max_messages`` bounds the input once its compaction items are expanded."""
    api = client(capped)
    item = api.responses.create(model=MODEL, input=[*history(), TRIGGER]).output[0]
    dumped = item.model_dump(exclude_none=True, warnings=False)
    carried = [{"role": "user", "content": f"m{i}"} for i in range(CAP + 10)]
    requests = stats(sim_reset)["requests"]
    for sent in (
        [_resigned(dumped, f"{sim_reset}/v1", carried)],
        [
            _resigned(dumped, f"{sim_reset}/v1", carried[: CAP - 5]),
            *carried[:10],
        ],
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            api.responses.create(model=MODEL, input=sent)
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["param"] == "input"
        assert f"at most {CAP}" in error["message"]
    assert stats(sim_reset)["requests"] == requests


def test_context_management_is_checked_and_compacts_past_its_threshold(
    proxied: str, sim_reset: str
) -> None:
    api = client(proxied)
    with pytest.raises(openai.BadRequestError):
        api.responses.create(
            model=MODEL,
            input="hi",
            extra_body={"context_management": [{"type": "compaction", "compact_threshold": 10}]},
        )
    raw = api.responses.with_raw_response.create(
        model=MODEL,
        input=[*history(), {"role": "user", "content": "RECALL code"}],
        extra_body={"context_management": [{"type": "compaction", "compact_threshold": 1000}]},
    )
    assert raw.headers["x-compaction-status"] == "compacted"
    assert raw.parse().output_text == "code=k7q2"
    (sent,) = chat_requests(sim_reset)
    assert "context_management" not in sent["body"]


def test_passthrough_the_upstream_compacts_and_reads_its_own_item(
    passing: str, sim_reset: str
) -> None:
    api = client(passing)
    raw = api.responses.with_raw_response.create(model=MODEL, input=[*history(), TRIGGER])
    assert raw.headers["x-compaction-status"] == "bypassed"  # never compacted here too
    response = raw.parse()
    assert [item.type for item in response.output] == ["compaction"]
    item = response.output[0].model_dump(exclude_none=True, warnings=False)
    assert not item["encrypted_content"].startswith("cps1.")  # the upstream's
    assert stats(sim_reset)["compactions"] == 1
    assert stats(sim_reset)["summaries"] == 0
    (sent,) = _upstream_inputs(sim_reset)
    assert sent[-1] == TRIGGER  # forwarded as it came

    carried = api.responses.with_raw_response.create(
        model=MODEL, input=[item, {"role": "user", "content": "RECALL code"}]
    )
    assert carried.headers["x-compaction-status"] == "bypassed"
    assert carried.parse().output_text == "code=k7q2"  # the upstream expands its own item
    assert _upstream_inputs(sim_reset)[-1][0]["type"] == "compaction"

    compacted = api.responses.compact(model=MODEL, input=history())
    assert compacted.output[-1].type == "compaction"
    assert stats(sim_reset)["compactions"] == 2
    with pytest.raises(openai.BadRequestError) as caught:  # the upstream's own 400
        api.responses.create(model=MODEL, input=[TRIGGER, {"role": "user", "content": "hi"}])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "input[0]"


def test_the_simulator_refuses_an_item_it_did_not_write(sim_reset: str) -> None:
    body = {"model": MODEL, "input": [{"type": "compaction", "encrypted_content": "bogus"}]}
    answer = httpx.post(f"{sim_reset}/v1/responses", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_encrypted_content"


def test_an_item_sealed_before_a_tenant_id_secret_was_set_still_opens(
    sim_reset: str, start_proxy: Callable[..., str]
) -> None:
    """A deployment that sets server.tenant_id_secret moves its tenants' ids; an item its
    clients hold, sealed for the old id, opens for the same key while legacy ids are
    matched (a conversation kept only in that item is not lost), and no longer once
    server.legacy_tenant_ids is false."""
    before = _proxy(start_proxy, sim_reset, "auto")
    with client(before) as api:
        item = api.responses.create(model=MODEL, input=[*history(), TRIGGER]).output[0]
    sealed = item.model_dump(exclude_none=True, warnings=False)
    secret = {"tenant_id_secret": "a-new-tenant-id-secret-0123456789"}
    after = _proxy(start_proxy, sim_reset, "auto", server=secret)
    with client(after) as owner, client(after, key="sk-contract-b") as other:
        assert _recall(owner, [sealed]) == "code=k7q2"
        with pytest.raises(openai.BadRequestError):  # still only for its own key
            _recall(other, [sealed])
    done = _proxy(start_proxy, sim_reset, "auto", server={**secret, "legacy_tenant_ids": False})
    with client(done) as api, pytest.raises(openai.BadRequestError) as caught:
        _recall(api, [sealed])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "invalid_encrypted_content"
