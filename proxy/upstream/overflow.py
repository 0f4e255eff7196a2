"""Classify an upstream error answer: context overflow, output budget, or anything else.

When an upstream rejects a chat request the pipeline needs one decision: trim the prompt and
retry (``overflow``), lower ``max_tokens`` and retry (``output_budget``), or hand the answer
back unchanged (``other``). Providers word this in dozens of ways and wrap it in dozens of
envelopes; this module knows the wordings collected in ``tests/fixtures/overflow/cases.json``
(each case names where it was found) and reduces them to one :class:`Overflow` value.

Rules, in order:

* 413 is ``overflow``: the request is too large, whoever says so (provider, nginx,
  Cloudflare, a load balancer). The exception is a rate-limit wording: Groq answers 413 when
  one request exceeds an organisation's tokens-per-minute budget, which says nothing about
  the model's window and must not be learned as one, so it stays ``other``.
* 401, 403, 404 and 429 are never overflow. OpenAI's 429 "Request too large ... (TPM)" reads
  like an overflow but is a rate limit.
* 400 and 422 are decided by the text, then by structure: an error code or type that names
  the context length or prompt size, or top-level ``n_prompt_tokens`` above ``n_ctx``. A
  rate-limit or quota wording there stays ``other`` whatever else the body says.
* A pydantic-style validation list (FastAPI's default 422, ``{"detail": [{"type", "loc",
  "msg", "input"}]}``) is ``other``: it names a field the request got wrong and echoes the
  value it got (``input``), which is the client's text, not the provider's word. Values
  under ``input``, ``loc`` and ``ctx`` are never read, anywhere in a body.
* Any other 422, and a 400 whose ``param`` names a field other than the prompt, is a
  validation answer (``Overflow.validation``): recognised, but nothing in it is learned.
* 500 and 503 count only when the text clearly names the context window (older llama.cpp
  servers answer 500) or states an output budget with both numbers (Ollama's OpenAI layer
  relays a cloud model's budget error as 500); anything vaguer is a server error.

:func:`classify_error` is pure, never raises, and reads at most the first 64 KiB of a body.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

import orjson

OverflowKind = Literal["overflow", "output_budget", "other"]
Provider = Literal[
    "openai",
    "azure",
    "vllm",
    "sglang",
    "llamacpp",
    "ollama",
    "tgi",
    "lmstudio",
    "anthropic",
    "gemini",
    "bedrock",
    "mistral",
    "groq",
    "deepseek",
    "openrouter",
    "together",
    "fireworks",
    "cerebras",
    "xai",
    "cohere",
    "copilot",
    "dashscope",
    "moonshot",
    "zhipu",
    "http413",
    "unknown",
]


@dataclass(frozen=True, slots=True)
class Overflow:
    """What an upstream error answer means for the retry logic.

    ``limit`` is the model's context window for ``overflow`` and the maximum output tokens for
    ``output_budget``, when the answer states it. ``requested`` is the token count the upstream
    says the request needed: stated outright, or prompt plus completion when both are stated.
    ``prompt_tokens`` and ``completion_tokens`` are the two halves when stated; a prompt below
    ``limit`` means lowering ``max_tokens`` alone would fit. Counts an upstream gives only as a
    lower bound ("at least N input tokens") are left out rather than passed off as exact.
    ``provider`` is a best guess at whose error format this is, for logs and metrics only.
    ``limit_evidence`` is the text the overflow ``limit`` was read from (lower-cased), so a
    caller can tell a provider's own sentence from request content the upstream echoed back
    (see :func:`echoed`); None when the limit came from a top-level structured field.
    ``validation``: the answer is about a field (any 422, or a 400 whose ``param`` names a
    field other than the prompt), so its numbers may be the request's own: nothing in it
    may be learned. ``fraction``: the share of the rejected request the upstream would take,
    when it states sizes in units other than tokens (Bedrock's characters).
    """

    kind: OverflowKind
    limit: int | None = None
    requested: int | None = None
    provider: Provider = "unknown"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    limit_evidence: str | None = None
    validation: bool = False
    fraction: float | None = None


def classify_error(status: int, headers: Mapping[str, str], body: bytes) -> Overflow:
    """Classify one upstream error answer; never raises."""
    parsed = _read_body(body)
    provider = _guess_provider(_header_names(headers), parsed)
    if status == 413:
        return _too_large(parsed, provider)
    if status in (400, 422):
        return _refused(status, parsed, provider)
    if status in (500, 503):
        return _failed(parsed, provider)
    return Overflow("other", provider=provider)


def _too_large(parsed: _Body, provider: Provider) -> Overflow:
    """A 413: an overflow unless it reads as a rate limit."""
    if _RATE_LIMIT.search(parsed.text):
        return Overflow("other", provider=provider)
    # A gateway's page names no provider; a provider's own JSON keeps its name.
    if not parsed.is_json or provider == "unknown":
        provider = "http413"
    return _overflow(parsed, provider)


def _refused(status: int, parsed: _Body, provider: Provider) -> Overflow:
    """A 400 or 422: an output budget refused, an overflow (``validation`` when it may be
    about another field), or something else."""
    text = parsed.text
    if _RATE_LIMIT.search(text) or parsed.pydantic:
        return Overflow("other", provider=provider)
    budget = _output_budget(text, provider)
    if budget is not None:
        return budget
    if (
        _OVERFLOW_STRONG.search(text)
        or _OVERFLOW_WEAK.search(text)
        or _overflow_code(parsed)
        or _prompt_above_window(parsed)
    ):
        verdict = _overflow(parsed, provider)
        if status == 422 or verdict.fraction is not None or not _about_the_prompt(parsed):
            verdict = replace(verdict, validation=True)
        return verdict
    return Overflow("other", provider=provider)


def _failed(parsed: _Body, provider: Provider) -> Overflow:
    """A 500 or 503: some providers report an output budget or an overflow this way, in
    their strongest wording only; a rate limit never is one."""
    text = parsed.text
    if not _RATE_LIMIT.search(text):
        budget = _output_budget(text, provider)
        if budget is not None:
            return budget
        if _OVERFLOW_STRONG.search(text):
            return _overflow(parsed, provider)
    return Overflow("other", provider=provider)


# --- reading the body ---------------------------------------------------------------------

# Error bodies are small; anything past this is an echoed prompt or an HTML page, and
# reading it would only cost time.
_MAX_BODY: Final = 64 * 1024
# Bounds on walking parsed JSON, so a hostile body cannot make us do unbounded work.
_MAX_NODES: Final = 4096
# Gateways put the upstream's JSON error inside their own message string, sometimes twice.
_MAX_EMBEDDED: Final = 3
_RECORDED_KEYS: Final = frozenset({"code", "type", "param"})
# Where validation errors put the client's own value (pydantic: ``input``, the field's
# path ``loc``, the rule's bounds ``ctx``): never read, so nothing planted there is seen.
_ECHO_KEYS: Final = frozenset({"input", "loc", "ctx"})
# ``param`` values that name the prompt or its size, where an overflow is reported; any
# other field makes the answer a validation error about that field.
_PROMPT_PARAMS: Final = frozenset(
    {
        "",
        "none",
        "null",
        "messages",
        "prompt",
        "input",
        "inputs",
        "input_text",
        "input_tokens",
        "contents",
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
    }
)
_NUMBER_KEYS: Final = frozenset({"n_ctx", "n_prompt_tokens"})
# Error codes are short identifiers; a longer string under "code" is not one.
_MAX_CODE: Final = 64


@dataclass(frozen=True, slots=True)
class _Body:
    """The parts of an error body the rules look at.

    ``text`` is every string in the body joined and lower-cased: the patterns below are
    written in lower case, which lets the regex engine skip ahead on literal prefixes
    (several times faster than IGNORECASE on a 64 KiB body). ``codes`` holds every ``code``
    and ``type`` value of the body's own fields (numbers as their digits), lower-cased.
    ``pydantic``: the body is a pydantic-style validation list (``detail`` of objects
    with ``loc``).
    """

    text: str
    is_json: bool = False
    keys: frozenset[str] = frozenset()
    strings: Mapping[str, str] = field(default_factory=dict)
    numbers: Mapping[str, int] = field(default_factory=dict)
    codes: frozenset[str] = frozenset()
    pydantic: bool = False


class _NotJson:
    """Marks text that did not parse, since ``null`` is a valid JSON document."""


_NOT_JSON: Final = _NotJson()


def _read_body(body: bytes) -> _Body:
    # bytes() so a bytearray or memoryview body works too.
    raw = bytes(body[:_MAX_BODY]).decode("utf-8", errors="replace")
    document = _loads(raw)
    if not isinstance(document, _NotJson):
        return _walk(document, extra="", is_json=True)
    # Plain text around a JSON error ("Error: 400 {...}"): read both.
    embedded = _loads_embedded(raw)
    if isinstance(embedded, dict | list):
        return _walk(embedded, extra=raw, is_json=False)
    return _Body(text=_unescape(raw).lower())


def _document_start(text: str) -> str:
    """The bracket an embedded JSON document in ``text`` opens with."""
    brace, bracket = text.find("{"), text.find("[")
    if brace == -1:
        return "["
    if bracket == -1:
        return "{"
    return "{" if brace < bracket else "["


def _loads(text: str) -> object:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _loads_embedded(text: str) -> object:
    """Parse the JSON document inside a string like ``Error from provider: {...}``."""
    opening = _document_start(text)
    start = text.find(opening)
    end = text.rfind("}" if opening == "{" else "]")
    if start == -1 or end <= start:
        return _NOT_JSON
    return _loads(text[start : end + 1])


def _walk(document: object, *, extra: str, is_json: bool) -> _Body:
    """Flatten parsed JSON into the text the patterns read, plus a few structured fields."""
    found = _Found(extra)
    pending: deque[tuple[object, int, str]] = deque([(document, 0, "")])
    nodes = 0
    while pending and nodes < _MAX_NODES:
        value, depth, key = pending.popleft()
        nodes += 1
        if isinstance(value, dict):
            for child_key, child in value.items():
                name = str(child_key).lower()
                found.keys.add(name)
                if name not in _ECHO_KEYS:
                    pending.append((child, depth, name))
        elif isinstance(value, list):
            pending.extend((child, depth, key) for child in value)
        elif isinstance(value, str):
            embedded = found.string(value, depth, key)
            if isinstance(embedded, dict | list):
                pending.append((embedded, depth + 1, key))
        elif type(value) is int and depth == 0:
            # type() rather than isinstance: JSON true/false arrive as bool, a subclass of int.
            found.number(value, key)
    return _Body(
        text=_unescape("\n".join(found.texts)).lower(),
        is_json=is_json,
        keys=frozenset(found.keys),
        strings=found.strings,
        numbers=found.numbers,
        codes=frozenset(found.codes),
        pydantic=_is_pydantic(document),
    )


class _Found:
    """What ``_walk`` has found so far: the texts, every key, the first string of each
    recorded key and of each number key, and the codes."""

    __slots__ = ("codes", "keys", "numbers", "strings", "texts")

    def __init__(self, extra: str) -> None:
        self.texts: list[str] = [extra] if extra else []
        self.keys: set[str] = set()
        self.strings: dict[str, str] = {}
        self.numbers: dict[str, int] = {}
        self.codes: set[str] = set()

    def string(self, value: str, depth: int, key: str) -> object:
        """``value`` (under ``key``, ``depth`` documents deep) noted; the JSON document
        inside it, if any (``_NOT_JSON`` if none, or too deep to read)."""
        if key in _RECORDED_KEYS:
            self.strings.setdefault(key, value.lower())
            # Only the body's own fields, as for numbers below: a code inside a string
            # may be echoed request content.
            if depth == 0 and key != "param" and len(value) <= _MAX_CODE:
                self.codes.add(value.lower())
        self.texts.append(value)
        # Keep the string too: "[1, 8192]" parses as JSON but is part of a sentence.
        return _loads_embedded(value) if depth < _MAX_EMBEDDED else _NOT_JSON

    def number(self, value: int, key: str) -> None:
        """A number of the body's own fields: a document inside a string may be echoed
        request content, and a number read from there is not the upstream's word."""
        if 0 <= value < 10**12:
            if key in _NUMBER_KEYS:
                self.numbers.setdefault(key, value)
            elif key == "code":
                self.codes.add(str(value))


def _is_pydantic(document: object) -> bool:
    """FastAPI's default validation answer: ``{"detail": [{"loc": [...], ...}, ...]}``."""
    if not isinstance(document, dict):
        return False
    detail = document.get("detail")
    return (
        isinstance(detail, list)
        and bool(detail)
        and all(isinstance(item, dict) and "loc" in item for item in detail)
    )


def _about_the_prompt(body: _Body) -> bool:
    """Whether the body's ``param`` (when it has one) names the prompt or its size."""
    param = body.strings.get("param")
    return param is None or param.strip() in _PROMPT_PARAMS


def _unescape(text: str) -> str:
    # Bodies quoted inside other bodies keep their escapes ("\u003e", '\"'); the patterns
    # are written against the plain characters.
    return (
        text.replace("\\u003e", ">")
        .replace("\\u003c", "<")
        .replace('\\"', '"')
        .replace("\\'", "'")
        .replace("\\n", "\n")
    )


def _header_names(headers: Mapping[str, str]) -> frozenset[str]:
    return frozenset(str(name).lower() for name in headers)


# --- deciding -----------------------------------------------------------------------------

# A number we are willing to believe is a token count: at most 12 digits, not the head of a
# longer run of digits.
_N: Final = r"(?<![0-9])([0-9]{1,12})(?![0-9])"


def _compile(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.ASCII)


_RATE_LIMIT: Final = _compile(
    r"rate[ _-]?limit",
    r"tokens per min",
    r"quota",
    r"throttl",
    r"please wait",
    r"try again in \d",
)

# Wordings that name the context window outright; trusted even on a 5xx.
_OVERFLOW_STRONG: Final = _compile(
    r"maximum (?:context|prompt) length (?:is |of |: ?)?\d",
    r"context[ _]length[ _]exceeded",
    r"prompt is too long",
    r"exceed(?:s|ed)? (?:the )?context (?:limit|window)",
    r"input token count[^\n]{0,40}exceeds the maximum number of tokens",
    r"exceeds the available context size",
    r"exceed_context_size_error",
    r"longer than the model'?s context length",
    r"longer than the maximum model length",
    r"too long to fit into the model",
    r"exceeds the maximum allowed length",
    r"requested token count exceeds",
    r"input is too long for requested model",
    r"too large for model with \d+ maximum context length",
    r"`inputs` tokens \+ `max_new_tokens` must be <=",
    r"`inputs` must have less than \d+ tokens",
    r"prompt too long; exceeded (?:max )?context length",
    r"input length exceeds (?:the )?(?:maximum )?context length",
    r"trying to keep the first \d+ tokens when context the overflows",
    r"tokens to keep from the initial prompt is greater than the context length",
    r"n_keep \(\d+\) >= n_ctx",
    r"current length is \d+ while limit is \d+",
    r"exceeded model token limit",
    r"request size exceeds model context window",
    r"request_too_large",
    r"input tokens exceed the configured limit",
    r"maximum context limit",
    r"exceeded max_prompt_tokens",
    r"prompt tokens \(\d+\) exceed model maximum",
    r"context window exceeds limit",
    r"prompt token count of \d+ exceeds the limit of \d+",
    r"range of input length should be \[\s*1\s*,\s*\d+\s*\]",
    r"too many input tokens\. max input tokens",
    # Ollama 0.12+ (llm/llama_server.go), when context shift is off.
    r"longer than the context length currently available",
    # Moonshot (Kimi): the prompt plus max_tokens over the window.
    r"model max length exceeded",
)

# Vaguer wordings: enough on a 400, not on a 5xx.
_OVERFLOW_WEAK: Final = _compile(
    r"reduce the length of the (?:messages|input|prompt)",
    r"too many (?:input )?tokens",
    r"input is too long",
    r"prompt exceeds max length",
    # Bedrock's JSON-schema check of a string's length, in characters, not tokens.
    r"expected maxlength: \d+, actual: \d+",
)

# Error codes and types that name the context or prompt size, for bodies whose wording is
# unknown; searched in each code the body itself carries (``_Body.codes``). Zhipu numbers
# its errors, and 1261 is its "prompt too long".
_OVERFLOW_CODE: Final = _compile(
    r"context[_ ](?:length|window)[_ ]exceeded",
    r"context[_ ]exceeded",
    r"exceed(?:s|ed)?[_ ]context",
    r"prompt[_ ]too[_ ]long",
    r"max[_ ]prompt[_ ]tokens",
    r"tokens[_ ]too[_ ]long",
    r"^1261$",
)

# Output-budget wordings: (pattern, group holding the limit, group holding the request).
# Checked before the overflow wordings, because some of them mention the context window too.
_OUTPUT_BUDGET: Final[tuple[tuple[re.Pattern[str], int, int], ...]] = (
    (  # OpenAI
        re.compile(rf"is too large: {_N}\.? ?this model supports at most {_N}", re.ASCII),
        2,
        1,
    ),
    (  # Anthropic
        re.compile(
            rf"max_tokens: {_N} > {_N}, which is the maximum allowed number of output", re.ASCII
        ),
        2,
        1,
    ),
    (  # Bedrock
        re.compile(rf"maximum tokens you requested exceeds? the model limit of {_N}", re.ASCII),
        1,
        0,
    ),
    (  # TGI; the lookahead keeps out "`inputs` tokens + `max_new_tokens` must be <= N"
        re.compile(rf"`max_new_tokens` must be <= {_N}\. given: {_N}(?! `inputs`)", re.ASCII),
        1,
        2,
    ),
    (  # Groq
        re.compile(rf"max_completion_tokens`? must be less than or equal to `?{_N}", re.ASCII),
        1,
        0,
    ),
    (  # DeepSeek, DashScope
        re.compile(rf"range of max_tokens (?:is|should be) \[\s*1\s*,\s*{_N}\s*\]", re.ASCII),
        1,
        0,
    ),
    (  # vLLM; older versions ran the number into the word ("38000cannot")
        re.compile(
            rf"max_(?:completion_)?tokens={_N} ?cannot be greater than "
            rf"max_model_len=(?:max_total_tokens=)?{_N}",
            re.ASCII,
        ),
        2,
        1,
    ),
    (  # Ollama Cloud, and gateways that copy its wording
        re.compile(
            rf"max_(?:completion_)?tokens \({_N}\) exceeds model'?s maximum output tokens \({_N}\)",
            re.ASCII,
        ),
        2,
        1,
    ),
    (  # OpenAI-style integer bounds, as Volcengine and the Responses API word them
        re.compile(
            rf"max_(?:completion_|output_)?tokens[^\n]{{0,80}}?integer above maximum value"
            rf"[.,] expected a value <= ?{_N}, but got {_N}",
            re.ASCII,
        ),
        1,
        2,
    ),
)


def _output_budget(text: str, provider: Provider) -> Overflow | None:
    for pattern, limit_group, requested_group in _OUTPUT_BUDGET:
        match = pattern.search(text)
        if match is not None:
            return Overflow(
                "output_budget",
                limit=int(match.group(limit_group)),
                requested=int(match.group(requested_group)) if requested_group else None,
                provider=provider,
            )
    return None


def _patterns(*alternatives: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(a.replace("{N}", _N), re.ASCII) for a in alternatives)


# First match wins, so the most specific wordings come first.
_LIMIT: Final = _patterns(
    r"maximum (?:context|prompt) length(?: is| of|:)? {N}",
    r"{N} maximum context length",
    r"> {N} maximum",
    r"exceed context limit: \d+ \+ \d+ > {N}",
    r"maximum number of tokens allowed \(?{N}",
    r"context size \({N} tokens\)",
    r"context length(?: of only| of)? \(?{N}",
    r"maximum model length of {N}",
    r"maximum allowed length \({N}",
    r"`max_new_tokens` must be <= {N}",
    r"must have less than {N} tokens",
    r"n_ctx \({N}\)",
    r"while limit is {N}",
    r"model token limit: {N}",
    r"configured limit of {N}",
    r"maximum context limit of {N}",
    r"cannot exceed {N}",
    r"\(tpm\): limit {N}",
    r"max_prompt_tokens \({N}\)",
    r"exceed model maximum \({N}\)",
    r"exceeds the limit of {N}",
    r"range of input length should be \[\s*1\s*,\s*{N}\s*\]",
    r"max input tokens: {N}",
    r"model max length exceeded, max length: ?{N}",
)
# The whole request as the upstream counted it.
_REQUESTED: Final = _patterns(
    r"requested(?: about| a total of)?:? {N}(?! output tokens)",
    r"resulted in {N} tokens",
    r"total length {N}",
    r"current length is {N}",
    r"received {N}",
)
# The prompt alone.
_PROMPT: Final = _patterns(
    r"resulted in {N} tokens",
    r"\({N} in the messages",
    r"\({N} in your prompt",
    r"request has {N} input tokens",
    r"{N} tokens from the input messages",
    r"exceed context limit: {N} \+",
    r"given: {N} `inputs` tokens",
    r"must have less than \d+ tokens\. given: {N}",
    r"prompt is too long: {N}",
    r"input token count \({N}\)",
    r"request \({N} tokens\)",
    r"input(?: length)? \({N} tokens\)",
    r"request contains {N} tokens",
    r"prompt contains {N} tokens",
    r"keep the first {N} tokens",
    r"n_keep \({N}\)",
    r"(?:prompt|input) tokens \({N}\)",
    r"total length {N}",
    r"prompt token count of {N}",
    r"request input token count: {N}",
)
_COMPLETION: Final = _patterns(
    r"{N} in the completion",
    r"{N} for the completion",
    r"{N} tokens for the completion",
    r"{N} in the output",
    r"requested {N} output tokens",
    r"is too large: {N}",
    r"and {N} `max_new_tokens`",
    r"exceed context limit: \d+ \+ {N}",
)
# Bedrock states a string's length limit in characters: a share of the request, not a window.
_CHARACTERS: Final = re.compile(rf"expected maxlength: {_N}, actual: {_N}", re.ASCII)
# OpenRouter splits the prompt into text and tool input.
_TEXT_INPUT: Final = re.compile(rf"{_N} of text input", re.ASCII)
_TOOL_INPUT: Final = re.compile(rf"{_N} of tool input", re.ASCII)


def _overflow_code(body: _Body) -> bool:
    return any(_OVERFLOW_CODE.search(code) for code in body.codes)


def _prompt_above_window(body: _Body) -> bool:
    """llama.cpp and servers derived from it state both counts as fields, whatever their
    sentence says."""
    prompt, window = body.numbers.get("n_prompt_tokens"), body.numbers.get("n_ctx")
    return prompt is not None and window is not None and prompt > window


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    match = _first_match(patterns, text)
    return int(match.group(1)) if match is not None else None


def _first_match(patterns: tuple[re.Pattern[str], ...], text: str) -> re.Match[str] | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match is not None:
            return match
    return None


def _overflow(body: _Body, provider: Provider) -> Overflow:
    text = body.text
    limit: int | None = body.numbers.get("n_ctx")
    evidence = None
    if limit is None:
        stated = _first_match(_LIMIT, text)
        if stated is not None:
            limit, evidence = int(stated.group(1)), stated.group(0)
    prompt = body.numbers.get("n_prompt_tokens", _first(_PROMPT, text))
    text_input = _TEXT_INPUT.search(text)
    if prompt is None and text_input is not None:
        tool_input = _TOOL_INPUT.search(text)
        prompt = int(text_input.group(1)) + (int(tool_input.group(1)) if tool_input else 0)
    completion = _first(_COMPLETION, text)
    requested = _first(_REQUESTED, text)
    if requested is None:
        requested = prompt + completion if prompt is not None and completion else prompt
    characters = _CHARACTERS.search(text)
    fraction = None
    if characters is not None and limit is None:
        allowed, actual = int(characters.group(1)), int(characters.group(2))
        fraction = allowed / actual if 0 < allowed < actual else None
    return Overflow(
        "overflow",
        limit=limit,
        requested=requested,
        provider=provider,
        prompt_tokens=prompt,
        completion_tokens=completion,
        limit_evidence=evidence,
        fraction=fraction,
    )


def request_text(request: bytes) -> str:
    """A sent JSON request as :func:`classify_error` reads an error body: decoded, unescaped,
    lower-cased. Round-tripped through orjson so ``\\u`` escapes in the client's bytes
    cannot hide text the upstream decodes and may echo."""
    try:
        canonical = orjson.dumps(orjson.loads(request)).decode()
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        canonical = bytes(request).decode("utf-8", errors="replace")
    return _unescape(canonical).lower()


def echoed(verdict: Overflow, sent_text: str) -> bool:
    """Whether the overflow's stated limit may be request content the upstream echoed (an
    "Invalid value: '...'" error quoting a field, say) rather than its own word: the sentence
    it was read from also appears in what was sent (``request_text``)."""
    return verdict.limit_evidence is not None and verdict.limit_evidence in sent_text


def mentions(sent_text: str, number: int) -> bool:
    """Whether ``number`` appears as a number of its own in what was sent (``request_text``):
    a limit the client could have planted for an upstream to quote, however the sentence
    around it was worded. Costs one scan of the request, on an overflow only."""
    return re.search(rf"(?<![0-9]){number}(?![0-9])", sent_text, re.ASCII) is not None


# --- whose error is it --------------------------------------------------------------------

_HEADER_PROVIDERS: Final[tuple[tuple[Provider, frozenset[str]], ...]] = (
    ("azure", frozenset({"apim-request-id", "x-ms-region", "azureml-model-session"})),
    ("bedrock", frozenset({"x-amzn-errortype", "x-amzn-bedrock-invocation-latency"})),
    ("groq", frozenset({"x-groq-region"})),
    ("openai", frozenset({"openai-organization", "openai-processing-ms", "openai-version"})),
)
_KEY_PROVIDERS: Final[tuple[tuple[Provider, str], ...]] = (
    ("openrouter", "provider_name"),
    ("azure", "innererror"),
    ("together", "type_"),
    ("tgi", "error_type"),
    ("llamacpp", "n_ctx"),
)
# Ordered: gateways that wrap other providers' errors come before the providers they wrap.
_TEXT_PROVIDERS: Final[tuple[tuple[Provider, re.Pattern[str]], ...]] = (
    ("openrouter", _compile(r"middle-out", r"openrouter")),
    ("azure", _compile(r"responsibleaipolicyviolation", r"azure openai")),
    (
        "copilot",
        _compile(
            r"prompt token count of \d+ exceeds the limit of \d+",
            r"model_max_prompt_tokens_exceeded",
            r"githubcopilot",
        ),
    ),
    (
        "dashscope",
        _compile(
            r"internalerror\.algo",
            r"range of input length should be",
            r"data_inspection_failed",
            r"dashscope",
            r"aliyun",
        ),
    ),
    (
        "bedrock",
        _compile(
            r"the model returned the following errors",
            r"validationexception",
            r"throttlingexception",
            r"maximum tokens you requested exceeds? the model limit",
            r"input is too long for requested model",
            r"too many input tokens\. max input tokens",
            r"malformed input request",
        ),
    ),
    (
        "gemini",
        _compile(r"invalid_argument", r"resource_exhausted", r"googleapis", r"input token count"),
    ),
    (
        "anthropic",
        _compile(
            r"overloaded_error",
            r"request_too_large",
            r"prompt is too long: \d+ tokens > \d+ maximum",
            r"maximum allowed number of output tokens",
            r"exceed context limit: \d+ \+ \d+",
            r"request size exceeds model context window",
            r"req_011",
        ),
    ),
    ("groq", _compile(r"console\.groq\.com", r"groq")),
    (
        "moonshot",
        _compile(
            r"exceeded model token limit",
            r"model max length exceeded",
            r"rate_limit_reached_error",
            r"engine_overloaded_error",
            r"api\.moonshot",
        ),
    ),
    ("zhipu", _compile(r"prompt exceeds max length", r"bigmodel\.cn", r"api\.z\.ai")),
    (
        "llamacpp",
        _compile(
            r"exceed_context_size_error",
            r"exceeds the available context size",
            r"exceeds context size",
            r"loading model",
        ),
    ),
    (
        "lmstudio",
        _compile(
            r"trying to keep the first \d+ tokens",
            r"tokens to keep from the initial prompt",
            r"n_keep \(\d+\) >= n_ctx",
        ),
    ),
    (
        "ollama",
        _compile(
            r"prompt too long; exceeded",
            r"input length exceeds maximum context length",
            r"input length exceeds the context length",
            r"longer than the context length currently available",
            r"exceeds model'?s maximum output tokens",
            r"try pulling it first",
        ),
    ),
    ("tgi", _compile(r"input validation error")),
    (
        "sglang",
        _compile(
            r"longer than the model'?s context length",
            r"requested token count exceeds the model",
            r"exceeds the maximum allowed length",
        ),
    ),
    ("mistral", _compile(r"too large for model with \d+ maximum context length")),
    ("cerebras", _compile(r"current length is \d+ while limit is \d+")),
    ("xai", _compile(r"maximum prompt length is \d+", r"client specified an invalid argument")),
    ("cohere", _compile(r"too many tokens: total number of tokens", r"prompt_truncation")),
    ("fireworks", _compile(r"model maximum context length: \d+", r"accounts/fireworks")),
    ("deepseek", _compile(r"deepseek", r"valid range of max_tokens is")),
    ("vllm", _compile(r"badrequesterror", r"parameter=input_t", r"max_model_len")),
    ("openai", _compile(r"openai\.com")),
)


_ZHIPU_CODE: Final = re.compile(r"1[0-9]{3}", re.ASCII)


def _guess_provider(header_names: frozenset[str], body: _Body) -> Provider:
    for provider, names in _HEADER_PROVIDERS:
        if header_names & names:
            return provider
    for provider, key in _KEY_PROVIDERS:
        if key in body.keys:
            return provider
    for provider, pattern in _TEXT_PROVIDERS:
        if pattern.search(body.text):
            return provider
    code, kind = body.strings.get("code"), body.strings.get("type")
    # Zhipu's business codes are four digits from 1000, as a string.
    if code is not None and _ZHIPU_CODE.fullmatch(code):
        return "zhipu"
    # Anthropic's envelope is the only one whose outermost "type" is "error".
    if kind == "error":
        return "anthropic"
    # DeepSeek reuses OpenAI's envelope but repeats the type as the code.
    if code == kind == "invalid_request_error" and "maximum context length" in body.text:
        return "deepseek"
    if {"message", "type", "param", "code"} <= body.keys:
        return "openai"
    return "unknown"
