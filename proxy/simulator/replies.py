"""Deterministic replies: a small language that makes compaction observable.

The reply depends only on the request (never on a clock or a random source).
Rules, first match wins:

1. Header ``X-Compaction-Purpose: summarize``: a summary that carries facts
   forward. Every ``FACT key=value`` in any message (later definitions win)
   becomes one ``FACT key=value`` line, sorted by key; the summary's first line
   counts the messages the proxy's framed transcript quotes (``read_transcript``,
   which reads the framing by its declared marker, as a model would), or, asked at
   the end of the conversation itself (no framing), the request's messages; the
   headings are the system message's, else the last message's. The model's
   ``summary_style`` decides the rest. ``ideal``: the facts after a header
   line and before a filler sentence that is cut to fit the budget; facts are
   never cut. ``realistic``: like a real model, prose first (a word per 40
   characters of the prompt), then ``## Critical values`` with the facts, cut word by
   word at the budget with ``finish_reason: "length"``; asked to be terse (the
   prompt says "tersely"), it keeps the prose to a quarter of the budget.
   ``summary_forgets: N`` leaves out every Nth fact, as a lossy model would.
   Both write the headings the system message lists (``## Name`` lines): ideal a
   few words under each, realistic its prose under the first and ``none`` under
   the rest. Weak models: ``echo`` copies its prompt (the previous-summary block's
   text, then the instructions) up to the budget; ``short`` writes one line and
   the bare headings; ``cut_off`` is realistic but always runs to the budget
   (``finish_reason: "length"``). ``plain`` keeps every fact but writes no heading
   at all, as a model that ignores the requested layout: a line of prose, each fact
   the prompt states in plain words (``stated_facts``) as ``key is value``, then
   filler cut to fit the budget. ``parrot`` repeats the quoted span's assistant
   turns, newest first, as a model that answers with its own replies.
2. Last message from a tool: ``observed <n> tool results`` (n trailing tool
   messages); but after the user's ``RECALL <key>``, the RECALL answer of rule 4, read
   from the whole request (tool results too), or, for a key still unknown, rule 4's
   search again.
3. Last message from the user, the request has ``tools`` and the text says
   ``CALL <n>``: n parallel calls to the first tool, arguments ``{"step": k}``; and,
   when it also asks rule 4's ``RECALL`` of a key the request does not state, rule 4's
   search beside them (a model calling tools in parallel).
4. Last message from the user containing ``RECALL <key>``: ``key=value`` for
   each key, space separated, or ``key=UNKNOWN``. The value is read as a reader
   of the prompt would find it: the last place anywhere in the request's messages
   that states the key's value in plain words (``key=value``, ``key = value``,
   ``key: value``, ``key is value``, ``key is now value``, ``key was set to
   value``; ``stated_value``), whoever wrote it and whatever frames it, and never
   by the proxy's own quoting format: a fact only a proxy's format holds is not
   recalled. A key the request does not state, when the request has a tool whose
   description says it searches the earlier conversation, is looked for as a model
   would: one call of that tool, ``{"query": "<the keys>"}``.
5. Otherwise ``ok:`` and about ``reply_tokens`` filler words picked by a hash
   of the request.

No tool is called under ``tool_choice: none`` (Messages: ``{"type": "none"}``).

A text reply to a request with a JSON ``response_format`` comes as JSON
valid against its schema, carrying the text (structured.py).

Text replies longer than the budget are cut word by word and end with
``finish_reason: "length"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.core.encodings import Encoder
from proxy.simulator.config import SummaryStyle
from proxy.simulator.counting import text_of
from proxy.simulator.structured import structured_text

FinishReason = Literal["stop", "length", "tool_calls"]

FACT = re.compile(
    r"(?:FACT |^- )([A-Za-z0-9_.-]+)=(\S+)"
    # a value the proxy restored, quoted with its source role: "- tool: `key=value`"
    r"|^- [a-z]+: `+ ?([A-Za-z0-9_.-]+)=([^\s`]+)",
    re.MULTILINE,
)
RECALL = re.compile(r"RECALL ([A-Za-z0-9_.-]+)")
# How prose states a key's value: "k=v", "k = v", "k: v", "k is v", "k is now v",
# "k was set to v", "k set to v". A value runs to whitespace, a quote or a bracket,
# its trailing punctuation left out.
_STATES = (
    r"(?:[ \t]*=[ \t]*|:[ \t]+"
    r"|[ \t]+(?:(?:is|was|are|were)(?:[ \t]+(?:now|still|set[ \t]+to|changed[ \t]+to))?"
    r"|(?:set|changed)[ \t]+to|now)[ \t]+)"
)
_STATED_VALUE = r"([^\s`'\"<>()\[\]{}]+)"
_KEY = r"[A-Za-z][A-Za-z0-9_.-]*"
# Any key's value, when no key is asked for (the plain summarizer's facts): one with
# a digit, as a fact's value is, not every "x is y" of the prose.
# A lookahead, so "note: k3 is v21x" states k3 too (and "note: k3" is no fact).
_ANY_STATED = re.compile(rf"(?<![\w.-])(?=({_KEY}){_STATES}{_STATED_VALUE})")
_TRAILING = ".,;:!?"
# What this simulator answers for a key it finds no value of: not a value.
_UNKNOWN = "UNKNOWN"
CALL = re.compile(r"(?<![A-Za-z])CALL (\d+)")
# A block of quoted data a message declares in words ("... the quote ends at [m end]"),
# as recall's excerpts open a user message: a model takes the message's instructions
# from its own words after it, not from what it quotes.
_QUOTE_END = re.compile(r"the quote ends at \[(\w+) end\]")
MAX_CALLS = 128

# Common English words, each a single cl100k token with its leading space, so a
# filler of n words costs about n tokens.
_WORD_TEXT = (
    "the model state data value time work plan code test note file list step part line "
    "page text word name user task goal case fact item node path rule form type mode view "
    "size rate cost load next last good fine clear ready small large quick early later "
    "again still often never always about after before under over with from into back "
    "down open close start end keep move turn show find make take give look"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Voice:
    """How a model writes: the tokenizer its lengths count in, its usual reply length
    (``reply_tokens``) and how it summarizes (``summary_style``, ``summary_forgets``)."""

    encoder: Encoder
    reply_tokens: int
    summary_style: SummaryStyle = "ideal"
    summary_forgets: int = 0


@dataclass(frozen=True, slots=True)
class Reply:
    content: str | None
    tool_calls: tuple[ToolCallOut, ...]
    finish_reason: FinishReason
    completion_tokens: int


def filler_words(seed: bytes, count: int) -> list[str]:
    """``count`` words chosen by a 64-bit LCG seeded from ``seed``: stable everywhere."""
    state = int.from_bytes(seed[:8], "little")
    words = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        words.append(WORDS[(state >> 33) % len(WORDS)])
    return words


def fit_words(head: str, words: list[str], budget: int, encoder: Encoder) -> tuple[str, bool]:
    """``head`` plus as many of ``words`` as fit in ``budget`` tokens; True if cut.

    ``head`` is kept even when it alone is over budget (summaries keep facts).
    """

    def join(n: int) -> str:
        tail = " ".join(words[:n])
        return f"{head} {tail}" if head and tail else head or tail

    if encoder.count(join(len(words))) <= budget:
        return join(len(words)), False
    lo, hi = 0, len(words) - 1  # the largest n that fits lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if encoder.count(join(mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return join(lo), True


def collect_facts(messages: list[dict[str, Any]]) -> dict[str, str]:
    facts: dict[str, str] = {}
    for message in messages:
        for match in FACT.finditer(text_of(message.get("content"))):
            key, value = match.group(1, 2) if match.group(1) else match.group(3, 4)
            facts[key] = value
    return facts


def stated_value(text: str, key: str) -> str | None:
    """The last value ``text`` states for ``key`` in plain words (``_STATES``); None
    if it states none."""
    pattern = re.compile(rf"(?<![\w.-]){re.escape(key)}(?![\w-]|\.\w){_STATES}{_STATED_VALUE}")
    found = None
    for match in pattern.finditer(text):
        value = match.group(1).rstrip(_TRAILING)
        if value and value not in (_UNKNOWN, "RECALL"):  # "k: RECALL k" asks, not states
            found = value
    return found


def stated_facts(text: str) -> dict[str, str]:
    """Every key ``text`` states a value with a digit for, in plain words, in order of
    first statement, the last value each."""
    found = list(_ANY_STATED.finditer(text))
    keys = {match.start(1) for match in found}
    facts: dict[str, str] = {}
    reach = -1  # where the last statement's value starts: a word before it is no key
    for match in found:
        value = match.group(2).rstrip(_TRAILING)
        inside = match.start(1) < reach
        reach = max(reach, match.start(2))
        if inside or match.start(2) in keys or not any(c.isdigit() for c in value):
            continue  # a word of a statement, a key stated in turn, or no value
        if value != _UNKNOWN:
            facts[match.group(1)] = value
    return facts


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """Everything a model reads of ``messages``, in order: each one's text."""
    return "\n".join(text_of(message.get("content")) for message in messages)


