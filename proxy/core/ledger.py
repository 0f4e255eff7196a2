"""Does compaction pay? The ledger's arithmetic, pure: one request's entry, its sums, money.

One request's ``Entry``, in the upstream's tokens (its usage is the truth):

* ``would_send``: the input tokens the client's history, as it sent it, would have cost:
  the upstream's own count when the history went as sent; else the proxy's count of that
  history calibrated: times the upstream's tokens per one of the proxy's in this
  tenant's earlier histories sent whole to the model (``learn_ratio``; a view's count
  holds the summary's estimate, so views teach it nothing);
* ``sent``: the input tokens the upstream counted (``prompt_tokens``/``input_tokens``;
  Anthropic's Messages ``input_tokens`` + ``cache_read_input_tokens`` +
  ``cache_creation_input_tokens``, which it counts apart);
* ``cached``: of those, the ones it served from its prompt cache (``cached_tokens``,
  Anthropic's ``cache_read_input_tokens``);
* ``would_cached``: of ``would_send``, the ones the history as sent would have had
  cached: ``cached`` itself when the history went as sent, else an estimate, the
  session's previous ``would_send`` under OpenAI's caching rule (``cacheable``);
* ``summarizer_input``, ``summarizer_output``: the summarizer's usage, every call;
  ``summarizer_cached``: of its input, what the provider's cache served (a summary asked
  as the turn's own request reads it: compaction/summary_prefix.py);
* ``written_5m``, ``written_1h``: of ``sent``, what the provider's cache wrote, by tier
  (Anthropic's ``usage.cache_creation``; a provider that reports no writes, none);
  ``would_written``: of ``would_send``, what the history as sent would have written
  (itself when it went as sent; else, where the request wrote at all, what it would not
  have read);
* ``estimated``: some figure is the proxy's own count, not the upstream's: no usage in
  the answer (a stream without ``include_usage``, an error), or a summarizer's answer
  without usage (its input then sized at 4 bytes a token, its output likewise).

``net`` = would_send - sent - summarizer_input - summarizer_output. With a price
(USD per million tokens, core/prices.py) the money saved is what ``would_send`` would
have cost (``would_cached`` at the cached price, ``would_written`` at the write price)
less what was paid: ``sent`` (``cached`` at the cached price, the writes at their
tier's) and the summarizer's input and output at its model's price (its cached input at
the cached price).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from proxy.core.cache_outcome import CacheOutcome, Cause

# OpenAI's prompt caching: prompts of 1024 tokens or more, hits in steps of 128 tokens.
CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128
_ESTIMATE_BYTES_PER_TOKEN = 4
_MIN_RATIO_TOKENS = 256  # below, fixed overheads dominate the ratio
_CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens)"\s*:\s*(\d{1,9})')
# Anthropic's prompt tokens besides ``input_tokens``: what its cache read and wrote.
_CACHE_IN = [
    re.compile(rb'"cache_' + k + rb'_input_tokens"\s*:\s*(\d{1,9})') for k in (b"read", b"creation")
]
# Anthropic's writes by tier (``usage.cache_creation``), and their sum.
_WRITES = [
    re.compile(rb'"ephemeral_' + k + rb'_input_tokens"\s*:\s*(\d{1,9})') for k in (b"5m", b"1h")
]
_IN = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d{1,9})')
_OUT = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d{1,9})')


def find_cached_tokens(chunk: bytes) -> int | None:
    """The cached prompt tokens in an answer's bytes (``cached_tokens`` of chat's
    ``prompt_tokens_details`` or the Responses API's ``input_tokens_details``; the
    Messages API's ``cache_read_input_tokens``), by a byte scan as calibrate.py's."""
    if b"cached_tokens" not in chunk and b"cache_read_input_tokens" not in chunk:
        return None
    m = _CACHED.search(chunk)
    return int(m.group(1)) if m else None


def find_cache_writes(chunk: bytes) -> tuple[int, int] | None:
    """What an answer's bytes say the provider's cache wrote, by tier (5 minutes, an
    hour): Anthropic's ``cache_creation`` object, else its ``cache_creation_input_tokens``
    (an older answer, all at 5 minutes); None: the answer says nothing of writes."""
    if b"cache_creation" not in chunk:
        return None
    short, long = (pattern.search(chunk) for pattern in _WRITES)
    if short or long:
        return (int(short.group(1)) if short else 0, int(long.group(1)) if long else 0)
    total = _CACHE_IN[1].search(chunk)
    return None if total is None else (int(total.group(1)), 0)


def summarizer_usage(raw: bytes, sent: bytes) -> tuple[int, int, bool]:
    """A summarizer answer's input and output tokens (any API's usage: the Messages API's
    input with what its cache read and wrote), and whether they are estimated (no
    usage: the request ``sent`` and the answer sized by bytes)."""
    found_in, found_out = _IN.search(raw), _OUT.search(raw)
    if found_in and found_out:
        cache = (pattern.search(raw) for pattern in _CACHE_IN)
        given = int(found_in.group(1)) + sum(int(m.group(1)) for m in cache if m)
        return given, int(found_out.group(1)), False
    return len(sent) // _ESTIMATE_BYTES_PER_TOKEN, len(raw) // _ESTIMATE_BYTES_PER_TOKEN, True


def summarizer_cached(raw: bytes) -> int:
    """What a summarizer answer's usage says its cache served of the input (0: none)."""
    return find_cached_tokens(raw) or 0


