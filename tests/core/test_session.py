"""session.py: tenants from credentials, session keys from headers or from the conversation."""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

import orjson
import pytest

from proxy.config import SessionSettings
from proxy.core import tenant_ids
from proxy.core.session import (
    SessionKey,
    session_from_header,
    session_from_history,
    session_name,
    tenant_from_headers,
    tenant_of,
)
from proxy.core.tenant_ids import CREDENTIAL_HEADERS, TenantIds, _credentials
from proxy.errors import InvalidRequest
from proxy.types import ChatMessage

SYSTEM: ChatMessage = {"role": "system", "content": "You are a helpful assistant."}
RAW_KEY = "sk-proj-Zq8v1secretRAWkey0123456789"


def derived(messages: list[ChatMessage], tenant: str = "t") -> SessionKey:
    return session_from_history(tenant, messages)


def conversation(first_user: str, turns: int, system: ChatMessage = SYSTEM) -> list[ChatMessage]:
    """system, then ``turns`` user/assistant exchanges opening with ``first_user``."""
    messages: list[ChatMessage] = [system, {"role": "user", "content": first_user}]
    for turn in range(turns):
        messages.append({"role": "assistant", "content": f"reply {turn}"})
        messages.append({"role": "user", "content": f"follow-up {turn}"})
    return messages


def test_same_credential_same_tenant() -> None:
    assert tenant_of(f"Bearer {RAW_KEY}") == tenant_of(f"Bearer {RAW_KEY}")


@pytest.mark.parametrize(
    "other",
    [
        f"Bearer {RAW_KEY}x",
        f"Bearer {RAW_KEY[:-1]}",
        "Bearer sk-someone-else",
        None,
        "",
    ],
)
def test_different_credentials_different_tenants(other: str | None) -> None:
    assert tenant_of(f"Bearer {RAW_KEY}") != tenant_of(other)


@pytest.mark.parametrize("header", ["x-api-key", "api-key"])
def test_one_key_is_one_tenant_whichever_header_carries_it(header: str) -> None:
    """Claude Code's ``x-api-key`` and an OpenAI SDK's Bearer token with the same key are
    one tenant, so a session crosses APIs; a Bearer token hashes as it always did."""
    bearer = tenant_from_headers({"authorization": f"Bearer {RAW_KEY}"})
    assert bearer == tenant_of(f"authorization:Bearer {RAW_KEY}")  # stored tenants stay
    assert tenant_from_headers({header: RAW_KEY}) == bearer
    both = {"authorization": f"Bearer {RAW_KEY}", header: RAW_KEY}
    assert tenant_from_headers(both) == bearer
    assert tenant_from_headers({header: f"{RAW_KEY}x"}) != bearer
    assert tenant_from_headers({**both, header: "sk-another"}) != bearer


@pytest.mark.parametrize("header", CREDENTIAL_HEADERS)
def test_a_cached_tenant_is_not_reused_for_a_changed_key(header: str) -> None:
    """tenant_from_headers caches tenants by the credential headers' values: each of
    them is part of the key, so another value in any one is another tenant."""
    first = {name: f"{RAW_KEY}-{name}" for name in CREDENTIAL_HEADERS}
    assert tenant_from_headers(first) == tenant_from_headers(dict(first))  # cached
    changed = {**first, header: f"{RAW_KEY}-changed"}
    expected = tenant_of("\n".join(_credentials(changed)))
    assert tenant_from_headers(changed) == expected != tenant_from_headers(first)
    assert tenant_from_headers({}) == "anonymous"


def test_the_tenant_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenant_ids, "TENANT_CACHE_SIZE", 3)
    ids = TenantIds()
    for i in range(10):
        key = f"Bearer {RAW_KEY}{i}"
        assert ids.of({"authorization": key}) == tenant_of(f"authorization:{key}")
        assert len(ids.cache) <= 3
    # The oldest went first: the newest are still there.
    assert (f"Bearer {RAW_KEY}9", None, None) in ids.cache


def test_a_credential_too_long_for_a_key_is_hashed_but_not_kept() -> None:
    """A client's 64 KB "keys" must not fill the cache with 64 MB (found in review)."""
    ids = TenantIds()
    huge = "Bearer " + "k" * 60_000
    assert ids.of({"authorization": huge}) == tenant_of(f"authorization:{huge}")
    assert ids.cache == {}
    ids.of({"authorization": f"Bearer {RAW_KEY}"})  # a real key's size: kept
    assert len(ids.cache) == 1


def test_storage_keys_never_hold_the_raw_credential() -> None:
    tenant = tenant_of(f"Bearer {RAW_KEY}")
    keys = [
        session_from_header(tenant, "my-session").storage_key,
        derived(conversation("hello", 3), tenant).storage_key,
    ]
    for key in keys:
        assert RAW_KEY not in key
        assert RAW_KEY[-12:] not in key  # not even a recognisable fragment
        assert "Bearer" not in key


