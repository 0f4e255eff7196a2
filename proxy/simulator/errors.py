"""Error answers, worded the way each real server words them.

``SimError`` carries a complete HTTP answer (status, body, content type,
headers) plus a ``kind`` that decides which stats counter it bumps. The
builders below reproduce published texts; each names where it was seen, so the
proxy's overflow detection is tested against what servers really send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.simulator.config import ErrorFormat

ErrorKind = Literal["request", "structure", "overflow", "failure", "output_budget"]

_JSON = "application/json"


class SimError(Exception):
    """An error answer; raised anywhere in request handling, rendered by the app."""

    def __init__(
        self,
        status: int,
        body: bytes,
        *,
        kind: ErrorKind = "request",
        content_type: str = _JSON,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(body[:200].decode("utf-8", "replace"))
        self.status = status
        self.body = body
        self.kind: ErrorKind = kind
        self.content_type = content_type
        self.headers = headers or {}


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What OpenAI says inside ``{"error": ...}``; the HTTP answer around it is separate."""

    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


def openai_error(
    status: int,
    info: ErrorInfo,
    *,
    kind: ErrorKind = "request",
    headers: dict[str, str] | None = None,
) -> SimError:
    """OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    error = {"message": info.message, "type": info.type, "param": info.param, "code": info.code}
    return SimError(status, orjson.dumps({"error": error}), kind=kind, headers=headers)


def invalid_request(
    message: str, *, param: str | None = None, code: str | None = None, kind: ErrorKind = "request"
) -> SimError:
    return openai_error(400, ErrorInfo(message, param=param, code=code), kind=kind)


def missing_parameter(param: str) -> SimError:
    """OpenAI's answer to a request without a required field."""
    return invalid_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def template_error(message: str) -> SimError:
    """What vLLM answers when the chat template raises (role alternation)."""
    return SimError(400, _vllm_body(message), kind="structure")


def _vllm_body(message: str) -> bytes:
    # vLLM >= 0.9: ErrorResponse(error=ErrorInfo(message, type, param, code=status)),
    # vllm/entrypoints/openai/protocol.py.
    return orjson.dumps(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    )


def overflow_error(
    fmt: ErrorFormat, *, window: int, prompt: int, tools: int, requested: int | None
) -> SimError:
    """The context-length rejection of server flavour ``fmt``.

    ``prompt`` includes ``tools`` (the tool-definition share); ``requested`` is
    the completion budget the client asked for, or None.
    """
    if fmt == "openai":
        return SimError(400, _openai_overflow(window, prompt, tools, requested), kind="overflow")
    if fmt == "vllm":
        return SimError(400, _vllm_body(_vllm_message(window, prompt, requested)), kind="overflow")
    if fmt == "vllm_legacy":
        return SimError(400, _vllm_legacy_overflow(window, prompt, requested), kind="overflow")
    if fmt == "anthropic":
        return SimError(400, _anthropic_overflow(window, prompt, requested), kind="overflow")
    if fmt == "llamacpp":
        return SimError(400, _llamacpp_overflow(window, prompt), kind="overflow")
    return SimError(413, _NGINX_413, kind="overflow", content_type="text/html")