def learn_ratio(old: float | None, ours: int, theirs: int) -> float | None:
    """The calibration ratio after the upstream counted ``theirs`` tokens of a history the
    proxy counted at ``ours``: a moving average, as upstream/calibrate.py's (None: none
    learned; a history under 256 tokens teaches nothing)."""
    if ours < _MIN_RATIO_TOKENS or theirs <= 0:
        return old
    ratio = min(max(theirs / ours, 0.5), 2.0)
    return ratio if old is None else old + 0.2 * (ratio - old)


def cacheable(tokens: int) -> int:
    """What OpenAI would cache of a ``tokens``-token repeated prefix."""
    return 0 if tokens < CACHE_MIN_TOKENS else tokens - tokens % CACHE_STEP_TOKENS


# An entry's fields, in ``Entry``'s order, as a plain tuple: what a request's step in the
# ledger builds (observe/ledger.py). A frozen dataclass of seven fields costs ~0.75 µs to
# build (a call of ``object.__setattr__`` per field), a tuple ~0.05.
Figures = tuple[int, int, int, int, int, int, bool, int, int, int, int]
NOTHING: Figures = (0, 0, 0, 0, 0, 0, False, 0, 0, 0, 0)
# What the ledger hands a request's line: its figures, its money saved (None: unpriced)
# and its cache outcome with who made a prefix change (None: not counted).
Ledgered = tuple[Figures, float | None, tuple[CacheOutcome, Cause] | None]


@dataclass(frozen=True, slots=True)
class Entry:
    """One request's figures, or the sum of many (a session's, a tenant's)."""

    would_send: int = 0
    sent: int = 0
    cached: int = 0
    would_cached: int = 0
    summarizer_input: int = 0
    summarizer_output: int = 0
    estimated: bool = False
    written_5m: int = 0
    written_1h: int = 0
    would_written: int = 0
    summarizer_cached: int = 0

    @property
    def net(self) -> int:
        return self.would_send - self.sent - self.summarizer_input - self.summarizer_output

    @property
    def figures(self) -> Figures:
        """Its fields, in order, as a plain tuple."""
        return (
            self.would_send,
            self.sent,
            self.cached,
            self.would_cached,
            self.summarizer_input,
            self.summarizer_output,
            self.estimated,
            self.written_5m,
            self.written_1h,
            self.would_written,
            self.summarizer_cached,
        )

    def plus(self, other: Entry) -> Entry:
        return Entry(
            self.would_send + other.would_send,
            self.sent + other.sent,
            self.cached + other.cached,
            self.would_cached + other.would_cached,
            self.summarizer_input + other.summarizer_input,
            self.summarizer_output + other.summarizer_output,
            self.estimated or other.estimated,
            self.written_5m + other.written_5m,
            self.written_1h + other.written_1h,
            self.would_written + other.would_written,
            self.summarizer_cached + other.summarizer_cached,
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _ENTRY_FIELDS}
        out["net"] = self.net
        return out