def test_header_session_is_scoped_by_tenant() -> None:
    alice, bob = tenant_of("Bearer sk-alice"), tenant_of("Bearer sk-bob")
    assert session_from_header(alice, "shared").storage_key != (
        session_from_header(bob, "shared").storage_key
    )
    assert session_from_header(alice, "shared") == session_from_header(alice, "shared")
    assert session_from_header(alice, "one").storage_key != (
        session_from_header(alice, "two").storage_key
    )


def test_a_derived_session_id_is_the_one_earlier_releases_derived() -> None:
    """Where a header-less session's snapshot is stored must survive an upgrade: the id
    chains BLAKE2b digests of the canonical messages, whatever digests counting uses."""
    messages = conversation("hello", 3)
    h = blake2b(digest_size=16)
    for m in messages[:3]:  # the system prompt, then two messages
        h.update(blake2b(orjson.dumps(m, option=orjson.OPT_SORT_KEYS), digest_size=16).digest())
    assert derived(messages).session == h.hexdigest()


def test_derived_session_is_scoped_by_tenant() -> None:
    history = conversation("hello", 2)
    alice, bob = tenant_of("Bearer sk-alice"), tenant_of("Bearer sk-bob")
    assert derived(history, alice).storage_key != derived(history, bob).storage_key


def test_header_and_derived_sessions_never_share_a_storage_key() -> None:
    tenant = tenant_of("Bearer sk-alice")
    history = conversation("hello", 2)
    from_history = derived(history, tenant)
    # Even a client that echoes a derived id back as its header gets its own namespace.
    assert session_from_header(tenant, from_history.session).storage_key != (
        from_history.storage_key
    )


@pytest.mark.parametrize(
    "value",
    [
        "conversation-4711-with-a-long-readable-name",
        "../../etc/passwd",
        "tenant:h:injected",
        "ünïcödé-sëssïön",
        "x" * 5000,
    ],
)
def test_storage_key_never_contains_the_raw_header_value(value: str) -> None:
    key = session_from_header(tenant_of("Bearer sk-a"), value)
    assert value not in key.storage_key
    assert len(key.storage_key) < 200  # bounded, whatever the client sends
    assert key.log_id not in (value, key.storage_key)


def test_derived_key_is_stable_across_turns_once_past_the_opening() -> None:
    # Turn 1 has only system + first user message; from turn 2 on the opening
    # (system, first user message, first reply) is fixed and so is the key.
    keys = {derived(conversation("Plan my trip to Lisbon", turns)) for turns in range(1, 12)}
    assert len(keys) == 1


def test_derived_key_ignores_everything_after_the_opening() -> None:
    base = conversation("Plan my trip to Lisbon", 6)
    edited = [dict(m) for m in base]
    edited[-1]["content"] = "something else entirely"
    edited[5]["content"] = "a rewritten middle turn"
    assert derived(base) == derived(edited)  # type: ignore[arg-type]


def test_derived_key_skips_any_number_of_leading_system_messages() -> None:
    developer: ChatMessage = {"role": "developer", "content": "Prefer metric units."}
    opening: list[ChatMessage] = [SYSTEM, developer, {"role": "user", "content": "hi"}]
    keys = {
        derived([*opening, *conversation("hi", turns)[2:]])
        for turns in range(1, 6)  # the same conversation, growing
    }
    assert len(keys) == 1
    assert derived(conversation("hi", 3)) not in keys  # the developer message is part of it


def test_different_first_user_message_same_system_prompt_different_keys() -> None:
    first = derived(conversation("I am the first conversation", 4))
    second = derived(conversation("I am the second conversation", 4))
    assert first.storage_key != second.storage_key


def test_different_system_prompt_same_first_user_message_different_keys() -> None:
    other_system: ChatMessage = {"role": "system", "content": "You are a pirate."}
    assert derived(conversation("hello", 4)) != derived(conversation("hello", 4, other_system))


def test_different_first_reply_different_keys() -> None:
    one = conversation("tell me a joke", 3)
    two = [dict(m) for m in one]
    two[2]["content"] = "a different first reply"
    assert derived(one) != derived(two)  # type: ignore[arg-type]


def test_derived_key_never_contains_message_text() -> None:
    secret = "FACT launch_code=AXQ-77-ZETA"
    key = derived(conversation(secret, 3), tenant_of("Bearer sk-a"))
    assert "AXQ" not in key.storage_key
    assert "launch_code" not in key.storage_key


def test_log_id_is_short_and_distinct_per_session() -> None:
    tenant = tenant_of("Bearer sk-a")
    ids = {session_from_header(tenant, f"s{i}").log_id for i in range(200)}
    assert len(ids) == 200
    assert all(len(i) <= 16 for i in ids)


def test_a_storage_key_parses_back_to_its_session_key() -> None:
    tenant = tenant_of("Bearer sk-one")
    for key in (session_from_header(tenant, "s1"), derived(conversation("hi", 3), tenant)):
        assert SessionKey.from_storage_key(key.storage_key) == key
    assert SessionKey.from_storage_key("anonymous:h:abc") == SessionKey(
        "anonymous", "abc", "header"
    )


