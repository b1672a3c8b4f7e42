"""The streaming client for OpenAI-compatible servers (vLLM, SGLang, TGI, `benchbatch serve`):
what serve-sweep --endpoint sends and how it times it.

Each request is a streaming POST /v1/completions, sent at its arrival time on the run's clock
(seconds from the moment the first request may be sent). aiohttp does HTTP; this module reads
the server-sent events off the response, line by line, and stamps every line with the clock
the moment it is read (vLLM's bench serve does the same with time.perf_counter), so a chunk's
time is when the client had it. core/streamed.py turns the stamps into the metrics.

The asyncio loop runs in a thread of its own and hands each finished request over through a
queue: the caller's thread stays free to be interrupted, and closing the iterator (or Ctrl-C
in the caller) cancels every request still out. Every failure is a counted Streamed, never an
exception or a hang: a refused connection, an HTTP error status, a stream that stops before
[DONE] or breaks mid-chunk, a malformed chunk, a request over its timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp

from benchbatch.core.streamed import Streamed, error_line
from benchbatch.errors import UserError
from benchbatch.net import metrics

# The fields that make output lengths follow the workload (vLLM, SGLang): sent where the
# server accepts them (probed once, with a one-token request, before the run's clock starts).
LENGTH_FIELDS = ("ignore_eos", "min_tokens")
INFO_TIMEOUT_S = 30.0  # GET /v1/models and the other look-ups before a run
CLOSE_TIMEOUT_S = 30.0  # a hang guard: cancelling the requests takes milliseconds
READ_BUFFER_BYTES = 2**20  # the longest SSE line aiohttp reads whole (a chunk's JSON)
API_KEY_ENV = "OPENAI_API_KEY"
TIMEOUT_OPTION = "request_timeout"
_SECRET = re.compile(r"key|token|secret|pass|auth|sig|credential", re.IGNORECASE)
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+")
# The request whose task is running (None outside one): a clock or a log can tell whose
# stamp it gives (the tests' scripted clock does).
current_request: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "current_request", default=None
)


# --- the endpoint ---------------------------------------------------------------------------


def check_url(text: str, option: str = "endpoint") -> str:
    """The normalized base URL: scheme and host checked, no fragment, no trailing slash, a
    trailing /v1 (or /v1/completions, /v1/models) removed. One-line UserError otherwise."""
    text = str(text).strip()
    example = "give http://HOST[:PORT] (with or without /v1), e.g. http://127.0.0.1:8000"
    if not text:
        raise UserError(option, f"no URL: {example}")
    parts = urlsplit(text)
    shown = public_url(text)
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
    for suffix in ("/v1/completions", "/v1/models", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, parts.query, ""))


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
    the same variable)."""
    environ = os.environ if environ is None else environ
    return Endpoint(check_url(url), model or None, timeout_s, environ.get(API_KEY_ENV) or None)


# --- what the server says about itself ------------------------------------------------------


def server_info(endpoint: Endpoint, probe_fields: bool = True) -> dict:
    """What metadata records about the server: GET /v1/models (the served ids), the model
    chosen (UserError("served_model") when the name given is not served), the response
    headers that name the server and its version, GET /version where there is one (vLLM),
    whether POST /tokenize answers (vLLM's), and with probe_fields which of LENGTH_FIELDS
    the server accepts (one-token requests: a text, then token ids if the text is refused).
    No answer, a refused connection, an error status or an answer that is no model list:
    UserError("endpoint"), one line."""
    return run_in_thread(lambda: _server_info(endpoint, probe_fields))


async def _server_info(endpoint: Endpoint, probe_fields: bool) -> dict:
    timeout = aiohttp.ClientTimeout(total=min(endpoint.timeout_s, INFO_TIMEOUT_S))
    async with aiohttp.ClientSession(timeout=timeout, headers=endpoint.headers()) as session:
        status, body, headers = await _get(session, endpoint, "/v1/models")
        ids = _model_ids(endpoint, body)
        model = endpoint.model or ids[0]
        if model not in ids:
            raise UserError(
                "served_model",
                f"{model!r} is not served by {endpoint.public}: it serves {', '.join(ids)}",
            )
        entry = _model_entry(body, model)
        info = {
            "url": endpoint.public,
            "models": ids,
            "served_model": model,
            # vLLM's and benchbatch serve's /v1/models say the longest sequence; no OpenAI
            # server says its vocabulary size unless its entry carries a "vocab_size"
            "max_model_len": _whole(entry.get("max_model_len")),
            "vocab": _whole(entry.get("vocab_size")),
            "headers": version_headers(headers),
            "version": await _version(session, endpoint),
            "tokenize": await has_tokenize(session, endpoint, model),
            "metrics": await metrics.read(session, endpoint.api("/metrics")),
        }
        if probe_fields:  # a text, then token ids (for a server without a tokenizer)
            for prompt in ("Hello", [1]):
                found = await probe_length_fields(session, endpoint, model, prompt)
                if found["length_probe"] == "served":
                    break
            info |= found
        return info


