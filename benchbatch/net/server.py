"""benchbatch's own engine behind an OpenAI-compatible API (aiohttp.web), as vLLM serves:
GET /v1/models, GET /health, POST /v1/completions and POST /v1/chat/completions (streamed as
server-sent events, or one JSON), POST /tokenize and /detokenize (vLLM's, with a tokenizer:
net/tokenize.py), GET /version and /ping.

The HTTP event loop runs on a thread of its own (ServerThread), apart from the model's
(runtime/live.py's LiveEngine): a handler parses the request, submits it to the engine's
inbox and awaits its tokens, which the model thread hands over as each step ends
(loop.call_soon_threadsafe into the handler's queue); each step's token is one SSE chunk.
A client that disconnects cancels its request (the handler is cancelled: aiohttp's
handler_cancellation), which frees its slot before the next step, or takes it off the queue.

The chunks are OpenAI's completion chunks (id, object "text_completion", created, model,
choices [{index, text, logprobs, finish_reason}]), then with stream_options.include_usage a
chunk with no choices and the usage, then `data: [DONE]`. Greedy decoding only: a
temperature other than 0 is refused. A chunk's text is the token detokenized with the
tokenizer (incrementally, as vLLM does: net/completions.py's Detokenizer), else
PLACEHOLDER with the token id; `return_token_ids: true` (vLLM's
field) adds the ids themselves. A chat completion (with a chat template: net/chat.py) streams
OpenAI's chat chunks (object "chat.completion.chunk", choices [{index, delta, logprobs,
finish_reason}]): as vLLM, a chunk naming the role (delta {"role": "assistant", "content":
""}) just before the first token's, then a delta {"content": text} a token.
Errors are OpenAI's JSON error object with its HTTP status. The request's checks, the
errors and the tokens' text are net/completions.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import threading
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from benchbatch.net.completions import (
    ApiError,
    Ask,
    Detokenizer,
    Served,
    error_response,
    parse_chat,
    parse_completion,
)
from benchbatch.runtime.cores import pin_this_thread
from benchbatch.runtime.live_request import ABORT, STOP, Refused

# A request's body is parsed on the event loop (json holds the interpreter's lock while it
# parses: a thread would not free the loop), so it is capped by what a prompt within the
# context can take: BODY_BYTES_PER_TOKEN a token (a token id with its comma is at most a
# dozen bytes; a text token escaped as JSON rarely past 50), at least MIN_BODY_BYTES, at
# most MAX_BODY_BYTES. A larger body is refused (413) as it arrives, before it is read whole.
MIN_BODY_BYTES, MAX_BODY_BYTES, BODY_BYTES_PER_TOKEN = 2**20, 64 * 2**20, 256


def body_limit(max_model_len: int) -> int:
    """The largest body (bytes) the app reads for a context of max_model_len tokens."""
    return min(MAX_BODY_BYTES, max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * max_model_len))
SERVED = web.AppKey("served", object)  # the app's Served

# --- the app ------------------------------------------------------------------------------


class _OneLine(logging.Filter):
    """aiohttp's log of a request it could not parse (a duplicate Content-Type, a bad
    header), answered 400 by aiohttp itself: one line, not a traceback in the server's
    stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            why = " ".join(str(getattr(error, "message", "") or error).split())
            record.msg = f"{record.getMessage()}: a malformed HTTP request, answered 400 ({why})"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


ONE_LINE = _OneLine()


def make_app(served: Served) -> web.Application:
    logging.getLogger("aiohttp.server").addFilter(ONE_LINE)  # once: a Filter is kept once
    limit = body_limit(served.max_model_len)
    app = web.Application(client_max_size=limit, middlewares=[_errors])
    app[SERVED] = served
    app.router.add_get("/health", _health)
    app.router.add_get("/ping", _health)  # vLLM's (SageMaker's) liveness route
    app.router.add_get("/version", _version)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    return app


@web.middleware
async def _errors(request: web.Request, handler):
    """Every error as OpenAI's JSON: ours, aiohttp's (404, 405, 413), a bug's (500),
    counted by status in the app's Served.error_responses."""
    response = await _answer(request, handler)
    if response.status >= 400:
        request.app[SERVED].error_responses[str(response.status)] += 1
    return response


