"""An OpenAI-compatible server as benchbatch addresses it: its URL (checked, and shown
without credentials), the API it is asked through (completions or chat completions), its
API key, a streaming request's body, a failure's one-line text, and the thread an asyncio
look-up runs in. net/discovery.py asks the server about itself, net/client.py streams a
run's requests to it."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp

from benchbatch.core.streamed import error_line
from benchbatch.errors import UserError

API_KEY_ENV = "OPENAI_API_KEY"
TIMEOUT_OPTION = "request_timeout"
_SECRET = re.compile(r"key|token|secret|pass|auth|sig|credential", re.IGNORECASE)
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+")
# The APIs a run can be sent through, and their paths (an --endpoint URL that ends in one
# names it; the base URL: completions). "completions": a prompt (text or token ids) in, text
# out; "chat": one user message of text in (the server applies its chat template, so it
# counts more prompt tokens than the message has), the text as deltas out (vLLM's bench
# serve: --backend openai-chat).
API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def check_url(text: str, option: str = "endpoint") -> str:
    """The normalized base URL: scheme and host checked, no fragment, no trailing slash, a
    trailing /v1 (or /v1/completions, /v1/chat/completions, /v1/models) removed. One-line
    UserError otherwise."""
    text = str(text).strip()
    example = "give http://HOST[:PORT] (with or without /v1), e.g. http://127.0.0.1:8000"
    if not text:
        raise UserError(option, f"no URL: {example}")
    try:  # a bracketed host that is no IPv6 address, an unclosed bracket
        parts, shown = urlsplit(text), public_url(text)
    except ValueError as e:  # the text not echoed: it may hold credentials
        raise UserError(option, f"is not a valid URL ({e}): {example}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise UserError(option, f"{shown!r} is not an http:// or https:// URL: {example}")
    host = parts.netloc.rpartition("@")[2]
    host = host.rsplit(":", 1)[0] if not host.endswith("]") and ":" in host else host
    if not host or not _HOST.fullmatch(host):
        raise UserError(option, f"{shown!r} names no valid host: {example}")
    try:
        parts.port  # noqa: B018  (raises ValueError for a port that is no number or too large)
    except ValueError:
        raise UserError(option, f"{shown!r} has an invalid port: {example}") from None
    path = parts.path.rstrip("/")
    for suffix in (*API_PATHS.values(), "/v1/models", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, parts.query, ""))


def url_api(text: str) -> str | None:
    """The API a URL's path names (".../v1/chat/completions": "chat"), None if none."""
    try:
        path = urlsplit(str(text).strip()).path.rstrip("/")
    except ValueError:  # not a URL: check_url says so
        return None
    return next((api for api, route in API_PATHS.items() if path.endswith(route)), None)


def public_url(url: str) -> str:
    """The URL without credentials (user:password@, query parameters that name a key, token,
    secret, password or signature) and without a fragment: what metadata may record."""
    parts = urlsplit(str(url).strip())
    netloc = parts.netloc.rpartition("@")[2]
    query = [
        (k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not _SECRET.search(k)
    ]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))


@dataclass(frozen=True)
class Endpoint:
    """A server to measure: its base URL (as given; with or without /v1), the model to ask
    for (None: the first of /v1/models), the limit on one whole request, and the API key
    (OPENAI_API_KEY's when it is set, as vLLM's client; sent as a bearer token, never
    recorded nor shown)."""

    url: str
    model: str | None = None
    timeout_s: float = 600.0
    api_key: str | None = field(
        default_factory=lambda: os.environ.get(API_KEY_ENV) or None, repr=False
    )
    chat: bool = False  # requests through /v1/chat/completions, not /v1/completions

    def __post_init__(self):
        check_url(self.url)
        if not (
            isinstance(self.timeout_s, int | float)
            and math.isfinite(self.timeout_s)
            and self.timeout_s > 0
        ):
            raise UserError(
                TIMEOUT_OPTION, f"must be a positive number of seconds, not {self.timeout_s!r}"
            )

    def api(self, path: str) -> str:
        """The URL of an API path ("/v1/completions", "/tokenize"), the query kept."""
        parts = urlsplit(check_url(self.url))
        return urlunsplit((parts.scheme, parts.netloc, parts.path + path, parts.query, ""))

    @property
    def route(self) -> str:
        """The path requests are sent to: /v1/completions or /v1/chat/completions."""
        return API_PATHS["chat" if self.chat else "completions"]

    @property
    def public(self) -> str:
        return public_url(check_url(self.url))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def make_endpoint(
    url: str,
    model: str | None = None,
    timeout_s: float = 600.0,
    environ: Mapping[str, str] | None = None,
) -> Endpoint:
    """An Endpoint with the API key from OPENAI_API_KEY when it is set (vLLM's client reads
    the same variable), asked through chat completions when the URL's path names them."""
    environ = os.environ if environ is None else environ
    chat = url_api(url) == "chat"
    return Endpoint(check_url(url), model or None, timeout_s, environ.get(API_KEY_ENV) or None,
                    chat)  # fmt: skip


# --- a request's body, a failure's text -------------------------------------------------------


def completion_payload(
    model: str | None,
    prompt,
    max_tokens: int,
    fields: Sequence[str],
    extra: Mapping | None = None,
    chat: bool = False,
) -> dict:
    """The body of a streaming completion: greedy, usage in the stream, and the length
    fields in `fields` (ignore_eos, min_tokens = max_tokens); extra merged last. chat: a chat
    completion's, the prompt (text) as one user message. max_tokens either way: every server
    takes it in chat too (vLLM, SGLang, TGI, llama.cpp), where OpenAI's newer
    max_completion_tokens is not taken by all."""
    if chat and not isinstance(prompt, str):
        raise ValueError("a chat message is text, not token ids")
    asked = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    payload: dict[str, Any] = {
        "model": model,
        **asked,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if "ignore_eos" in fields:
        payload["ignore_eos"] = True
    if "min_tokens" in fields:
        payload["min_tokens"] = max_tokens
    return payload | dict(extra or {})


def error_message(status: int, body: str, reason: str | None = None) -> str:
    """'HTTP 400: the server's message' on one line."""
    message = body_message(body) or reason
    return error_line(f"HTTP {status}: {message}" if message else f"HTTP {status}")


def body_message(body: str) -> str:
    """The message of an OpenAI ({"error": {"message"}}), vLLM ({"message"}), TGI
    ({"error": "..."}) or FastAPI ({"detail"}) error body; the body itself otherwise."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    message = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or data.get("message") or data.get("detail")
    return error_line(message if message else body.strip())


def failure_reason(e: BaseException) -> str:
    """A client-side failure (a timeout, a refused connection, a broken stream) on one line."""
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    if isinstance(e, aiohttp.ClientConnectorError):
        return error_line(e.os_error.strerror or e.os_error or e, 120)
    return error_line(str(e) or type(e).__name__, 120)


def run_in_thread(make: Callable[[], Coroutine]):
    """asyncio.run(make()) in a thread of its own (the caller may hold a running loop)."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = asyncio.run(make())
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="benchbatch-http", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