async def _get(session, endpoint: Endpoint, path: str) -> tuple[int, str, Mapping[str, str]]:
    where = f"GET {endpoint.public.rstrip('/')}{path}"
    try:
        async with session.get(endpoint.api(path)) as resp:
            body = await resp.text(errors="replace")
            if resp.status != 200:
                raise UserError("endpoint", f"{where}: {error_message(resp.status, body)}")
            return resp.status, body, resp.headers
    except aiohttp.ClientConnectorError as e:
        raise UserError("endpoint", f"{where}: cannot connect ({_reason(e)})") from None
    except asyncio.TimeoutError:
        raise UserError(
            "endpoint", f"{where}: no answer within {session.timeout.total:g} s"
        ) from None
    except aiohttp.ClientError as e:
        raise UserError("endpoint", f"{where}: {_reason(e)}") from None


def _model_ids(endpoint: Endpoint, body: str) -> list[str]:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    models = data.get("data") if isinstance(data, dict) else None
    ids = [m["id"] for m in models or () if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not isinstance(models, list) or not ids:
        raise UserError(
            "endpoint",
            f"{endpoint.public}/v1/models gave no OpenAI model list "
            f"(not an OpenAI-compatible server?): {error_line(body, 80)!r}",
        )
    return ids


async def served_model(session, endpoint: Endpoint) -> str:
    """The first model of GET /v1/models (UserError("endpoint") when there is none)."""
    _, body, _ = await _get(session, endpoint, "/v1/models")
    return _model_ids(endpoint, body)[0]


def _model_entry(body: str, model: str) -> dict:
    entries = [m for m in json.loads(body)["data"] if isinstance(m, dict) and m.get("id") == model]
    return entries[0] if entries else {}


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def server_metrics(endpoint: Endpoint) -> dict:
    """GET /metrics now (net/metrics.parse); {} where the server has no such page."""

    async def get() -> dict:
        timeout = aiohttp.ClientTimeout(total=min(endpoint.timeout_s, INFO_TIMEOUT_S))
        async with aiohttp.ClientSession(timeout=timeout, headers=endpoint.headers()) as session:
            return await metrics.read(session, endpoint.api("/metrics"))

    return run_in_thread(get)


def version_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The response headers that name the server or a version (server, x-*version*, ...)."""
    keep = {}
    for name, value in headers.items():
        low = name.lower()
        if low in ("server", "x-powered-by") or "version" in low:
            keep[low] = error_line(value, 120)
    return keep


async def _version(session, endpoint: Endpoint) -> str | None:
    """vLLM's GET /version ({"version": ...}); None where the server has none."""
    try:
        async with session.get(endpoint.api("/version")) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return error_line(version, 80) if isinstance(version, str) else None


async def has_tokenize(session, endpoint: Endpoint, model: str) -> bool:
    """POST /tokenize answers with a token list (vLLM's {"count", "tokens"})."""
    try:
        data = await tokenize(session, endpoint, model, "Hello")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, LookupError):
        return False
    return isinstance(data, list)


async def tokenize(session, endpoint: Endpoint, model: str, text: str) -> list[int]:
    """Token ids of text by the server's POST /tokenize, without special tokens. Raises
    LookupError when the server answers anything but a token list."""
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    async with session.post(endpoint.api("/tokenize"), json=body) as resp:
        data = await resp.json(content_type=None) if resp.status == 200 else None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise LookupError(f"{endpoint.public}/tokenize gave no token list")
    return tokens