@pytest.mark.parametrize("value", ["", "a:b", "t:x:s", "t:h:", ":h:s", "t:h:s:extra"])
def test_strings_no_session_key_makes_do_not_parse(value: str) -> None:
    assert SessionKey.from_storage_key(value) is None


def _named(
    header: str | None, body: dict[str, object], fields: list[str], limit: int = 1024
) -> str | None:
    settings = SessionSettings(body_fields=fields, max_name_bytes=limit)  # type: ignore[arg-type]
    return session_name({} if header is None else {"X-Session-Id": header}, body, settings)


def test_the_header_names_the_session_before_any_body_field() -> None:
    body: dict[str, object] = {
        "prompt_cache_key": "pck",
        "user": "u",
        "metadata": {"session_id": "m"},
    }
    fields = ["metadata.session_id", "user"]
    assert _named("hdr", body, fields) == "hdr"
    assert _named(None, body, fields) == "pck"
    assert _named("", {**body, "prompt_cache_key": ""}, fields) == "m"
    assert _named(None, {"user": "u", "metadata": {"session_id": 3}}, fields) == "u"
    assert _named(None, {"user": "u", "metadata": "x"}, ["metadata.session_id"]) is None


def test_a_body_field_is_read_through_any_mapping_not_only_a_dict() -> None:
    """session_name reads a dict first (the ABC check is dearer), any Mapping still."""
    from types import MappingProxyType

    body: dict[str, object] = {"metadata": MappingProxyType({"session_id": "m"})}
    assert _named(None, body, ["metadata.session_id"]) == "m"
    assert _named(None, MappingProxyType({"user": "u"}), ["user"]) == "u"  # type: ignore[arg-type]


def test_body_fields_other_than_prompt_cache_key_need_configuring() -> None:
    assert _named(None, {"user": "u", "metadata": {"session_id": "m"}}, []) is None


@pytest.mark.parametrize(
    ("header", "body", "param"),
    [
        ("h" * 65, {}, "X-Session-Id"),
        ("\u00e9" * 33, {}, "X-Session-Id"),  # 33 characters, 66 bytes
        (None, {"prompt_cache_key": "p" * 65}, "prompt_cache_key"),
        (None, {"metadata": {"session_id": "m" * 65}}, "metadata.session_id"),
        (None, {"user": "u" * 65}, "user"),
    ],
)
def test_a_session_name_over_the_limit_is_refused_naming_its_field(
    header: str | None, body: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        _named(header, body, ["metadata.session_id", "user"], limit=64)
    assert refused.value.param == param
    assert refused.value.code == "string_above_max_length"
    # At the limit, and a longer field the request does not name its session by, pass.
    assert _named("h" * 64, {"user": "u" * 65}, [], limit=64) == "h" * 64


async def test_a_derived_session_of_a_big_body_is_hashed_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A header-less session's id hashes its opening messages, which can be most of a
    big body: that work must not stall the event loop."""
    import threading

    from proxy.compaction import count
    from proxy.core.models import ResolvedModel
    from proxy.core.outcome import Turn

    on_loop: list[bool] = []
    real = count.session_key

    def spy(*args: Any) -> SessionKey:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(count, "session_key", spy)
    model = ResolvedModel("m", 1_000_000, 256, "cl100k_base", "m")
    for size, expected in ((2_000_000, False), (2_000, True)):
        messages: list[ChatMessage] = [SYSTEM, {"role": "user", "content": "x" * size}]
        body = orjson.dumps({"model": "m", "messages": messages})
        turn = Turn({"model": "m", "messages": messages}, body, model, "t", None, [])
        assert await count.session_of(turn, messages) == derived(messages)
        assert on_loop[-1] is expected


CLAUDE_SESSION = "7f1c0a52-3b1e-4c4f-9d0e-2a4a3f6b8c11"


@pytest.mark.parametrize(
    "user_id",
    [
        f"user_{'ab' * 32}_account__session_{CLAUDE_SESSION}",
        f"user_{'ab' * 32}_account_0b6d3c1e-8f2a-4e7b-a1c9-5d4e3f2a1b0c_session_{CLAUDE_SESSION}",
        orjson.dumps({"device_id": "d", "account_uuid": "", "session_id": CLAUDE_SESSION}).decode(),
    ],
)
def test_claude_codes_session_id_names_the_session(user_id: str) -> None:
    """Claude Code names its session inside metadata.user_id: the older string form, and
    the JSON string of 2.1.78 and later."""
    body = {"metadata": {"user_id": user_id}, "user": "someone"}
    settings = SessionSettings(body_fields=["user"])
    assert session_name({}, body, settings) == CLAUDE_SESSION
    # The session header still comes first.
    assert session_name({settings.header: "h"}, body, settings) == "h"


@pytest.mark.parametrize(
    "user_id", ["someone", "user_x_session_", "{not json", '{"session_id": 3}', '["a"]', 5]
)
def test_other_user_ids_name_no_session(user_id: object) -> None:
    body = {"metadata": {"user_id": user_id}}
    assert session_name({}, body, SessionSettings()) is None