async def _answer(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e.status, e.message, e.param)
    except Refused as e:
        return error_response(e.status, str(e), e.param)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(e.status, e.reason)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:  # noqa: BLE001 - a bug: the client gets a 500, not a dropped socket
        return error_response(500, f"{type(e).__name__}: {e}")


async def _body(request: web.Request):
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        s: Served = request.app[SERVED]
        raise ApiError(413, f"the request body is over {request.client_max_size:,} bytes, the "
                       f"most this server reads for its context of {s.max_model_len:,} "
                       "tokens") from None  # fmt: skip
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # a malformed, too deep or too long number
        raise ApiError(400, f"the request body is not JSON: {e}") from None


async def _health(request: web.Request) -> web.Response:
    engine = request.app[SERVED].engine
    if engine.error is not None:
        return error_response(503, f"the model thread failed: {engine.error}")
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    """vLLM's GET /version ({"version": ...}): benchbatch's, named, so a client that records
    a server's version (serve-sweep --endpoint's metadata) says which server it was."""
    from benchbatch import __version__

    return web.json_response({"version": __version__, "server": "benchbatch"})


async def _models(request: web.Request) -> web.Response:
    s: Served = request.app[SERVED]
    model = {"id": s.name, "object": "model", "created": s.created, "owned_by": "benchbatch",
             "root": s.name, "parent": None, "max_model_len": s.max_model_len}  # fmt: skip
    return web.json_response({"object": "list", "data": [model]})


async def _tokenize(request: web.Request) -> web.Response:
    from benchbatch.net.tokenize import tokenize

    return web.json_response(tokenize(await _body(request), request.app[SERVED]))


async def _detokenize(request: web.Request) -> web.Response:
    from benchbatch.net.tokenize import detokenize

    return web.json_response(detokenize(await _body(request), request.app[SERVED]))