async def probe_length_fields(session, endpoint: Endpoint, model: str | None, prompt) -> dict:
    """Which of LENGTH_FIELDS the server accepts, by one-token streaming requests: sent with
    all; a 400 or 422 naming some drops those; one naming none is tried once without all
    (dropped if that is served). A probe with no served answer (a refused connection, a 5xx,
    a prompt the server refuses) is inconclusive: what was not named stays, and the run's own
    requests, if they fail, are counted. The answer is kept for the endpoint when conclusive
    (stream_requests then sends no probe of its own).
    Returns {"length_fields": [sent], "dropped_fields": [...], "dropped_because": message,
    "length_probe": "served" or "inconclusive: message"}."""
    fields, dropped, because, served = list(LENGTH_FIELDS), [], None, False
    while True:
        status, message = await _one_token(session, endpoint, model, prompt, fields)
        if status == 200:
            served = True
            break
        if status not in (400, 422) or not fields:
            break
        named = [f for f in fields if f in message]
        if not named:
            status, _ = await _one_token(session, endpoint, model, prompt, [])
            if status == 200:
                dropped, because, fields, served = dropped + fields, message, [], True
            break
        dropped, because = dropped + named, message
        fields = [f for f in fields if f not in named]
    found = {
        "length_fields": fields,
        "dropped_fields": dropped,
        "dropped_because": because,
        "length_probe": "served" if served else error_line(f"inconclusive: {message}"),
    }
    if served:
        _PROBED[_probe_key(endpoint, model)] = found
    return found


_PROBED: dict[tuple[str, str | None], dict] = {}  # conclusive probes, per (base URL, model)


def _probe_key(endpoint: Endpoint, model: str | None) -> tuple[str, str | None]:
    return check_url(endpoint.url), model


async def _one_token(session, endpoint, model, prompt, fields) -> tuple[int | None, str]:
    payload = completion_payload(model, prompt, 1, fields)
    try:
        async with session.post(
            endpoint.api("/v1/completions"),
            json=payload,
            timeout=aiohttp.ClientTimeout(total=endpoint.timeout_s),
        ) as resp:
            body = await resp.text(errors="replace")
            return resp.status, error_message(resp.status, body) if resp.status != 200 else ""
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return None, _reason(e)


def completion_payload(
    model: str | None, prompt, max_tokens: int, fields: Sequence[str], extra: Mapping | None = None
) -> dict:
    """The body of a streaming completion: greedy, usage in the stream, and the length
    fields in `fields` (ignore_eos, min_tokens = max_tokens); extra merged last."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
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


def _reason(e: BaseException) -> str:
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


# --- streaming the run's requests -----------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One request: its id, the prompt (text or token ids), its prompt length in tokens (the
    workload's) and the output tokens to ask for."""

    request_id: int
    prompt: str | list[int]
    prompt_tokens: int
    max_tokens: int


class _Broke(Exception):
    """A stream that broke: stopped early, a malformed or error chunk."""


_DONE = object()


