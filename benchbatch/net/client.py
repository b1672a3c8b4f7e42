"""The streaming client for OpenAI-compatible servers (vLLM, SGLang, TGI, `benchbatch serve`):
what serve-sweep --endpoint sends and how it times it (net/endpoint.py addresses the
server, net/discovery.py asks it about itself before the run).

Each request is a streaming POST /v1/completions (or /v1/chat/completions: the endpoint's
api), sent at its arrival time on the run's clock
(seconds from the moment the first request may be sent). aiohttp does HTTP; this module reads
the server-sent events off the response, line by line, and stamps every line with the clock
the moment it is read (vLLM's bench serve does the same with time.perf_counter), so a chunk's
time is when the client had it. core/streamed.py turns the stamps into the metrics.

A stamp is only as early as the client's thread: it also keeps that thread's own wait for a
core (net/waits.py), per request from its sending to its last chunk and over the run.

The asyncio loop runs in a thread of its own and hands each finished request over through a
queue: the caller's thread stays free to be interrupted, and closing the iterator (or Ctrl-C
in the caller) cancels every request still out. Every failure is a counted Streamed, never an
exception or a hang: a refused connection, an HTTP error status, a stream that stops before
[DONE] or breaks mid-chunk, a malformed chunk, a request over its timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from benchbatch.core.streamed import Streamed, error_line
from benchbatch.errors import UserError
from benchbatch.net import discovery, waits
from benchbatch.net.endpoint import (
    Endpoint,
    completion_payload,
    error_message,
    failure_reason,
)
from benchbatch.net.events import Broke, apply_event
from benchbatch.net.waits import CoreWaits

CLOSE_TIMEOUT_S = 30.0  # a hang guard: cancelling the requests takes milliseconds
READ_BUFFER_BYTES = 2**20  # the longest SSE line aiohttp reads whole (a chunk's JSON)
# The request whose task is running (None outside one): a clock or a log can tell whose
# stamp it gives (the tests' scripted clock does).
current_request: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "current_request", default=None
)


@dataclass(frozen=True)
class Prompt:
    """One request: its id, the prompt (text or token ids), its prompt length in tokens (the
    workload's) and the output tokens to ask for."""

    request_id: int
    prompt: str | list[int]
    prompt_tokens: int
    max_tokens: int


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
    core_waits: Callable[[], CoreWaits] = CoreWaits,
    realtime: bool = False,
) -> StreamRun:
    """Send each prompt at its arrival (seconds on the run's clock) and yield each request's
    Streamed as it finishes (in finishing order). max_concurrency: at most that many in
    flight; a later arrival waits for a slot (its wait is Streamed.queued_s). length_fields:
    the LENGTH_FIELDS to send; None: what server_info's probe found for this endpoint and
    model, or, where none was conclusive, a probe with the first prompt before the clock
    starts (the outcome is the run's length_fields, dropped_fields, dropped_because and
    length_probe once it has started). extra: fields merged into every request body.
    clock: the stamps' clock; core_waits: what reads the client thread's wait for a core,
    made on that thread (tests inject both). realtime: the client's thread under SCHED_FIFO
    (net/waits.realtime; net/waits.priority first: a refusal there, not mid-run)."""
    run = StreamRun(endpoint, prompts, arrivals_s, max_concurrency, extra, length_fields, clock)
    run.core_waits, run.realtime = core_waits, realtime
    return run


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
        self._waits: CoreWaits | None = None
        self.core_waits: Callable[[], CoreWaits] = CoreWaits
        self.realtime = False
        # The client thread's wait for a core over the run (from the first request's due
        # time to the last one's end), and that span's length; NaN until the run ends
        self.client_wait_s = self.client_span_s = math.nan

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
        self._waits = self.core_waits()
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
                self._waits.close()
            self._queue.put(_DONE)

    async def _run(self) -> None:
        if self.realtime:  # this thread: the loop's
            waits.realtime()
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
            waited = self._waits.now()
            tasks = [
                asyncio.create_task(
                    self._request(session, p, a, start, gate), name=f"request-{p.request_id}"
                )
                for p, a in zip(self.prompts, self.arrivals_s, strict=True)
            ]
            try:
                for done in asyncio.as_completed(tasks):
                    self._queue.put(await done)
                self.client_wait_s = self._waits.now() - waited
                self.client_span_s = self.clock() - start
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
                self.model = await discovery.served_model(session, self.endpoint)
            except UserError:
                pass

    async def _probe(self, session) -> None:
        if self.length_fields is not None or not self.prompts:
            self.length_fields = tuple(self.length_fields or ())
            return
        found = await discovery.length_fields(
            session, self.endpoint, self.model, self.prompts[0].prompt
        )
        self.length_fields = tuple(found["length_fields"])
        self.dropped_fields = tuple(found["dropped_fields"])
        self.dropped_because = found["dropped_because"]
        self.length_probe = found["length_probe"]

    async def _request(self, session, p: Prompt, arrival: float, start: float, gate) -> Streamed:
        clock = self.clock
        current_request.set(p.request_id)
        rec = Streamed(p.request_id, p.prompt_tokens, p.max_tokens, arrival, [], None, None,
                       posted=False)  # fmt: skip
        try:
            delay = arrival - (clock() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            rec.sent_s = due = clock() - start
            if gate is None:
                await self._timed(session, p, rec, start)
                return rec
            async with gate:
                rec.sent_s = clock() - start
                rec.queued_s = rec.sent_s - due
                await self._timed(session, p, rec, start)
        except asyncio.CancelledError:
            _fail(rec, "cancelled", f"cancelled by the caller after {len(rec.chunk_s)} chunks")
        rec.ended_s = clock() - start
        return rec

    async def _timed(self, session, p: Prompt, rec: Streamed, start: float) -> None:
        """_post, with the client thread's wait for a core meanwhile (rec.client_wait_s)."""
        waited = self._waits.now()
        rec.posted = True
        await self._post(session, p, rec, start)
        rec.client_wait_s = self._waits.now() - waited

    async def _post(self, session, p: Prompt, rec: Streamed, start: float) -> None:
        payload = completion_payload(
            self.model, p.prompt, p.max_tokens, self.length_fields, self.extra,
            self.endpoint.chat,
        )  # fmt: skip
        timeout_s = self.endpoint.timeout_s
        try:
            await _within(timeout_s, self._exchange(session, payload, rec, start))
        except asyncio.TimeoutError:
            _fail(rec, "timeout", f"not done within {timeout_s:g} s ({len(rec.chunk_s)} chunks)")
        except aiohttp.ClientConnectorError as e:
            _fail(rec, "refused", f"cannot connect to {self.endpoint.public}: {failure_reason(e)}")
        except Broke as e:
            _fail(rec, "stream", str(e))
        except (aiohttp.ClientError, HttpProcessingError, ValueError) as e:
            # payload errors, disconnects, bad bytes, a line longer than the read buffer
            why = failure_reason(e)
            _fail(rec, "stream", f"{type(e).__name__} after {len(rec.chunk_s)} chunks: {why}")

    async def _exchange(self, session, payload: dict, rec: Streamed, start: float) -> None:
        async with session.post(self.endpoint.api(self.endpoint.route), json=payload) as resp:
            if resp.status != 200:
                body = await resp.text(errors="replace")
                _fail(rec, "http", error_message(resp.status, body, resp.reason))
                return
            if resp.content_type == "application/json":  # one answer, not a stream
                _fail(rec, "stream", "the server answered with one JSON object, not an event "
                      "stream: it did not honour stream true")  # fmt: skip
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
                if data and apply_event(rec, "\n".join(data), stamp):
                    return
                data = []
                continue
            name, _, value = line.partition(":")
            if name != "data":
                continue  # a comment (":"), or an event/id/retry field
            if not data:
                stamp = now
            data.append(value[1:] if value.startswith(" ") else value)
        if data and apply_event(rec, "\n".join(data), stamp):
            return
        raise Broke(f"the stream ended before [DONE] after {len(rec.chunk_s)} chunks")


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