_MARKER = re.compile(r"uses the marker ([0-9a-f]+)")


def read_transcript(prompt: str) -> list[tuple[str, str]] | None:
    """The (role, text) of each message a summarizer prompt quotes, read as a model
    reads the proxy's framing: by the marker its opening sentence declares, never by
    tags or role labels inside the quoted text. None: the prompt is not framed so."""
    marker = _MARKER.search(prompt)
    if marker is None:
        return None
    b = re.escape(marker.group(1))
    block = re.search(rf"<new_turns_{b}>\n(.*)\n</new_turns_{b}>", prompt, re.S)
    if block is None:
        return []
    # [marker, header, text, header, text, ...]: a header line starts each message.
    parts = re.split(rf"(?m)^\[{b} ([a-z]+)[^\]\n]*\]\n?", block.group(1))
    return [(parts[i], parts[i + 1].removesuffix("\n")) for i in range(1, len(parts) - 1, 2)]


def _text_reply(text: str, budget: int, encoder: Encoder) -> Reply:
    content, cut = fit_words("", text.split(" "), budget, encoder)
    return Reply(content, (), "length" if cut else "stop", encoder.count(content))


_ASKED = re.compile(r"(?m)^## (.+?)[ \t]*$")
_CRITICAL = "Critical values"


def _asked_sections(messages: list[dict[str, Any]]) -> list[str]:
    """The headings the summarizer's instructions list: its system message's, else (a
    summary asked at the end of the conversation itself) its last message's."""
    first = messages[0] if messages else {}
    if first.get("role") in ("system", "developer"):
        asked = _ASKED.findall(text_of(first.get("content")))
        if asked:
            return asked
    return _ASKED.findall(text_of(messages[-1].get("content"))) if messages else []


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a summary request asks a summary of: its last message's text (``prompt``),
    the (role, text) of the messages summarized and how many the first line counts, their
    text, and the instructions (what an echo copies)."""

    prompt: str
    quoted: list[tuple[str, str]]
    count: int
    read: str
    instructions: str


def _asked(messages: list[dict[str, Any]]) -> _Asked:
    """The messages the framed transcript quotes (the proxy's prompt) under the system
    message's instructions; else, asked at the end of the conversation itself, the
    request's messages before the last, which holds the instructions."""
    prompt = text_of(messages[-1].get("content"))
    quoted = read_transcript(prompt)
    if quoted is not None:
        opening = messages[0] if messages[0].get("role") != "user" else {}
        return _Asked(prompt, quoted, len(quoted), prompt, text_of(opening.get("content")))
    own = [(str(m.get("role")), text_of(m.get("content"))) for m in messages[:-1]]
    return _Asked(prompt, own, len(messages), prompt_text(messages[:-1]), prompt)


def _summary(messages: list[dict[str, Any]], seed: bytes, budget: int, voice: Voice) -> Reply:
    encoder = voice.encoder
    facts = collect_facts(messages)
    keys = sorted(facts)
    asked = _asked(messages)
    prompt, count, read = asked.prompt, asked.count, asked.read
    sections = _asked_sections(messages)
    if voice.summary_style == "echo":
        return _echo(asked.instructions, prompt, budget, encoder)
    if voice.summary_style == "parrot":
        return _parrot(asked.quoted, budget, encoder)
    if voice.summary_style == "short":
        content = "\n".join([f"SUMMARY of {count} messages.", *(f"## {s}" for s in sections)])
        return Reply(content, (), "stop", encoder.count(content))
    if voice.summary_style == "plain":
        said = [m for m in messages if m.get("role") not in ("system", "developer")]
        return _plain(prompt_text(said), count, seed, budget, voice)
    if voice.summary_forgets:
        keys = [k for i, k in enumerate(keys) if (i + 1) % voice.summary_forgets]
    fact_lines = [f"FACT {key}={facts[key]}" for key in keys]
    header = f"SUMMARY of {count} messages, {len(keys)} facts carried forward."
    others = [s for s in sections if s != _CRITICAL]
    if voice.summary_style in ("realistic", "cut_off"):
        # About a word of prose per 40 characters summarized; a quarter of the budget
        # when asked to be terse; cut_off: always more than the budget.
        prose = max(len(read) // 40, 8) if "tersely" not in prompt else max(budget // 4, 1)
        if voice.summary_style == "cut_off":
            prose = budget + 16
        first = [f"\n## {others[0]}\n"] if others else []
        rest = [f"\n## {s}\nnone" for s in others[1:]]
        words = [header, *first, *filler_words(seed, prose), *rest, f"\n## {_CRITICAL}\n"]
        content, cut = fit_words("", [*words, *fact_lines], budget, encoder)
        return Reply(content, (), "length" if cut else "stop", encoder.count(content))
    # A few words under each asked heading, the facts under Critical values.
    notes = filler_words(seed[::-1], 3 * len(others))
    body = [f"## {s}\n{' '.join(notes[3 * i : 3 * i + 3])}" for i, s in enumerate(others)]
    if sections:
        body.append(f"## {_CRITICAL}")
    head = "\n".join([header, *body, *fact_lines]) + "\nContext:"
    content, _ = fit_words(head, filler_words(seed, voice.reply_tokens), budget, encoder)
    # Cutting filler is not a truncated summary: the facts are all there.
    return Reply(content, (), "stop", encoder.count(content))


def _plain(said: str, count: int, seed: bytes, budget: int, voice: Voice) -> Reply:
    """A summary that keeps every fact ``said`` (the request's text but its
    instructions) states and writes no heading: prose only, the facts never cut, the
    filler after them cut to fit."""
    facts = stated_facts(said)
    if voice.summary_forgets:
        facts = {k: v for i, (k, v) in enumerate(facts.items()) if (i + 1) % voice.summary_forgets}
    stated = "; ".join(f"{key} is {value}" for key, value in facts.items())
    head = f"The conversation so far covered {count} messages."
    if stated:
        head += f" Along the way it was settled that {stated}."
    words = filler_words(seed, voice.reply_tokens)
    content, _ = fit_words(f"{head} They also spoke of", words, budget, voice.encoder)
    return Reply(content, (), "stop", voice.encoder.count(content))


def _echo(instructions: str, prompt: str, budget: int, encoder: Encoder) -> Reply:
    """What a weak model writes when it copies its prompt: the previous-summary block's
    text (a placeholder there, once), then the ``instructions`` (the system message's;
    asked at the end of the conversation, the last message's), up to the budget."""
    previous = re.search(r"<previous_summary_(\w+)>\n(.*?)\n</previous_summary_\1>", prompt, re.S)
    parts = [previous.group(2)] if previous else []
    parts.append(instructions)
    content, _ = fit_words("", "\n".join(parts).split(" "), budget, encoder)
    return Reply(content, (), "stop", encoder.count(content))


def _parrot(quoted: list[tuple[str, str]], budget: int, encoder: Encoder) -> Reply:
    """What a weak model writes when it repeats its own replies instead of summarizing:
    the quoted span's assistant turns, newest first, up to the budget."""
    said = [text for role, text in reversed(quoted) if role == "assistant"]
    content, _ = fit_words("", "\n".join(said).split(" "), budget, encoder)
    return Reply(content, (), "stop", encoder.count(content))


def _tool_calls(tools: list[Any], count: int, seed: bytes, encoder: Encoder) -> Reply | None:
    first = tools[0] if tools and isinstance(tools[0], dict) else {}
    fn = first.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        return None
    tag = seed.hex()[:12]
    calls = tuple(
        ToolCallOut(f"call_{tag}_{k}", name, orjson.dumps({"step": k}).decode())
        for k in range(1, min(count, MAX_CALLS) + 1)
    )
    tokens = sum(encoder.count(c.name) + encoder.count(c.arguments) for c in calls)
    return Reply(None, calls, "tool_calls", tokens)


def _search_tool(body: dict[str, Any]) -> str | None:
    """The name of the request's tool that searches the earlier conversation (by its
    description, as a model picks one), when it may call tools at all."""
    choice = body.get("tool_choice")
    if choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none"):
        return None
    for tool in body.get("tools") or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        about = str(fn.get("description") or "").lower()
        if "earlier" in about and "conversation" in about:
            return str(fn["name"])
    return None


def _recall(
    body: dict[str, Any],
    messages: list[dict[str, Any]],
    keys: list[str],
    ask: Ask,
    encoder: Encoder,
) -> Reply:
    """The RECALL answer from every fact in the request, or a search for the keys it
    does not state when the request has a tool for that."""
    seed, budget = ask.seed, ask.budget
    read = prompt_text(messages)
    facts = {key: value for key in keys if (value := stated_value(read, key)) is not None}
    missing = [key for key in keys if key not in facts]
    tool = _search_tool(body) if missing else None
    if tool is not None:
        arguments = orjson.dumps({"query": " ".join(missing)}).decode()
        call = ToolCallOut(f"call_{seed.hex()[:12]}_recall", tool, arguments)
        tokens = encoder.count(call.name) + encoder.count(arguments)
        return Reply(None, (call,), "tool_calls", tokens)
    answer = " ".join(f"{key}={facts.get(key, _UNKNOWN)}" for key in keys)
    return _text_reply(answer, budget, encoder)


@dataclass(frozen=True, slots=True)
class Ask:
    """What one request asks for: a summary or a reply (``summarize``), in at most
    ``budget`` tokens; ``seed`` is a digest of the request."""

    seed: bytes
    budget: int
    summarize: bool = False


def build_reply(
    body: dict[str, Any], messages: list[dict[str, Any]], ask: Ask, voice: Voice
) -> Reply:
    """The reply to a validated chat request. Asked for JSON (``response_format``), a
    text reply comes as JSON carrying it."""
    seed, budget = ask.seed, ask.budget
    if ask.summarize:
        return _summary(messages, seed, budget, voice)
    reply = _reply(body, messages, seed, budget, voice)
    if reply.content is None:
        return reply
    structured = structured_text(body.get("response_format"), reply.content)
    if structured is None:
        return reply
    return Reply(structured, (), "stop", voice.encoder.count(structured))


def own_words(text: str) -> str:
    """A message's own words: what follows a block of quoted data it declares."""
    declared = _QUOTE_END.search(text)
    if declared is None:
        return text
    end = f"[{declared.group(1)} end]"
    at = text.rfind(end)
    return text[at + len(end) :] if at >= 0 else text


def _reply(
    body: dict[str, Any], messages: list[dict[str, Any]], seed: bytes, budget: int, voice: Voice
) -> Reply:
    encoder = voice.encoder
    last = messages[-1]
    role = last["role"]
    if role in ("tool", "function"):
        trailing = 0
        for message in reversed(messages):
            if message["role"] not in ("tool", "function"):
                break
            trailing += 1
        asked = next((m for m in reversed(messages) if m["role"] == "user"), None)
        keys = RECALL.findall(own_words(text_of(asked.get("content")))) if asked else []
        if keys:  # the results of a search for what the user asked
            return _recall(body, messages, keys, Ask(seed, budget), encoder)
        return _text_reply(f"observed {trailing} tool results", budget, encoder)
    if role == "user":
        text = own_words(text_of(last.get("content")))
        tools = body.get("tools")
        allowed = body.get("tool_choice") not in ("none", {"type": "none"})
        call = CALL.search(text) if tools and allowed else None
        if call and int(call.group(1)) >= 1 and isinstance(tools, list):
            reply = _tool_calls(tools, int(call.group(1)), seed, encoder)
            keys = RECALL.findall(text)
            search = _recall(body, messages, keys, Ask(seed, budget), encoder) if keys else None
            if reply is not None and search is not None and search.tool_calls:
                both = (*reply.tool_calls, *search.tool_calls)
                tokens = reply.completion_tokens + search.completion_tokens
                return Reply(None, both, "tool_calls", tokens)
            if reply is not None:
                return reply
        keys = RECALL.findall(text)
        if keys:
            return _recall(body, messages, keys, Ask(seed, budget), encoder)
    # "ok:" costs two tokens; the words one each.
    words = filler_words(seed, max(voice.reply_tokens - 2, 1))
    content, cut = fit_words("ok:", words, budget, encoder)
    if encoder.count(content) > budget:  # a budget below even "ok:"
        return _text_reply("ok:", budget, encoder)
    return Reply(content, (), "length" if cut else "stop", encoder.count(content))