class _Stream:
    """One request's tokens as they come from the model thread, on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.queue = loop, asyncio.Queue()

    def deliver(self, tokens: list[int], reason: str | None) -> None:  # the model's thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (tokens, reason))


async def _completions(request: web.Request) -> web.StreamResponse:
    s: Served = request.app[SERVED]
    _json_only(request)
    return await _serve(request, s, parse_completion(await _body(request), s), chat=False)


async def _chat(request: web.Request) -> web.StreamResponse:
    s: Served = request.app[SERVED]
    _json_only(request)
    return await _serve(request, s, parse_chat(await _body(request), s), chat=True)


def _json_only(request: web.Request) -> None:
    """A completion's body declared as JSON, else a 400 in vLLM's words (its
    validate_json_request: a missing Content-Type refused too)."""
    if request.headers.get("Content-Type", "").split(";")[0].strip().lower() != "application/json":
        raise ApiError(400, "Unsupported Media Type: Only 'application/json' is allowed")


async def _serve(request: web.Request, s: Served, ask: Ask, chat: bool) -> web.StreamResponse:
    stream = _Stream(asyncio.get_running_loop())
    live = s.engine.submit(ask.prompt_ids, ask.max_tokens, stream.deliver,
                           stop=ask.stop_at_eos, min_tokens=ask.min_tokens)  # fmt: skip
    head = _Head(f"{s.run}-{live.id}", int(time.time()), s.name, chat)
    ended = False
    try:
        if not ask.stream:
            response = await _whole(s, ask, head, stream)
            ended = True
            return response
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})  # fmt: skip
        with contextlib.suppress(ConnectionResetError):  # the client left mid-write
            await response.prepare(request)
            await _streamed(response, s, ask, head, stream)
            ended = True
        return response
    finally:
        if not ended:  # the client went away (the handler cancelled, a write failed)
            s.engine.cancel(live.id)


@dataclass(frozen=True)
class _Head:
    """What every chunk of one completion (or chat completion) repeats, and its choices."""

    rid: str  # RUN-ID: Served.run and the engine's request id
    created: int
    model: str
    chat: bool = False

    def chunk(self, choices: list, whole: bool = False, **extra) -> dict:
        kind = "text_completion"
        if self.chat:
            kind = "chat.completion" if whole else "chat.completion.chunk"
        return {"id": f"{'chatcmpl' if self.chat else 'cmpl'}-{self.rid}", "object": kind,
                "created": self.created, "model": self.model, "choices": choices,
                **extra}  # fmt: skip

    def choice(self, text: str, reason: str | None, whole: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                    "stop_reason": None}  # fmt: skip
        said = {"message": {"role": "assistant", "content": text}} if whole else {
            "delta": {"content": text}}  # fmt: skip
        # stop_reason: vLLM's stop string or stop token id (None at EOS); none are served
        return {"index": 0, **said, "logprobs": None, "finish_reason": reason, "stop_reason": None}


async def _streamed(response, s: Served, ask: Ask, head: _Head, stream: _Stream) -> None:
    text, produced = Detokenizer(s.tokenizer, ask.skip_special_tokens, ask.prompt_ids), 0
    def usage(n: int) -> dict:  # a chunk's: the usage so far with continuous_usage_stats
        if ask.continuous_usage:
            return {"usage": _usage(ask, n)}
        return {"usage": None} if ask.include_usage else {}

    while True:
        tokens, reason = await stream.queue.get()
        produced += len(tokens)
        piece = text.add(tokens, stopped=reason == STOP)
        choice = head.choice(piece, reason)
        if ask.return_token_ids:
            choice["token_ids"] = tokens
        if head.chat and produced == len(tokens) and (tokens or reason is not None):
            role = {"index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}  # fmt: skip
            await _send(response, head.chunk([role], **usage(0)))  # vLLM's, before the first
        if tokens or reason is not None:
            await _send(response, head.chunk([choice], **usage(produced)))
        if reason is not None:
            break
    if ask.include_usage:
        await _send(response, head.chunk([], usage=_usage(ask, produced)))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()


async def _send(response: web.StreamResponse, chunk: dict) -> None:
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


def _usage(ask: Ask, produced: int) -> dict:
    n = len(ask.prompt_ids)
    return {"prompt_tokens": n, "completion_tokens": produced, "total_tokens": n + produced}


async def _whole(s: Served, ask: Ask, head: _Head, stream: _Stream) -> web.Response:
    got: list[int] = []
    while True:
        tokens, reason = await stream.queue.get()
        got += tokens
        if reason is not None:
            break
    if reason == ABORT:
        raise ApiError(503, "the server stopped before the request finished")
    text = Detokenizer(s.tokenizer, ask.skip_special_tokens, ask.prompt_ids)
    choice = head.choice(text.add(got, stopped=reason == STOP), reason, whole=True)
    if ask.return_token_ids:
        choice["token_ids"] = got
    return web.json_response(head.chunk([choice], whole=True, usage=_usage(ask, len(got))))


# --- the HTTP thread ----------------------------------------------------------------------


def bind_address(host: str) -> str:
    """A name (localhost) binds 127.0.0.1: one socket, one port (a name with two addresses
    would get a free port each with --port 0)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return "127.0.0.1"
    return host.strip("[]")


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ServerThread:
    """The app on an event loop of its own thread (pinned to `cores` where given):
    start() returns its URL once it accepts connections; stop() closes it."""

    SHUTDOWN_S = 5.0  # handlers still running at stop() get this long to end

    def __init__(self, app: web.Application, host: str, port: int, cores=None) -> None:
        self.app, self.host, self.port, self.cores = app, host, port, cores
        self.url: str | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="benchbatch-http", daemon=True)

    def start(self, timeout: float = 300.0) -> str:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the HTTP server did not start within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self.url

    def stop(self, timeout: float = 60.0) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            pin_this_thread(self.cores)
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001 - handed to start()
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=self.SHUTDOWN_S)  # fmt: skip
        await runner.setup()
        try:
            host = bind_address(self.host)
            site = web.TCPSite(runner, host, self.port)
            await site.start()
            self.url = url_of(host, runner.addresses[0][1])
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()