# Entry's field names, in order: ``fields()`` walks the class on every call (once a request).
_ENTRY_FIELDS = tuple(f.name for f in fields(Entry))


@dataclass(frozen=True, slots=True)
class Counted:
    """What the proxy knows of one request: its counts (None: not counted), and the
    upstream's usage for it (None: the answer carried none)."""

    history: int | None  # the proxy's count of the history as the client sent it
    view: int  # the proxy's count (or estimate) of the view sent
    as_sent: bool  # the view is the history as sent
    usage: tuple[int, int] | None  # the upstream's input tokens, and of them cached
    ratio: float = 1.0  # the upstream's tokens per one of the proxy's (calibration)
    writes: tuple[int, int] = (0, 0)  # of them, what its cache wrote: 5 minutes', an hour's
    cold: bool = False  # the cache was cold anyway (a first request, an expiry)


def entry_for(counted: Counted, previous_would_send: int) -> Entry:
    """The request's entry (summarizer tokens apart); ``previous_would_send``: the
    session's previous request's, 0 for none."""
    return Entry(*figures_for(counted, previous_would_send))


def figures_for(counted: Counted, previous_would_send: int) -> Figures:
    """``entry_for``'s figures, as a plain tuple."""
    if counted.as_sent and counted.usage is not None:
        return sent_whole(counted.usage, counted.writes)
    history = counted.view if counted.history is None else counted.history
    would = round(history * counted.ratio)
    would_cached = 0 if counted.cold else cacheable(min(previous_would_send, would))
    if counted.usage is None:
        would_cached = 0 if counted.as_sent else would_cached
        view = round(counted.view * counted.ratio)
        return (would, view, 0, would_cached, 0, 0, True, 0, 0, 0, 0)
    (sent, cached), (short, long) = counted.usage, counted.writes
    would_written = would - would_cached if short or long else 0
    return (would, sent, cached, would_cached, 0, 0, False, short, long, would_written, 0)


def sent_whole(usage: tuple[int, int], writes: tuple[int, int] = (0, 0)) -> Figures:
    """The figures of a history sent as it came, with the upstream's usage (input tokens,
    of them cached, and written by tier): its count is the truth, what would have been
    sent is what was."""
    sent, cached = usage
    short, long = writes
    return (sent, sent, cached, cached, 0, 0, False, short, long, short + long, 0)


def with_summaries(entry: Entry, summarized: tuple[int, int, bool], cached: int = 0) -> Entry:
    """``entry`` with the summarizer tokens (input, output, estimated; of the input,
    ``cached`` served by the cache) added."""
    given, written, estimated = summarized
    if not (given or written or estimated):  # most requests: no summary, the same entry
        return entry
    return Entry(*summed(entry.figures, summarized, cached))


def summed(figures: Figures, summarized: tuple[int, int, bool], cached: int = 0) -> Figures:
    """``with_summaries``' figures, as a plain tuple."""
    given, written, estimated = summarized
    if not (given or written or estimated):  # most requests: no summary, the same figures
        return figures
    would, sent, cached_sent, would_cached, given_before, written_before, was = figures[:7]
    short, long, would_written, cached_before = figures[7:]
    return (
        would,
        sent,
        cached_sent,
        would_cached,
        given_before + given,
        written_before + written,
        was or estimated,
        short,
        long,
        would_written,
        cached_before + cached,
    )


def net(figures: Figures) -> int:
    """``Entry.net`` of an entry's figures."""
    return figures[0] - figures[1] - figures[4] - figures[5]
