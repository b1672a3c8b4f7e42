"""The OpenAI completion and chat completion requests as benchbatch's server takes them (no
HTTP here beyond the error's response): checked into an Ask (a chat's messages through the
chat template, net/chat.py), refused with OpenAI's error object, and the tokens' text,
detokenized incrementally as vLLM does. net/server.py serves them."""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

from benchbatch.net import lax
from benchbatch.runtime.live import LiveEngine
from benchbatch.runtime.live_request import Refused

PLACEHOLDER = "<{}>"  # a token's text without a tokenizer: its id, stable and parseable
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
               413: "RequestTooLarge", 500: "InternalServerError",
               503: "ServiceUnavailableError"}  # fmt: skip


# Sampling fields that greedy decoding takes only at their neutral value (vLLM's clients
# send some: repetition_penalty 1.0).
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1,
           "top_p": 1, "min_p": 0}  # fmt: skip
# top_k's neutral values (vLLM: -1 or 0, no cut).
TOP_K_NEUTRAL = (-1, 0)
# Chat fields that change the prompt the template renders, served only at vLLM's default
# (a request's own template, continuing its last message): refused otherwise.
CHAT_DEFAULTS = {"chat_template": None, "continue_final_message": False}
# Fields of OpenAI's and vLLM's requests that change what is generated or returned, which
# greedy decoding of one completion does not serve: refused where given (not left out, so
# the tokens a benchmark gets are never other than it asked for). Absent, null, false, 0,
# an empty list or object pass; so do best_of 1 and response_format {"type": "text"}.
UNSERVED = ("stop_token_ids", "logit_bias", "allowed_token_ids", "bad_words", "best_of",
            "use_beam_search", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
            "structured_outputs", "response_format", "truncate_prompt_tokens",
            "prompt_logprobs", "suffix", "top_logprobs")  # fmt: skip


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
    chat_template: object | None = None  # net/chat.ChatTemplate (None: no chat completions)
    aliases: tuple[str, ...] = ()  # other names a request may give it (the checkpoint's path)
    # Every answer with an HTTP error status, by status ("400": 3): bad requests, unknown
    # paths, and the 503s of requests aborted when the server stopped (requests.csv has
    # those as aborted). The server's summary holds them, so a client's failures can be
    # matched against them.
    error_responses: Counter = field(default_factory=Counter)
    # Response ids are cmpl-RUN-ID (chatcmpl- for chat), ID the request's in requests.csv
    # and steps.csv, RUN this server's own: unique across restarts, as vLLM's random ones.
    run: str = field(default_factory=lambda: secrets.token_hex(4))

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
    skip_special_tokens: bool = True  # the text leaves them out, as vLLM's default
    continuous_usage: bool = False  # every chunk with the usage so far (include_usage too)


def int_field(body: dict, name: str, default: int, least: int) -> int:
    """body[name] as an integer of at least `least` (read as vLLM's pydantic reads it:
    5.0 and "5" are 5), else a 400 naming it."""
    value = body.get(name, default)
    if value is None:
        return default
    try:
        number = lax.as_int(value)
    except ValueError:
        number = None
    if number is None or number < least:
        raise ApiError(400, f"{name} must be an integer of at least {least}, got {value!r}", name)
    return number


