"""The deterministic identifier check that runs after every summary."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.identifiers import restore_identifiers
from proxy.core.wording import CARRIED_HEADING
from tests.support.twins import find_identifiers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FACT color=teal now", "color=teal"),
        ("set PORT=8080, then", "PORT=8080"),
        ("see https://example.com/docs/a?b=1.", "https://example.com/docs/a?b=1"),
        ("edit src/app/main.py next", "src/app/main.py"),
        ("run ./run.sh", "./run.sh"),
        ("in /etc/nginx/nginx.conf:", "/etc/nginx/nginx.conf"),
        ("tool call_8f3a2c answered", "call_8f3a2c"),
        ("ticket JIRA-4711 is open", "JIRA-4711"),
        ("uuid 123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-426614174000"),
        ("commit 3f2a9c1d landed", "3f2a9c1d"),
        ("rustc says E0425", "E0425"),
        ("got ECONNREFUSED", "ECONNREFUSED"),
        ("ERR_SSL_PROTOCOL again", "ERR_SSL_PROTOCOL"),
        (
            'it printed "Error: connection refused by upstream" twice',
            "Error: connection refused by upstream",
        ),
        ("the log said `TimeoutError: read timed out`", "TimeoutError: read timed out"),
    ],
)
def test_identifiers_are_found(text: str, expected: str) -> None:
    assert expected in find_identifiers(text)


@pytest.mark.parametrize(
    "text",
    [
        "plain words only, nothing to keep here",
        "python3 and gpt-4o are names, not ids",
        "version 1.2.3 on 2024-01-01",
        "snake_case_name is a word",
        '"a quote without the magic word"',
    ],
)
def test_ordinary_text_has_no_identifiers(text: str) -> None:
    assert find_identifiers(text) == []


def test_lost_identifiers_are_restored_verbatim_and_counted() -> None:
    sources = [
        ("summary", "## Critical values\nFACT color=teal"),
        ("user", "open JIRA-4711 in src/a/b.py"),
    ]
    result = restore_identifiers("## Goal\nFix the bug in src/a/b.py.", sources, 1000)
    assert result.restored == 2
    assert result.dropped == 0
    carried = result.summary.split(CARRIED_HEADING, 1)[1]
    assert "- summary: `color=teal`" in carried
    # An id without a label brings a few words of its sentence.
    assert "- user: `JIRA-4711` (from `open JIRA-4711 in src/a/b.py`)" in carried
    assert "- user: `src/a/b.py`" not in carried  # the summary kept it itself


def test_nothing_is_appended_when_nothing_was_lost() -> None:
    result = restore_identifiers(
        "keeps color=teal and JIRA-4711", [("user", "color=teal JIRA-4711")], 1000
    )
    assert (result.summary, result.restored) == ("keeps color=teal and JIRA-4711", 0)


def test_the_bound_drops_the_least_recently_used_first() -> None:
    old = " ".join(f"old_{i}=value{i}" for i in range(20))
    new = " ".join(f"new_{i}=value{i}" for i in range(5))
    result = restore_identifiers("summary", [("user", old), ("tool", new)], 200)
    assert result.dropped > 0
    assert result.restored + result.dropped == 25
    assert len(result.summary) - len("summary") <= 200 + 2
    for i in range(5):  # the most recently used all survive
        assert f"new_{i}=value{i}" in result.summary
    assert "old_0=value0" not in result.summary


def test_a_carried_section_is_extended_never_nested() -> None:
    first = restore_identifiers("summary", [("tool", "FACT a=1")], 500).summary
    # The model copied the previous carried section at the end of its new summary.
    second = restore_identifiers(first, [("summary", first), ("user", "FACT b=2")], 500).summary
    assert second.count(CARRIED_HEADING) == 1
    assert "- tool: `a=1`" in second  # its source role survives the next compaction
    assert "- user: `b=2`" in second


@pytest.mark.parametrize(
    ("text", "kept", "never"),
    [
        ("DB_PASSWORD=hunter2 and PORT=8080", "PORT=8080", "hunter2"),
        ("AWS_SECRET_ACCESS_KEY=abc123xyz9", None, "abc123xyz9"),
        ("api_key=sk-live-123456", None, "sk-live-123456"),
        (
            "see https://user:pw@example.com/a?x=1",
            "https://example.com/a?x=1",
            "user:pw",
        ),
        (
            "https://example.com/dl?token=s3cr3t99&id=7",
            "https://example.com/dl",
            "s3cr3t99",
        ),
    ],
)
def test_secrets_are_never_carried_forward(text: str, kept: str | None, never: str) -> None:
    found = find_identifiers(text)
    assert all(never not in value for value in found), found
    if kept is not None:
        assert kept in found
    restored = restore_identifiers("summary", [("user", text)], 1000).summary
    assert never not in restored


def test_scanning_a_huge_span_comes_up_for_air_between_bounded_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python's re holds the GIL for a whole call: a scan of megabytes in one call would
    stall the event loop's thread. Every regex call gets a bounded slice, and the scan
    yields the GIL after each one."""
    import types

    import proxy.core.values as ids  # the one scan, for the identifier check and the digest

    events: list[int | str] = []
    rules = ids._RULES

    class Spy:
        def finditer(self, text: str) -> Any:
            events.append(len(text))
            return rules.finditer(text)

    monkeypatch.setattr(ids, "_RULES", Spy())
    monkeypatch.setattr(ids, "time", types.SimpleNamespace(sleep=lambda _: events.append("y")))
    text = "plain words and a path /srv/app/main.py and nothing else " * 100_000  # ~5.7 MB
    found = find_identifiers(text)
    assert found == ["/srv/app/main.py"]
    calls = [e for e in events if isinstance(e, int)]
    assert len(calls) > 10
    assert max(calls) <= ids.SLICE_CHARS
    # each regex call is followed by a yield before the next one
    assert events == [x for n in calls for x in (n, "y")]
