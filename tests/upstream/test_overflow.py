"""Issue 4: telling a context overflow from an output-budget error from anything else.

The corpus in fixtures/overflow/cases.json holds real error answers, each with the place it
was found; the rest of this file covers what a corpus cannot: hostile bytes, huge bodies,
and statuses that must never count as overflow whatever the body says.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, get_args

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxy.upstream.overflow import Overflow, OverflowKind, Provider, classify_error
from tests.support.examples import examples

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "overflow" / "cases.json").read_text(encoding="utf-8")
)
PROVIDERS = frozenset(get_args(Provider))
KINDS = frozenset(get_args(OverflowKind))

# Every provider the issue lists must have at least one real overflow answer in the corpus.
REQUIRED_OVERFLOW_PROVIDERS = PROVIDERS - {"unknown"}

OPENAI_OVERFLOW = (
    b'{"error":{"message":"This model\'s maximum context length is 128000 tokens. However, '
    b'your messages resulted in 130000 tokens. Please reduce the length of the messages.",'
    b'"type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}'
)
ANTHROPIC_MESSAGE = "prompt is too long: 210000 tokens > 200000 maximum"
FIVE_MB = 5 * 1024 * 1024


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_real_error_answer_is_classified(case: dict[str, Any]) -> None:
    verdict = classify_error(case["status"], case["headers"], case["body"].encode())
    expect = case["expect"]
    assert verdict.kind == expect["kind"]
    assert verdict.limit == expect["limit"]
    assert verdict.requested == expect["requested"]
    for name in ("prompt_tokens", "completion_tokens", "provider"):
        if name in expect:
            assert getattr(verdict, name) == expect[name], name


def test_corpus_cases_are_well_formed() -> None:
    """Every case says where it was found, and uses only the values the API defines."""
    for case in CASES:
        assert case["source"].strip(), case["id"]
        assert case["provider"] in PROVIDERS, case["id"]
        assert case["expect"]["kind"] in KINDS, case["id"]
        assert isinstance(case["status"], int), case["id"]
        assert all(isinstance(v, str) for v in case["headers"].values()), case["id"]


def test_corpus_covers_every_provider_and_enough_negatives() -> None:
    overflow_providers = {c["provider"] for c in CASES if c["expect"]["kind"] == "overflow"}
    missing = REQUIRED_OVERFLOW_PROVIDERS - overflow_providers
    assert not missing
    assert sum(c["expect"]["kind"] == "other" for c in CASES) >= 15
    assert sum(c["expect"]["kind"] == "output_budget" for c in CASES) >= 5


@pytest.mark.parametrize("status", [401, 403, 404, 429])
def test_overflow_wording_under_a_never_overflow_status_stays_other(status: int) -> None:
    assert classify_error(status, {}, OPENAI_OVERFLOW).kind == "other"


def test_openai_tpm_request_too_large_is_a_rate_limit_not_an_overflow() -> None:
    body = (
        b'{"error":{"message":"Request too large for gpt-4o in organization org-abc on tokens '
        b"per min (TPM): Limit 30000, Requested 50000. The input or output tokens must be "
        b'reduced in order to run successfully.","type":"tokens","param":null,'
        b'"code":"rate_limit_exceeded"}}'
    )
    assert classify_error(429, {}, body).kind == "other"
    # Even a gateway that downgrades the status to 400 must not turn it into a trim.
    assert classify_error(400, {}, body).kind == "other"


def test_vague_wording_on_a_server_error_is_not_an_overflow() -> None:
    body = b'{"error":{"message":"Please reduce the length of the messages or completion."}}'
    assert classify_error(400, {}, body).kind == "overflow"
    assert classify_error(500, {}, body).kind == "other"


@pytest.mark.parametrize("status", [200, 408, 502, 504, 529])
def test_other_statuses_never_overflow(status: int) -> None:
    assert classify_error(status, {}, OPENAI_OVERFLOW).kind == "other"


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"detail": ANTHROPIC_MESSAGE}),
        json.dumps({"error": ANTHROPIC_MESSAGE}),
        json.dumps({"message": ANTHROPIC_MESSAGE}),
        json.dumps([{"error": {"message": ANTHROPIC_MESSAGE}}]),
        json.dumps({"error": {"message": json.dumps({"error": {"message": ANTHROPIC_MESSAGE}})}}),
        ANTHROPIC_MESSAGE,
        f"Error code: 400 - {{'error': {{'message': '{ANTHROPIC_MESSAGE}'}}}}",
        f"Error: 400 {json.dumps({'type': 'error', 'error': {'message': ANTHROPIC_MESSAGE}})}",
    ],
    ids=["detail", "error-string", "message", "list", "json-in-string", "plain", "repr", "prefix"],
)
def test_message_is_found_in_any_envelope(body: str) -> None:
    verdict = classify_error(400, {}, body.encode())
    assert (verdict.kind, verdict.limit, verdict.requested) == ("overflow", 200000, 210000)


def test_bad_utf8_around_the_message_is_tolerated() -> None:
    body = b"\xff\xfe\x80" + OPENAI_OVERFLOW + b"\xc3\x28"
    verdict = classify_error(400, {}, body)
    assert (verdict.kind, verdict.limit, verdict.requested) == ("overflow", 128000, 130000)


def test_headers_may_be_any_mapping() -> None:
    headers = MappingProxyType({"X-Amzn-ErrorType": "ValidationException"})
    body = b'{"message":"Input is too long for requested model."}'
    assert classify_error(400, headers, body) == Overflow("overflow", provider="bedrock")


def test_numbers_too_long_to_be_token_counts_are_dropped() -> None:
    body = b"This model's maximum context length is 99999999999999999999999999999999 tokens."
    assert classify_error(400, {}, body) == Overflow("overflow", provider="unknown")


def test_text_past_the_first_64_kib_is_not_read() -> None:
    body = b" " * (64 * 1024) + OPENAI_OVERFLOW
    assert classify_error(400, {}, body).kind == "other"


def test_overflow_is_a_frozen_value() -> None:
    verdict = classify_error(400, {}, OPENAI_OVERFLOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.kind = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "body",
    [
        OPENAI_OVERFLOW[:-2] + b' "pad": "' + b"x" * FIVE_MB + b'"}}',
        b"maximum context length is " * (FIVE_MB // 26),
        b"requested " + b"9" * FIVE_MB,
        b"[" * FIVE_MB,
        b'{"a":' * (FIVE_MB // 5),
        b'{"error":"' + b"\\u003e" * (FIVE_MB // 6) + b'"}',
        bytes(range(256)) * (FIVE_MB // 256),
    ],
    ids=[
        "padded-json",
        "repeated-phrase",
        "long-number",
        "deep-list",
        "deep-object",
        "escapes",
        "binary",
    ],
)
def test_huge_body_is_classified_quickly(body: bytes) -> None:
    started = time.perf_counter()
    for status in (400, 413, 500):
        classify_error(status, {}, body)
    assert time.perf_counter() - started < 1.0


def test_huge_overflow_body_is_still_recognised() -> None:
    body = OPENAI_OVERFLOW[:-2] + b' "pad": "' + b"x" * FIVE_MB + b'"}}'
    verdict = classify_error(400, {}, body)
    assert (verdict.kind, verdict.limit, verdict.requested) == ("overflow", 128000, 130000)


STATUSES = st.one_of(st.sampled_from([400, 401, 413, 422, 429, 500, 503]), st.integers())
HEADERS = st.dictionaries(st.text(max_size=30), st.text(max_size=30), max_size=5)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(status=STATUSES, headers=HEADERS, body=st.binary(max_size=4096))
def test_never_raises_on_arbitrary_bytes(status: int, headers: dict[str, str], body: bytes) -> None:
    verdict = classify_error(status, headers, body)
    assert verdict.kind in KINDS
    assert verdict.provider in PROVIDERS


@settings(max_examples=examples(300), deadline=None)
@given(status=STATUSES, document=JSON_VALUES)
def test_never_raises_on_arbitrary_json(status: int, document: object) -> None:
    verdict = classify_error(status, {}, json.dumps(document).encode())
    assert verdict.kind in KINDS


@settings(max_examples=examples(300), deadline=None)
@given(
    case=st.sampled_from(CASES),
    cut=st.integers(min_value=0),
    junk=st.binary(max_size=64),
)
def test_never_raises_on_damaged_real_answers(case: dict[str, Any], cut: int, junk: bytes) -> None:
    body = case["body"].encode()
    at = cut % (len(body) + 1)
    verdict = classify_error(case["status"], case["headers"], body[:at] + junk + body[at:])
    assert verdict.kind in KINDS


@settings(max_examples=examples(100), deadline=None)
@given(body=st.binary(max_size=2048))
def test_413_is_overflow_unless_it_names_a_rate_limit(body: bytes) -> None:
    lowered = body.lower()
    assume(
        not any(word in lowered for word in (b"rate", b"per min", b"quota", b"throttl", b"wait"))
    )
    assume(b"try again in" not in lowered)
    assert classify_error(413, {}, body).kind == "overflow"


GROQ_413_TPM = (
    b'{"error":{"message":"Request too large for model `llama-3.3-70b-versatile` in organization '
    b"`org_01` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 10338, "
    b'please reduce your message size and try again.","type":"tokens",'
    b'"code":"rate_limit_exceeded"}}'
)


def test_groq_413_tokens_per_minute_is_a_rate_limit_not_a_window() -> None:
    # One organisation's per-minute budget says nothing about the model: learning 6000 as
    # its window would shrink every later request of every tenant.
    verdict = classify_error(413, {"x-groq-region": "us"}, GROQ_413_TPM)
    assert verdict == Overflow("other", provider="groq")
    assert classify_error(400, {}, GROQ_413_TPM).kind == "other"


def test_a_gateway_413_still_overflows() -> None:
    page = b"<html><head><title>413 Request Entity Too Large</title></head></html>"
    assert classify_error(413, {}, page) == Overflow("overflow", provider="http413")


@pytest.mark.parametrize(
    "code",
    [
        "context_length_exceeded",
        "model_max_prompt_tokens_exceeded",
        "prompt_too_long",
        "max_prompt_tokens",
        "context_window_exceeded",
        "exceed_context_size_error",
        "tokens_too_long",
    ],
)
def test_an_error_code_naming_the_context_is_an_overflow(code: str) -> None:
    body = orjson.dumps(
        {"error": {"message": "Bad request.", "type": "invalid_request_error", "code": code}}
    )
    assert classify_error(400, {}, body).kind == "overflow"
    assert classify_error(422, {}, body).kind == "overflow"


def test_a_context_code_alone_does_not_make_a_server_error_ours() -> None:
    body = b'{"error":{"message":"Bad request.","type":"api_error","code":"prompt_too_long"}}'
    assert classify_error(500, {}, body).kind == "other"


def test_zhipu_code_1261_is_an_overflow_and_its_other_codes_are_not() -> None:
    assert classify_error(
        400, {}, b'{"error":{"code":"1261","message":"Prompt too long"}}'
    ).kind == ("overflow")
    assert classify_error(400, {}, b'{"error":{"code":1261,"message":"x"}}').kind == "overflow"
    for code in ("1210", "1301", "12610", "261"):
        body = orjson.dumps({"error": {"code": code, "message": "x"}})
        assert classify_error(400, {}, body).kind == "other", code


def test_a_context_code_with_a_rate_limit_wording_stays_a_rate_limit() -> None:
    body = (
        b'{"error":{"message":"Rate limit reached: tokens per min (TPM) exceeded. Please try '
        b'again in 20s.","type":"tokens","code":"context_length_exceeded"}}'
    )
    assert classify_error(400, {}, body).kind == "other"
    assert classify_error(413, {}, body).kind == "other"


def test_a_code_quoted_inside_a_string_is_not_the_upstreams_word() -> None:
    inner = '{"code": "prompt_too_long", "type": "context_exceeded"}'
    body = orjson.dumps(
        {"error": {"message": f"invalid tool name {inner}", "type": "invalid_request_error"}}
    )
    assert classify_error(400, {}, body).kind == "other"


def test_prompt_tokens_above_n_ctx_is_an_overflow_whatever_the_sentence() -> None:
    body = (
        b'{"error":{"message":"no slot","type":"server_error","n_prompt_tokens":9000,"n_ctx":8192}}'
    )
    verdict = classify_error(400, {}, body)
    assert (verdict.kind, verdict.limit, verdict.requested) == ("overflow", 8192, 9000)
    assert verdict.limit_evidence is None  # a top-level field, not text
    fits = (
        b'{"error":{"message":"no slot","type":"server_error","n_prompt_tokens":100,"n_ctx":8192}}'
    )
    assert classify_error(400, {}, fits).kind == "other"
    assert classify_error(503, {}, body).kind == "other"


@pytest.mark.parametrize(
    ("message", "limit", "requested"),
    [
        (
            "max_completion_tokens=131072 cannot be greater than max_model_len=128000",
            128000,
            131072,
        ),
        (
            "max_tokens=38000cannot be greater than max_model_len=max_total_tokens=32768.",
            32768,
            38000,
        ),
        ("max_tokens (98304) exceeds model's maximum output tokens (65536)", 65536, 98304),
        (
            "max_completion_tokens (384000) exceeds model's maximum output tokens (65536)",
            65536,
            384000,
        ),
    ],
)
def test_output_budget_forms_lower_max_tokens(message: str, limit: int, requested: int) -> None:
    body = orjson.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}})
    verdict = classify_error(400, {}, body)
    assert (verdict.kind, verdict.limit, verdict.requested) == ("output_budget", limit, requested)
    # Ollama's OpenAI layer relays a cloud model's budget error as 500: both numbers make it ours.
    assert classify_error(500, {}, body).kind == "output_budget"


def test_a_vague_output_complaint_on_a_server_error_is_not_acted_on() -> None:
    body = b'{"error":{"message":"max_tokens is too large for this model","type":"api_error"}}'
    assert classify_error(500, {}, body).kind == "other"


@pytest.mark.parametrize(
    ("message", "evidence"),
    [
        ("prompt token count of 140000 exceeds the limit of 128000", "exceeds the limit of 128000"),
        (
            "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 30720]",
            "range of input length should be [1, 30720]",
        ),
        (
            "400 Bad Request: Too many input tokens. Max input tokens: 8192, request input token "
            "count: 9279 ",
            "max input tokens: 8192",
        ),
    ],
)
def test_new_limits_keep_the_sentence_they_were_read_from(message: str, evidence: str) -> None:
    from proxy.upstream.overflow import echoed, request_text

    verdict = classify_error(400, {}, orjson.dumps({"error": {"message": message}}))
    assert verdict.kind == "overflow"
    assert verdict.limit_evidence == evidence
    sent = orjson.dumps({"messages": [{"role": "user", "content": f"why does it say {message}?"}]})
    assert echoed(verdict, request_text(sent))
    assert not echoed(verdict, request_text(b'{"messages": [{"role": "user", "content": "hi"}]}'))


def test_a_limit_quoted_from_the_request_is_marked_as_echoed() -> None:
    from proxy.upstream.overflow import echoed, request_text

    body = (
        b'{"error": {"message": "Invalid value: \'maximum context length is 1 tokens\'. '
        b'Supported values are: \'system\', \'user\'.", "type": "invalid_request_error", '
        b'"param": "messages[0].role", "code": null}}'
    )
    verdict = classify_error(400, {}, body)
    assert verdict.limit == 1
    sent = b'{"messages": [{"role": "m\\u0061ximum context length is 1 tokens"}]}'
    assert echoed(verdict, request_text(sent))
    honest = b'{"messages": [{"role": "user", "content": "what is a context window?"}]}'
    assert not echoed(verdict, request_text(honest))


def test_a_providers_own_sentence_is_not_echo() -> None:
    from proxy.upstream.overflow import echoed, request_text

    body = (
        b'{"error": {"message": "This model\'s maximum context length is 8192 tokens. However, '
        b'your messages resulted in 9000 tokens.", "type": "invalid_request_error", '
        b'"param": "messages", "code": "context_length_exceeded"}}'
    )
    verdict = classify_error(400, {}, body)
    assert (verdict.limit, verdict.requested) == (8192, 9000)
    assert not echoed(verdict, request_text(b'{"messages": [{"role": "user", "content": "hi"}]}'))


@pytest.mark.parametrize("digits", ["\u0661\u0662\u0663", "\uff11\uff12", "\u00b2"])
def test_only_ascii_digits_are_token_counts(digits: str) -> None:
    text = f"This model's maximum context length is {digits} tokens."
    body = orjson.dumps({"error": {"message": text, "type": "invalid_request_error"}})
    assert classify_error(400, {}, body).limit is None


def test_n_ctx_inside_an_echoed_string_is_not_structured() -> None:
    inner = '{"n_ctx": 1, "n_prompt_tokens": 5}'
    body = orjson.dumps({"error": {"message": f"bad name {inner}: the context size was exceeded"}})
    verdict = classify_error(400, {}, body)
    assert verdict.limit is None or verdict.limit_evidence is not None


# Issue 20, item 5: validation answers echo the request; nothing in them is the provider's.

# FastAPI's default answer to a body that fails validation (pydantic v2): 422 and
# {"detail": [{"type", "loc", "msg", "input"}]}, ``input`` being the client's own value
# (FastAPI docs, tutorial/handling-errors). Here the value is planted to look like
# llama.cpp's structured overflow fields and its sentence.
PLANTED_PART = {
    "type": "text",
    "text": "request (9999 tokens) exceeds the available context size (600 tokens), n_ctx (600)",
    "n_ctx": 600,
    "n_prompt_tokens": 9999,
}
FASTAPI_422 = orjson.dumps(
    {
        "detail": [
            {
                "type": "string_type",
                "loc": ["body", "messages", 0, "content"],
                "msg": "Input should be a valid string",
                "input": [PLANTED_PART],
            }
        ]
    }
)


def test_a_fastapi_validation_answer_is_never_an_overflow() -> None:
    verdict = classify_error(422, {}, FASTAPI_422)
    assert verdict == Overflow("other")
    # Not on a 400 either (FastAPI apps may remap the status), nor inside an envelope.
    assert classify_error(400, {}, FASTAPI_422).kind == "other"


def test_numbers_under_an_echoed_input_are_not_structured_fields() -> None:
    body = orjson.dumps(
        {"error": {"message": "bad part", "input": PLANTED_PART, "ctx": {"n_ctx": 600}}}
    )
    verdict = classify_error(400, {}, body)
    assert verdict.kind == "other"
    assert verdict.limit is None


@pytest.mark.parametrize(
    ("status", "param", "validation"),
    [
        (400, "messages", False),
        (400, None, False),
        (400, "input_tokens", False),
        (400, "messages.[0].role", True),
        (400, "tools[0].function.name", True),
        (422, "messages", True),  # any 422: TGI's overflows are still recognised
    ],
)
def test_an_answer_about_another_field_is_marked_as_validation(
    status: int, param: str | None, validation: bool
) -> None:
    message = "This model's maximum context length is 8192 tokens. However, you requested 9000."
    body = orjson.dumps({"error": {"message": message, "param": param, "code": None}})
    verdict = classify_error(status, {}, body)
    assert verdict.kind == "overflow"
    assert verdict.limit == 8192
    assert verdict.validation is validation


# Issue 20, item 15: Bedrock's character limit is an overflow, not a token window.


def test_bedrock_character_limit_is_a_share_not_a_window() -> None:
    body = orjson.dumps(
        {
            "message": "Malformed input request: #/texts/0: expected maxLength: 2048, actual: "
            "19882, please reformat your input and try again."
        }
    )
    verdict = classify_error(400, {}, body)
    assert verdict.kind == "overflow"
    assert verdict.limit is None
    assert verdict.validation
    assert verdict.fraction == pytest.approx(2048 / 19882)