def bool_field(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    try:
        return lax.as_bool(value)
    except ValueError:
        raise ApiError(400, f"{name} must be true or false, got {value!r}", name) from None


def _number(body: dict, name: str, kind=None):
    """body[name] as a float (kind lax.as_int: an integer), None where absent; a 400
    naming it where it is none."""
    value = body.get(name)
    if value is None:
        return None
    try:
        return (kind or lax.as_float)(value)
    except ValueError:
        what = "an integer" if kind is lax.as_int else "a number"
        raise ApiError(400, f"{name} must be {what}, got {value!r}", name) from None


def check_model(body: dict, served: Served) -> None:
    name = body.get("model")
    if name is not None and name != served.name and name not in served.aliases:
        raise ApiError(404, f"The model `{name}` does not exist (this server serves "
                       f"`{served.name}`).", "model")  # fmt: skip


def prompt_ids(prompt, served: Served, special: bool = True) -> tuple[int, ...]:
    """A prompt as token ids: given as ids, or a string tokenized (one prompt per request;
    a list of one is taken as it), with the tokenizer's special tokens (its BOS) unless
    `special` is false (the request's add_special_tokens, as vLLM)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if served.tokenizer is None:
            raise ApiError(400, "this server has no tokenizer: send the prompt as a list of "
                           "token ids, or start it with --tokenizer", "prompt")  # fmt: skip
        return tuple(served.tokenizer.encode(prompt, add_special_tokens=special).ids)
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
    check_greedy(body)
    if body.get("logprobs") is not None:
        raise ApiError(400, "logprobs are not served", "logprobs")
    if bool_field(body, "echo", False):
        raise ApiError(400, "echo is not served", "echo")
    ids = prompt_ids(body["prompt"], served, bool_field(body, "add_special_tokens", True))
    return ask_for(body, served, ids, int_field(body, "max_tokens", DEFAULT_MAX_TOKENS, 1))


def parse_chat(body, served: Served) -> Ask:
    """A chat completion: its messages rendered by the chat template and tokenized without
    special tokens (the template writes its own); max_completion_tokens, else max_tokens
    (no default but the context left, as vLLM)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    check_model(body, served)
    check_greedy(body)
    if body.get("logprobs") not in (None, False):
        raise ApiError(400, "logprobs are not served", "logprobs")
    ids = chat_prompt_ids(body, served)
    given = body.get("max_completion_tokens") is not None
    name = "max_completion_tokens" if given else "max_tokens"
    left = max(1, served.max_model_len - len(ids))
    if given:  # the other checked all the same
        int_field(body, "max_tokens", left, 1)
    return ask_for(body, served, ids, int_field(body, name, left, 1), "messages")


def chat_prompt_ids(body: dict, served: Served) -> tuple[int, ...]:
    """A chat request's messages as the prompt's token ids (a chat completion's, and
    /tokenize's given messages): rendered by the server's chat template with the request's
    add_generation_prompt and chat_template_kwargs, tokenized with add_special_tokens
    (default false, vLLM's chat default); tools and another template refused."""
    if served.chat_template is None or served.tokenizer is None:
        raise ApiError(400, "this server has no chat template: start it with --chat-template "
                       "FILE, or serve a checkpoint whose tokenizer_config.json has one (or "
                       "use /v1/completions)", "messages")  # fmt: skip
    messages = chat_messages(body.get("messages"))
    for name in ("tools", "tool_choice"):
        if body.get(name) not in (None, [], "none"):
            raise ApiError(400, f"{name} is not served (no tool calls)", name)
    for name, default in CHAT_DEFAULTS.items():
        if body.get(name) not in (None, default):
            raise ApiError(400, f"{name} is not served (the server's chat template renders "
                           "every request, its assistant turn opened)", name)  # fmt: skip
    generation = bool_field(body, "add_generation_prompt", True)
    kwargs = template_kwargs(body.get("chat_template_kwargs"))
    try:
        text = served.chat_template.render(messages, generation, kwargs)
    except ValueError as e:
        raise ApiError(400, str(e), "messages") from None
    special = bool_field(body, "add_special_tokens", False)  # vLLM's chat default
    return tuple(served.tokenizer.encode(text, add_special_tokens=special).ids)


# What the template is rendered with (chat_template_kwargs may not set them).
RESERVED = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


def template_kwargs(value) -> dict:
    """A request's chat_template_kwargs (Qwen3's enable_thinking...), passed to the template
    as vLLM does: an object of names, none of those the server renders with."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ApiError(400, "chat_template_kwargs must be an object", "chat_template_kwargs")
    taken = sorted(RESERVED.intersection(value))
    if taken:
        raise ApiError(400, f"chat_template_kwargs may not set {', '.join(taken)}",
                       "chat_template_kwargs")  # fmt: skip
    return value


def chat_messages(messages) -> list[dict]:
    """The messages as the template takes them: a role and a text each (a content given as
    text parts joined by newlines, as vLLM's "string" content format)."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, "each message must be an object with a role", "messages")
        content = m.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content) or \
                    not all(isinstance(t, str) for t in parts):  # fmt: skip
                raise ApiError(400, "only text content parts are served", "messages")
            content = "\n".join(parts)
        if content is not None and not isinstance(content, str):
            raise ApiError(400, "a message's content must be text", "messages")
        out.append({"role": m["role"], "content": content or ""})
    return out


def check_greedy(body: dict) -> None:
    """Greedy decoding of one completion with no stop strings: anything else refused."""
    temperature = _number(body, "temperature")
    if temperature is not None and temperature != 0:
        raise ApiError(400, f"only greedy decoding is served: temperature must be 0 or absent, "
                       f"got {body['temperature']!r}", "temperature")  # fmt: skip
    for name, neutral in NEUTRAL.items():
        value = _number(body, name)
        if value is not None and value != neutral:
            raise ApiError(400, f"only greedy decoding is served: {name} must be {neutral} "
                           f"or absent, got {body[name]!r}", name)  # fmt: skip
    top_k = _number(body, "top_k", lax.as_int)
    if top_k is not None and top_k not in TOP_K_NEUTRAL:
        raise ApiError(400, "only greedy decoding is served: top_k must be -1, 0 or absent, "
                       f"got {body['top_k']!r}", "top_k")  # fmt: skip
    _number(body, "seed", lax.as_int)  # any integer: greedy decoding draws nothing
    if body.get("stop") not in (None, [], ""):
        raise ApiError(400, "stop strings are not served (outputs run to max_tokens, or to "
                       "the checkpoint's end-of-sequence token)", "stop")  # fmt: skip
    if int_field(body, "n", 1, 1) != 1:
        raise ApiError(400, "n must be 1 (one completion per request)", "n")
    for name in UNSERVED:
        value = body.get(name)
        if value in (None, False, 0, [], {}, "") or (name == "best_of" and value == 1) or (
                name == "response_format" and value == {"type": "text"}):  # fmt: skip
            continue
        raise ApiError(400, f"{name} is not served (greedy decoding of one completion, "
                       "to max_tokens or end-of-sequence)", name)  # fmt: skip


def ask_for(body: dict, served: Served, ids: tuple[int, ...], max_tokens: int,
            prompt: str = "prompt") -> Ask:  # fmt: skip
    """The Ask of a request whose prompt ids and max_tokens are known: checked by the
    engine (Refused: a 400 naming the field; `prompt` the field the prompt came in), with
    the stream's and the length's fields."""
    options = body.get("stream_options")
    stream = bool_field(body, "stream", False)
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    if options and not stream:  # as vLLM
        raise ApiError(400, "stream_options can only be given with stream true", "stream_options")
    least = int_field(body, "min_tokens", 0, 0)
    if least > max_tokens:
        raise ApiError(400, f"min_tokens {least} is more than max_tokens {max_tokens}",
                       "min_tokens")  # fmt: skip
    try:
        served.engine.check(ids, max_tokens)
    except Refused as e:
        raise Refused(str(e), prompt if e.param == "prompt" else e.param, e.status) from None
    usage = bool_field(options or {}, "include_usage", False)
    return Ask(
        ids,
        max_tokens,
        stream,
        usage,
        not bool_field(body, "ignore_eos", False),
        least,
        bool_field(body, "return_token_ids", False),
        bool_field(body, "skip_special_tokens", True),
        usage and bool_field(options or {}, "continuous_usage_stats", False),  # as vLLM
    )


# --- text ---------------------------------------------------------------------------------


class Detokenizer:
    """Token ids to text as they come, as vLLM detokenizes them: tokenizers' DecodeStream
    primed with the prompt's ids (so the first piece keeps the space a SentencePiece
    tokenizer writes before a word), one step a token, a piece held back (empty) while it
    ends inside a UTF-8 character. A request that ended on its own stop token leaves that
    token out of its text (vLLM's include_stop_str_in_output, false), and the whole text of
    a request not streamed is its pieces joined, as vLLM's (never another decoding)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True,
                 prompt_ids: Sequence[int] = ()) -> None:  # fmt: skip
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.stream = self._stream(list(prompt_ids))

    def _stream(self, ids: list[int]):
        if self.tokenizer is None:
            return None
        from tokenizers.decoders import DecodeStream

        return DecodeStream(ids=ids, skip_special_tokens=self.skip)

    def add(self, ids: Sequence[int], stopped: bool = False) -> str:
        """The text of these new ids; stopped: the last of them is the stop token that
        ended the request (left out of a tokenizer's text)."""
        if self.tokenizer is None:  # every id, the stop token's too: the text is the ids
            return "".join(PLACEHOLDER.format(t) for t in ids)
        return "".join(self._step(t) for t in list(ids[:-1] if stopped else ids))

    def _step(self, token: int) -> str:
        try:
            return self.stream.step(self.tokenizer, token) or ""
        except Exception as e:  # noqa: BLE001 - tokenizers raises a plain Exception
            if not str(e).startswith("Invalid prefix encountered"):
                raise
            # A decoding that is not monotonic (invalid UTF-8 runs) breaks the stream's
            # state: vLLM starts a new one, unprimed, and goes on.
            self.stream = self._stream([])
            return self.stream.step(self.tokenizer, token) or ""