def _openai_overflow(window: int, prompt: int, tools: int, requested: int | None) -> bytes:
    # Texts as returned by api.openai.com, e.g. sean1832/GPT-Brain#20 ("you requested
    # 4431 tokens (3431 in the messages, 1000 in the completion)") and
    # langchain-ai docs ("your messages resulted in 33885 tokens (33855 in the
    # messages, 30 in the functions). Please reduce the length of the messages or
    # functions.").
    head = f"This model's maximum context length is {window} tokens."
    messages = prompt - tools
    if requested is None:
        if tools:
            text = (
                f"{head} However, your messages resulted in {prompt} tokens ({messages} in the "
                f"messages, {tools} in the functions). Please reduce the length of the "
                "messages or functions."
            )
        else:
            text = (
                f"{head} However, your messages resulted in {prompt} tokens. "
                "Please reduce the length of the messages."
            )
    elif tools:
        text = (
            f"{head} However, you requested {prompt + requested} tokens ({messages} in the "
            f"messages, {tools} in the functions, {requested} in the completion). Please "
            "reduce the length of the messages, functions, or completion."
        )
    else:
        text = (
            f"{head} However, you requested {prompt + requested} tokens ({prompt} in the "
            f"messages, {requested} in the completion). Please reduce the length of the "
            "messages or completion."
        )
    err = {
        "message": text,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    return orjson.dumps({"error": err})


def _vllm_message(window: int, prompt: int, requested: int | None) -> str:
    # vLLM >= 0.10, OpenAIServing._validate_input (serving_engine.py): the prompt
    # alone too long, or the prompt fits but max_tokens does not.
    if requested is None or prompt >= window:
        return (
            f"This model's maximum context length is {window} tokens. However, your request "
            f"has {prompt} input tokens. Please reduce the length of the input messages."
        )
    return (
        f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
        f"maximum context length is {window} tokens and your request has {prompt} input "
        f"tokens ({requested} > {window} - {prompt})."
    )


def _vllm_legacy_overflow(window: int, prompt: int, requested: int | None) -> bytes:
    # vLLM 0.4-0.6 (serving_engine.py _validate_prompt_and_tokenize): a flat
    # body with "object": "error"; without max_tokens it filled in the remainder.
    completion = requested if requested is not None else 0
    text = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the "
        "completion). Please reduce the length of the messages or completion."
    )
    body: dict[str, Any] = {
        "object": "error",
        "message": text,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    return orjson.dumps(body)


def _anthropic_overflow(window: int, prompt: int, requested: int | None) -> bytes:
    # api.anthropic.com: "prompt is too long: 209353 tokens > 199999 maximum"
    # (entropy-research/Devon#88); when only max_tokens pushes it over: "input
    # length and `max_tokens` exceed context limit: 182530 + 31999 > 200000,
    # decrease input length or `max_tokens` and try again".
    if requested is None or prompt > window:
        text = f"prompt is too long: {prompt} tokens > {window} maximum"
    else:
        text = (
            f"input length and `max_tokens` exceed context limit: {prompt} + {requested} > "
            f"{window}, decrease input length or `max_tokens` and try again"
        )
    return orjson.dumps(
        {"type": "error", "error": {"type": "invalid_request_error", "message": text}}
    )


def _llamacpp_overflow(window: int, prompt: int) -> bytes:
    # llama.cpp server since ggml-org/llama.cpp#15780 (type, token counts) and
    # #16486 (HTTP 400); text as in ggml-org/llama.cpp#17284.
    err = {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": prompt,
        "n_ctx": window,
    }
    return orjson.dumps({"error": err})


# nginx's stock page for client_max_body_size; gateways in front of models send it.
_NGINX_413 = (
    b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    b"<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


def max_tokens_error(
    fmt: ErrorFormat, param: str, requested: int, limit: int, model: str
) -> SimError:
    """``max_tokens`` above the model's output limit."""
    if fmt == "anthropic":
        # api.anthropic.com (ChatGPTNextWeb/NextChat#4964).
        text = (
            f"max_tokens: {requested} > {limit}, which is the maximum allowed number of "
            f"output tokens for {model}"
        )
        body = {"type": "error", "error": {"type": "invalid_request_error", "message": text}}
        return SimError(400, orjson.dumps(body), kind="output_budget")
    # api.openai.com; param names whichever field the client used.
    return invalid_request(
        f"{param} is too large: {requested}. This model supports at most {limit} completion "
        f"tokens, whereas you provided {requested}.",
        param=param,
        kind="output_budget",
    )


def simulated_failure(status: int, model: str) -> SimError:
    """``X-Sim-Fail: <status>``: the body api.openai.com sends with that status."""
    if status == 401:
        return openai_error(
            401,
            ErrorInfo(
                "Incorrect API key provided: sk-test. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            ),
            kind="failure",
        )
    if status == 404:
        return openai_error(
            404,
            ErrorInfo(
                f"The model `{model}` does not exist or you do not have access to it.",
                code="model_not_found",
            ),
            kind="failure",
        )
    if status == 429:
        return openai_error(
            429,
            ErrorInfo(
                f"Rate limit reached for {model} in organization org-simulator on tokens per "
                "min (TPM): Limit 30000, Used 30000, Requested 1000. Please try again in 1s. "
                "Visit https://platform.openai.com/account/rate-limits to learn more.",
                type="tokens",
                code="rate_limit_exceeded",
            ),
            kind="failure",
            headers={"Retry-After": "1"},
        )
    if status == 502:
        # Cloudflare in front of api.openai.com.
        body = {
            "error": {
                "code": 502,
                "message": "Bad gateway.",
                "param": None,
                "type": "cf_bad_gateway",
            }
        }
        return SimError(502, orjson.dumps(body), kind="failure")
    if status == 503:
        return openai_error(
            503,
            ErrorInfo(
                "The engine is currently overloaded, please try again later", type="server_error"
            ),
            kind="failure",
        )
    if status >= 500:
        return openai_error(
            status,
            ErrorInfo(
                "The server had an error while processing your request. Sorry about that!",
                type="server_error",
            ),
            kind="failure",
        )
    return openai_error(
        status, ErrorInfo(f"Simulated failure with status {status}."), kind="failure"
    )
