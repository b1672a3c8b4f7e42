"""The OpenAI completion request as benchbatch's server takes it (no HTTP here beyond the
error's response): checked into an Ask, refused with OpenAI's error object, and the
tokens' text, detokenized incrementally as vLLM does. net/server.py serves them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from benchbatch.runtime.live import LiveEngine

PLACEHOLDER = "<{}>"  # a token's text without a tokenizer: its id, stable and parseable
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
               413: "RequestTooLarge", 500: "InternalServerError",
               503: "ServiceUnavailableError"}  # fmt: skip


# Sampling fields that greedy decoding takes only at their neutral value (vLLM's clients
# send some: repetition_penalty 1.0).
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """OpenAI's error object (the openai client reads body["error"]["message"])."""
    kind = ERROR_TYPES.get(status, "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class Served:
    """What the app serves: the engine, its name, the context it takes, the tokenizer
    (a tokenizers.Tokenizer, or None: token-id prompts only)."""

    engine: LiveEngine
    name: str
    max_model_len: int
    tokenizer: object | None = None
    created: int = 0  # when it started serving (the model's "created")

    def __post_init__(self) -> None:
        self.created = self.created or int(time.time())


# --- requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    """A completion request, checked."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    stop_at_eos: bool
    min_tokens: int
    return_token_ids: bool


def int_field(body: dict, name: str, default: int, least: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ApiError(400, f"{name} must be an integer of at least {least}, got {value!r}", name)
    return value


def bool_field(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {value!r}", name)
    return value


def check_model(body: dict, served: Served) -> None:
    name = body.get("model")
    if name is not None and name != served.name:
        raise ApiError(404, f"The model `{name}` does not exist (this server serves "
                       f"`{served.name}`).", "model")  # fmt: skip


def prompt_ids(prompt, served: Served) -> tuple[int, ...]:
    """A prompt as token ids: given as ids, or a string tokenized (one prompt per request;
    a list of one is taken as it)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if served.tokenizer is None:
            raise ApiError(400, "this server has no tokenizer: send the prompt as a list of "
                           "token ids, or start it with --tokenizer", "prompt")  # fmt: skip
        return tuple(served.tokenizer.encode(prompt).ids)
    ok = isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    )
    if not ok:
        raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per "
                       "request)", "prompt")  # fmt: skip
    return tuple(prompt)


def parse_completion(body, served: Served) -> Ask:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    check_model(body, served)
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", "prompt")
    temperature = body.get("temperature")
    if temperature is not None and temperature != 0:
        raise ApiError(400, f"only greedy decoding is served: temperature must be 0 or absent, "
                       f"got {temperature!r}", "temperature")  # fmt: skip
    for name, neutral in NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            raise ApiError(400, f"only greedy decoding is served: {name} must be {neutral} "
                           f"or absent, got {body[name]!r}", name)  # fmt: skip
    if body.get("stop") not in (None, [], ""):
        raise ApiError(400, "stop strings are not served (outputs run to max_tokens, or to "
                       "the checkpoint's end-of-sequence token)", "stop")  # fmt: skip
    if int_field(body, "n", 1, 1) != 1:
        raise ApiError(400, "n must be 1 (one completion per request)", "n")
    if body.get("logprobs") is not None or bool_field(body, "echo", False):
        raise ApiError(400, "logprobs and echo are not served", "logprobs")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    ids = prompt_ids(body["prompt"], served)
    max_tokens = int_field(body, "max_tokens", DEFAULT_MAX_TOKENS, 1)
    served.engine.check(ids, max_tokens)  # Refused: a 400 naming the field
    return Ask(
        ids,
        max_tokens,
        bool_field(body, "stream", False),
        bool_field(options, "include_usage", False),
        not bool_field(body, "ignore_eos", False),
        int_field(body, "min_tokens", 0, 0),
        bool_field(body, "return_token_ids", False),
    )


# --- text ---------------------------------------------------------------------------------


class Detokenizer:
    """Token ids to text as they come (vLLM's incremental detokenization): each new piece is
    the text of a short window of recent ids minus the text of its older part, held back
    while it ends inside a UTF-8 character, but at most HOLD tokens (a character has at
    most 4 bytes: past that the bytes are no character, and a random-weight model makes
    such) and never past the request's last token (final)."""

    HOLD = 4

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.prefix, self.read = tokenizer, [], 0, 0

    def add(self, ids: Sequence[int], final: bool = False) -> str:
        if self.tokenizer is None:
            return "".join(PLACEHOLDER.format(t) for t in ids)
        self.ids += ids
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix : self.read], skip_special_tokens=False)
        text = decode(self.ids[self.prefix :], skip_special_tokens=False)
        partial = text.endswith("\ufffd") and len(self.ids) - self.read < self.HOLD
        if len(text) <= len(before) or (partial and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]


def text_of(tokenizer, ids: Sequence[int]) -> str:
    """The whole text of these ids (a response not streamed)."""
    if tokenizer is None:
        return "".join(PLACEHOLDER.format(t) for t in ids)
    return tokenizer.decode(list(ids), skip_special_tokens=False)
