"""Step 3: which session a request belongs to, scoped by tenant.

The tenant is a keyed hash of the caller's credential (tenant_ids.py), so the store
never holds a key and one tenant can never name another's session (DESIGN
invariant 6). With no session header, the id is derived from the
conversation's opening messages (system prompt, first user message and the
first reply), so unmodified clients still get compaction while two
conversations that merely share a system prompt get different sessions.
Conversations whose openings are identical too (a temperature-0 agent with a
fixed kickoff) share the derived id but not a snapshot: the id names a few
slots (``derived_slots``) and each conversation uses the one whose snapshot it
still starts with (snapshots.py). A named session has slots too
(``explicit_slots``): clients run several conversations under one name, and a
client that rewinds finds an older snapshot its history still starts with.

Clients that cannot set headers name the session in the body instead:
``prompt_cache_key`` (both OpenAI APIs), Claude Code's session id inside
``metadata.user_id`` (``user_<hash>_account_<uuid>_session_<uuid>``, or since Claude Code
2.1.78 a JSON string with a ``session_id``), and the fields ``session.body_fields`` lists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Literal

import orjson

from proxy.config import SessionSettings
from proxy.core.digest import legacy_digests

# Re-exported: the tenant is where a session key starts, and callers read it here.
from proxy.core.tenant_ids import ANONYMOUS as ANONYMOUS
from proxy.core.tenant_ids import tenant_from_headers as tenant_from_headers
from proxy.core.tenant_ids import tenant_of as tenant_of
from proxy.errors import check_length
from proxy.types import ChatMessage

_LEADING = frozenset({"system", "developer"})
# Opening messages after the system prompt that identify a header-less conversation.
_DERIVE_FROM = 2
_SOURCES: dict[str, Literal["header", "derived"]] = {"h": "header", "d": "derived"}
# Most sessions a replica's session memory tracks (compaction/memory.py), and the bound
# of other per-session tables. Keys are SessionKeys, two fixed-size hashes: bounded in
# bytes too.
TRACKED_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class SessionKey:
    tenant: str
    session: str
    source: Literal["header", "derived"]
    # Shadow mode's snapshots (compaction/shadow.py), filed apart: never the live path's.
    shadow: bool = False

    @property
    def storage_key(self) -> str:
        """The one string a store files this session under: ``{tenant}:{h|d}:{session}``."""
        return f"{self.tenant}:{self.source[0]}:{self.session}"

    @classmethod
    def from_storage_key(cls, value: str) -> SessionKey | None:
        """The key ``storage_key`` made ``value`` from; None for anything else."""
        parts = value.split(":")
        if len(parts) != 3 or not parts[0] or not parts[2] or parts[1] not in _SOURCES:
            return None
        return cls(parts[0], parts[2], _SOURCES[parts[1]])

    @property
    def log_id(self) -> str:
        """Short, non-reversible id for logs."""
        return blake2b(self.storage_key.encode(), digest_size=6).hexdigest()


def session_from_header(tenant: str, value: str) -> SessionKey:
    # Hashing bounds the key's length and keeps arbitrary client bytes out of store keys.
    return SessionKey(tenant, blake2b(value.encode(), digest_size=16).hexdigest(), "header")


def session_from_history(tenant: str, messages: Sequence[ChatMessage]) -> SessionKey:
    # BLAKE2b digests, as before snapshot format 2: a derived id is where a session's
    # snapshot is stored, so an upgrade must not move it (digest.py).
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in _LEADING:
        lead += 1
    h = blake2b(digest_size=16)
    for d in legacy_digests(messages[: lead + _DERIVE_FROM]):
        h.update(d)
    return SessionKey(tenant, h.hexdigest(), "derived")


def session_name(
    headers: Mapping[str, str], body: Mapping[str, object], settings: SessionSettings
) -> str | None:
    """The session the client names: the session header, else ``prompt_cache_key``,
    else the first of ``settings.body_fields`` (``user``, or ``metadata.session_id``) the
    body sets. A name longer than ``settings.max_name_bytes`` gets a 400 naming where it
    came from: a request keeps its name (its record, a log line)."""
    limit = settings.max_name_bytes
    given = headers.get(settings.header)
    if given:
        check_length(given, limit, settings.header)
        return given
    # No metadata (most requests): no Claude Code session, and no look for one.
    claude = None if body.get("metadata") is None else claude_code_session(body)
    if claude is not None:
        check_length(claude, limit, "metadata.user_id")
        return claude
    for path in _KEY if not settings.body_fields else (*_KEY, *settings.body_fields):
        value: object = body
        for part in path.split(".") if "." in path else (path,):
            # A dict first: ``isinstance`` against the ABC costs more than the rest of a look.
            value = value.get(part) if type(value) is dict or isinstance(value, Mapping) else None
        if isinstance(value, str) and value:
            check_length(value, limit, path)
            return value
    return None


_KEY = ("prompt_cache_key",)  # always honoured, before ``session.body_fields``
_CLAUDE_USER_ID = re.compile(r"^user_[0-9a-f]*_account_[0-9a-f-]*_session_([0-9a-f-]+)$")


def claude_code_session(body: Mapping[str, object]) -> str | None:
    """The session id Claude Code puts in ``metadata.user_id``: after ``_session_`` in
    its older form, under ``session_id`` in the JSON string of 2.1.78 and later."""
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        found = parsed.get("session_id") if isinstance(parsed, dict) else None
        return found if isinstance(found, str) and found else None
    matched = _CLAUDE_USER_ID.match(user_id)
    return None if matched is None else matched.group(1)


def session_slots(key: SessionKey, count: int) -> list[SessionKey]:
    """The ``count`` keys under which conversations sharing ``key``'s session (its name, or
    its derived id) keep their own snapshots: the session's own key first, so a session's
    snapshot stays where it was. ``key`` may be any of them."""
    base = slot_base(key)
    extra = (SessionKey(base.tenant, f"{base.session}-{i}", base.source) for i in range(1, count))
    return [base, *extra]


def slot_base(key: SessionKey) -> SessionKey:
    """The session whose slot ``key`` is (``key`` itself for its first slot): a session
    id is a hex digest, so a slot's suffix is the only dash in it."""
    session = key.session.partition("-")[0]
    return key if session == key.session else SessionKey(key.tenant, session, key.source)


def slot_count(key: SessionKey, settings: SessionSettings) -> int:
    """How many snapshots ``key``'s session keeps: ``session.explicit_slots`` for a named
    session, ``session.derived_slots`` for a derived one."""
    return settings.explicit_slots if key.source == "header" else settings.derived_slots


def session_key(tenant: str, header: str | None, messages: Sequence[ChatMessage]) -> SessionKey:
    """The session named by the session header, else the one derived from the history."""
    if header:
        return session_from_header(tenant, header)
    return session_from_history(tenant, messages)
