"""OpenAI's compaction contract at the proxy (routes/compaction_items.py), in process:
who serves it, the seal on the proxy's items, and what ``admit`` makes of a request."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Settings
from proxy.errors import InvalidRequest
from proxy.routes.compaction_items import Sealer, admit, compaction_item, passes_through
from proxy.types import ChatMessage

KEY = "x" * 43 + "="  # a Fernet key: 32 bytes, base64url
TRIGGER = {"type": "compaction_trigger"}


def settings(**upstream: Any) -> Settings:
    return Settings(upstream={"base_url": "http://127.0.0.1:9/v1", **upstream})


def test_auto_passes_through_only_for_api_openai_com() -> None:
    def mode(url: str, compaction: str = "auto") -> bool:
        return passes_through(Settings(upstream={"base_url": url, "compaction": compaction}))

    assert mode("https://api.openai.com/v1")
    assert not mode("http://127.0.0.1:8000/v1")
    assert not mode("https://api.openai.com.example.net/v1")
    assert mode("http://vllm:8000/v1", "passthrough")
    assert not mode("https://api.openai.com/v1", "proxy")


@pytest.mark.parametrize("keys", [[], [KEY]])
def test_a_sealed_payload_opens_and_a_tampered_one_does_not(keys: list[str]) -> None:
    sealer = Sealer(Settings(store={"encryption_keys": keys}))
    token = sealer.seal({"v": 1, "t": "tenant", "items": []})
    assert token.startswith("cpe1." if keys else "cps1.")
    assert sealer.open(token) == {"v": 1, "t": "tenant", "items": []}
    assert sealer.open(token[:-3] + ("AAA" if token[-3:] != "AAA" else "BBB")) is None
    assert sealer.open("gAAAAA-not-ours") is None


def test_a_signed_item_does_not_open_under_another_deployments_key() -> None:
    token = Sealer(settings(api_key="sk-one")).seal({"v": 1, "t": "t", "items": []})
    assert Sealer(settings(api_key="sk-two")).open(token) is None
    assert Sealer(Settings(store={"encryption_keys": [KEY]})).open(token) is None


def _item(tenant: str, config: Settings) -> dict[str, Any]:
    summary = ChatMessage(role="user", content="summary FACT code=k7q2")
    return compaction_item([summary], tenant, ("h:abc", 3), Sealer(config))


def test_admit_expands_an_item_for_its_tenant_and_refuses_it_for_another() -> None:
    config = settings(compaction="proxy")
    item = _item("tenant-a", config)
    data = {"model": "m", "input": [item, {"role": "user", "content": "RECALL code"}]}
    admitted = admit(data, ("tenant-a",), config, compact=False)
    assert admitted.changed
    assert admitted.local is None
    assert admitted.data["input"][0]["content"] == "summary FACT code=k7q2"
    with pytest.raises(InvalidRequest) as caught:
        admit(data, ("tenant-b",), config, compact=False)
    assert (caught.value.code, caught.value.param) == ("invalid_encrypted_content", "input[0]")


def test_an_item_sealed_for_a_legacy_id_opens_for_the_tenant_still_known_by_it() -> None:
    """While a deployment's ids move (tenants.py), the caller's legacy id comes second:
    an item sealed before the move opens for that caller, and only for it."""
    config = settings(compaction="proxy")
    data = {"model": "m", "input": [_item("legacy-a", config)]}
    assert admit(data, ("new-a", "legacy-a"), config, compact=False).changed
    for tenants in (("new-a",), ("new-b", "legacy-b"), ("legacy-a-longer",)):
        with pytest.raises(InvalidRequest):
            admit(data, tenants, config, compact=False)


def test_admit_takes_the_trigger_last_only() -> None:
    config = settings(compaction="proxy")
    user = {"role": "user", "content": "hi"}
    admitted = admit({"model": "m", "input": [user, TRIGGER]}, ("t",), config, compact=False)
    assert admitted.local == "trigger"
    assert admitted.data["input"] == [user]
    with pytest.raises(InvalidRequest) as caught:
        admit({"model": "m", "input": [TRIGGER, user]}, ("t",), config, compact=False)
    assert caught.value.param == "input[0]"


def test_passthrough_leaves_every_use_of_the_contract_untouched() -> None:
    config = settings(compaction="passthrough")
    foreign = {"type": "compaction", "encrypted_content": "gAAAA-upstreams"}
    for data in (
        {"model": "m", "input": [{"role": "user", "content": "hi"}, TRIGGER]},
        {"model": "m", "input": [foreign]},
        {"model": "m", "input": "hi", "context_management": [{"type": "compaction"}]},
    ):
        admitted = admit(data, ("t",), config, compact=False)
        assert admitted.untouched
        assert admitted.data is data
    assert admit({"model": "m", "input": "hi"}, ("t",), config, compact=True).untouched
    assert not admit({"model": "m", "input": "hi"}, ("t",), config, compact=False).untouched