def stream_requests(
    endpoint: Endpoint,
    prompts: Sequence[Prompt],
    arrivals_s: Sequence[float],
    max_concurrency: int | None = None,
    extra: dict | None = None,
    *,
    length_fields: Sequence[str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> StreamRun:
    """Send each prompt at its arrival (seconds on the run's clock) and yield each request's
    Streamed as it finishes (in finishing order). max_concurrency: at most that many in
    flight; a later arrival waits for a slot (its wait is Streamed.queued_s). length_fields:
    the LENGTH_FIELDS to send; None: what server_info's probe found for this endpoint and
    model, or, where none was conclusive, a probe with the first prompt before the clock
    starts (the outcome is the run's length_fields, dropped_fields, dropped_because and
    length_probe once it has started). extra: fields merged into every request body.
    clock: the stamps' clock (tests inject one)."""
    return StreamRun(endpoint, prompts, arrivals_s, max_concurrency, extra, length_fields, clock)


class StreamRun(Iterator[Streamed]):
    """The requests of one run, streamed: an iterator of Streamed in finishing order. close()
    (or leaving a `with` block, or an exception in the caller while it waits, Ctrl-C
    included) cancels every request still out; `cancelled` then holds every request that was
    not handed over, those cut short with error_kind "cancelled"."""

    def __init__(self, endpoint, prompts, arrivals_s, max_concurrency, extra, length_fields, clock):
        self.endpoint, self.prompts, self.clock = endpoint, list(prompts), clock
        self.arrivals_s = [float(a) for a in arrivals_s]
        self.max_concurrency, self.extra = max_concurrency, dict(extra or {})
        _check_run(self.prompts, self.arrivals_s, max_concurrency)
        self.length_fields = None if length_fields is None else tuple(length_fields)
        self.dropped_fields: tuple[str, ...] = ()
        self.dropped_because: str | None = None
        self.length_probe: str | None = None  # "served", "inconclusive: ...", None: not probed
        self.cancelled: list[Streamed] = []
        self.model: str | None = endpoint.model  # the one asked for (resolved at start)
        self._queue: queue.Queue = queue.Queue()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None
        self._handed: set[int] = set()
        self._finished = False

    def __enter__(self) -> StreamRun:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> StreamRun:
        """Start the run's thread and wait until the length fields are known (the probe,
        before the run's clock starts)."""
        if self._thread is None and not self._finished:
            self._loop = asyncio.new_event_loop()
            self._main = self._loop.create_task(self._run())
            self._thread = threading.Thread(
                target=self._serve, name="benchbatch-client", daemon=True
            )
            self._thread.start()
        while self._thread is not None and not self._ready.wait(0.5):
            if not self._thread.is_alive():
                break
        return self

    def __next__(self) -> Streamed:
        if self._finished:
            raise StopIteration
        try:
            self.start()
            item = self._take()
        except BaseException:
            self.close()
            raise
        if item is _DONE:
            self._finished = True
            self._join()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._handed.add(item.request_id)
        return item

    def _take(self):
        while True:
            try:
                return self._queue.get(timeout=0.5)  # wakes to see a thread that died
            except queue.Empty:
                if self._thread is None or not self._thread.is_alive():
                    if self._queue.empty():
                        return _DONE

    def close(self) -> None:
        """Cancel what is still out and wait for the thread (promptly: the requests' sockets
        are closed). Idempotent."""
        if self._finished:
            return
        self._finished = True
        if self._thread is not None and self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._main.cancel)
            except RuntimeError:  # the loop closed in between
                pass
        self._join()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join(CLOSE_TIMEOUT_S)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # --- on the run's thread ---

    def _serve(self) -> None:
        loop = self._loop
        try:
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # a bug, not a request's failure: the caller sees it
            self._queue.put(e)
        finally:
            self._ready.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
            self._queue.put(_DONE)

    async def _run(self) -> None:
        limit = self.max_concurrency or 0
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
        # no aiohttp timeout (its default ends a session's request at 5 minutes): each
        # request has the endpoint's own, over the whole stream
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            headers=self.endpoint.headers(),
            read_bufsize=READ_BUFFER_BYTES,
        ) as session:
            await self._resolve_model(session)
            await self._probe(session)
            self._ready.set()
            gate = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
            start = self.clock()
            tasks = [
                asyncio.create_task(
                    self._request(session, p, a, start, gate), name=f"request-{p.request_id}"
                )
                for p, a in zip(self.prompts, self.arrivals_s, strict=True)
            ]
            try:
                for done in asyncio.as_completed(tasks):
                    self._queue.put(await done)
            except asyncio.CancelledError:
                for task in tasks:
                    task.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                handed = self._handed
                self.cancelled = [
                    r for r in results if isinstance(r, Streamed) and r.request_id not in handed
                ]
                raise

    async def _resolve_model(self, session) -> None:
        """The first served model when none was named (left None if the server does not say:
        the requests then fail, counted)."""
        self.model = self.endpoint.model
        if self.model is None:
            try:
                self.model = await served_model(session, self.endpoint)
            except UserError:
                pass

    async def _probe(self, session) -> None:
        if self.length_fields is not None or not self.prompts:
            self.length_fields = tuple(self.length_fields or ())
            return
        found = _PROBED.get(_probe_key(self.endpoint, self.model)) or await probe_length_fields(
            session, self.endpoint, self.model, self.prompts[0].prompt
        )
        self.length_fields = tuple(found["length_fields"])
        self.dropped_fields = tuple(found["dropped_fields"])
        self.dropped_because = found["dropped_because"]
        self.length_probe = found["length_probe"]

    async def _request(self, session, p: Prompt, arrival: float, start: float, gate) -> Streamed:
        clock = self.clock
        current_request.set(p.request_id)
        rec = Streamed(p.request_id, p.prompt_tokens, p.max_tokens, arrival, [], None, None)
        try:
            delay = arrival - (clock() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            rec.sent_s = due = clock() - start
            if gate is None:
                await self._post(session, p, rec, start)
                return rec
            async with gate:
                rec.sent_s = clock() - start
                rec.queued_s = rec.sent_s - due
                await self._post(session, p, rec, start)
        except asyncio.CancelledError:
            _fail(rec, "cancelled", f"cancelled by the caller after {len(rec.chunk_s)} chunks")
        return rec

    async def _post(self, session, p: Prompt, rec: Streamed, start: float) -> None:
        payload = completion_payload(
            self.model, p.prompt, p.max_tokens, self.length_fields, self.extra
        )
        timeout_s = self.endpoint.timeout_s
        try:
            await _within(timeout_s, self._exchange(session, payload, rec, start))
        except asyncio.TimeoutError:
            _fail(rec, "timeout", f"not done within {timeout_s:g} s ({len(rec.chunk_s)} chunks)")
        except aiohttp.ClientConnectorError as e:
            _fail(rec, "refused", f"cannot connect to {self.endpoint.public}: {_reason(e)}")
        except _Broke as e:
            _fail(rec, "stream", str(e))
        except (aiohttp.ClientError, ValueError) as e:  # payload errors, disconnects, bad bytes
            _fail(
                rec, "stream", f"{type(e).__name__} after {len(rec.chunk_s)} chunks: {_reason(e)}"
            )

    async def _exchange(self, session, payload: dict, rec: Streamed, start: float) -> None:
        async with session.post(self.endpoint.api("/v1/completions"), json=payload) as resp:
            if resp.status != 200:
                body = await resp.text(errors="replace")
                _fail(rec, "http", error_message(resp.status, body, resp.reason))
                return
            await self._read_events(resp, rec, start)

    async def _read_events(self, resp, rec: Streamed, start: float) -> None:
        """Server-sent events: `data:` lines (several make one event), a blank line ends an
        event, `:` lines are comments. An event is stamped when its first line was read."""
        clock = self.clock
        data: list[str] = []
        stamp = now = 0.0
        async for raw in resp.content:
            if raw.strip():
                now = clock() - start  # the moment the line is read
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line:
                if data and _event(rec, "\n".join(data), stamp):
                    return
                data = []
                continue
            name, _, value = line.partition(":")
            if name != "data":
                continue  # a comment (":"), or an event/id/retry field
            if not data:
                stamp = now
            data.append(value[1:] if value.startswith(" ") else value)
        if data and _event(rec, "\n".join(data), stamp):
            return
        raise _Broke(f"the stream ended before [DONE] after {len(rec.chunk_s)} chunks")


def _event(rec: Streamed, data: str, stamp: float) -> bool:
    """Apply one event to the record; True at [DONE]."""
    if data.strip() == "[DONE]":
        if not rec.chunk_s:
            raise _Broke("[DONE] before any chunk with choices")
        return True
    try:
        chunk = json.loads(data)
    except ValueError:
        raise _Broke(
            f"a malformed chunk after {len(rec.chunk_s)}: {error_line(data, 80)!r}"
        ) from None
    if not isinstance(chunk, dict):
        raise _Broke(f"a chunk that is no JSON object: {error_line(data, 80)!r}")
    if chunk.get("error") or chunk.get("object") == "error":
        raise _Broke(f"the server sent an error mid-stream: {body_message(data)}")
    choices = chunk.get("choices")
    if choices:
        rec.chunk_s.append(stamp)
        first = choices[0] if isinstance(choices[0], dict) else {}
        text = first.get("text")
        rec.text += text if isinstance(text, str) else ""
        rec.finish_reason = first.get("finish_reason") or rec.finish_reason
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("completion_tokens"), int):
            rec.output_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            rec.server_prompt_tokens = usage["prompt_tokens"]
    return False


async def _within(seconds: float, work: Coroutine) -> None:
    """work, cancelled after seconds (asyncio.TimeoutError); in this task where asyncio can
    (3.11), so the work's context is the request's."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            await work
    else:  # Python 3.10: a task of its own, which copies the context
        await asyncio.wait_for(work, seconds)


def _fail(rec: Streamed, kind: str, message: str) -> None:
    rec.error_kind, rec.error = kind, error_line(message)


def _check_run(prompts: Sequence[Prompt], arrivals_s: Sequence[float], max_concurrency) -> None:
    assert len(prompts) == len(arrivals_s), (len(prompts), len(arrivals_s))
    assert len({p.request_id for p in prompts}) == len(prompts), "request ids repeat"
    assert all(math.isfinite(a) and a >= 0 for a in arrivals_s), "arrivals are seconds >= 0"
    if max_concurrency is not None and (
        isinstance(max_concurrency, bool)
        or not isinstance(max_concurrency, int)
        or max_concurrency < 1
    ):
        raise UserError("max_concurrency", f"must be a whole number >= 1, not {max_concurrency!r}")
