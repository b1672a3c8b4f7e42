"""serve-sweep --endpoint end to end, against a scripted OpenAI-compatible server (aiohttp)
that serves every request its max_tokens at once and fails every third one with a 500:
the rows count what the server did (sent, served, failed, output tokens from its usage),
requests.csv keeps every request with its reason, metadata names the server without the
URL's credentials, and bad endpoints are one line with exit code 2."""

from __future__ import annotations

import _thread
import asyncio
import json
import socket
import threading

import pandas as pd
import pytest
from aiohttp import web

from benchbatch.app.cli import app

MODEL = "scripted"
TEMPLATE = 5  # the tokens the scripted chat template adds to a prompt


class Scripted:
    """The server's record of what it was asked."""

    def __init__(self, fail_every: int = 3):
        self.fail_every = fail_every
        self.seen: list[dict] = []
        self.words = False  # POST /tokenize: one token a whitespace-separated word
        # (serve after, hold, then): requests past the first `serve after` seen are held
        # unanswered; once `hold` are, `then()` (a Ctrl-C in the main thread)
        self.hold_after: tuple[int, int, object] | None = None
        self.held = 0

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_get("/v1/models", self.models)
        application.router.add_post("/v1/completions", self.completions)
        application.router.add_post("/v1/chat/completions", self.chat)
        application.router.add_post("/tokenize", self.tokenize)
        return application

    async def tokenize(self, request):
        if not self.words:
            raise web.HTTPNotFound()
        words = (await request.json())["prompt"].split()
        return web.json_response({"count": len(words), "tokens": list(range(len(words)))})

    async def chat(self, request):
        """A chat stream as vLLM's: the role, then a chunk a token, usage with the prompt's
        words and a template of TEMPLATE tokens."""
        body = await request.json()
        if body["max_tokens"] > 1:
            self.seen.append(body)
        n = int(body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        deltas = [{"role": "assistant", "content": ""}] + [{"content": f" t{i}"} for i in range(n)]
        for delta in deltas:
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        prompt = len(body["messages"][0]["content"].split()) + TEMPLATE
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        chunk = {"object": "chat.completion.chunk", "choices": [], "usage": usage}
        await resp.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        return resp

    async def models(self, request):
        return web.json_response(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]},
            headers={"Server": "scripted/1.0"},
        )

    async def completions(self, request):
        body = await request.json()
        if body["max_tokens"] > 1:  # not the client's one-token probe of what it accepts
            self.seen.append(body)
        if self.hold_after and body["max_tokens"] > 1 and len(self.seen) > self.hold_after[0]:
            self.held += 1
            if self.held == self.hold_after[1]:
                self.hold_after[2]()
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.05)  # held until the client goes (then the answer is lost)
            return web.Response(status=499)
        if body["max_tokens"] > 1 and self.fail_every and len(self.seen) % self.fail_every == 0:
            error = {"error": {"message": "scripted failure", "type": "server_error"}}
            return web.json_response(error, status=500)
        n = int(body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            choice = {"index": 0, "text": f" t{i}", "finish_reason": None}
            chunk = {"id": "c", "object": "text_completion", "model": MODEL, "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if body.get("stream_options", {}).get("include_usage"):
            prompt = body["prompt"]
            usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 0,
                     "completion_tokens": n, "total_tokens": n}  # fmt: skip
            chunk = {"id": "c", "object": "text_completion", "choices": [], "usage": usage}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
def scripted():
    """The scripted server on 127.0.0.1, on its own loop in a thread; yields (url, server)."""
    server = Scripted()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def start():
        runner = web.AppRunner(server.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["port"] = runner, site._server.sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()))
    thread.daemon = True
    thread.start()
    assert started.wait(300)
    yield f"http://127.0.0.1:{box['port']}", server
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(300)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(300)


ARGS = ["--requests", "12", "--real-requests", "6", "--prompt-dist", "fixed", "--prompt-len",
        "8", "--output-dist", "fixed", "--median", "5", "--max-output", "5"]  # fmt: skip


def test_the_rows_count_what_the_server_did(runner, tmp_path, scripted):
    url, server = scripted
    out = tmp_path / "run"
    given = url.replace("http://", "http://user:secret@")
    args = ["serve-sweep", "--endpoint", given, *ARGS, "--rates", "max,50", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv")
    assert list(serve["source"]) == ["endpoint", "endpoint"]
    assert list(serve["rate"]) == ["50", "max"]
    # 12 requests after the warm-up, every third the server sees refused with a 500: 2 of
    # each point's 6.
    assert list(serve["sent"]) == [6, 6]
    assert list(serve["failed"]) == [2, 2]
    assert list(serve["requests"]) == [4, 4]
    assert list(serve["output_tokens"]) == [20, 20]  # the usage counts of the served ones
    assert not serve["within_slo"].any()  # a failed request missed its SLO
    requests = pd.read_csv(out / "requests.csv")
    requests["error"] = requests["error"].fillna("")
    assert len(requests) == 12
    errors = requests[requests["error"] != ""]
    assert len(errors) == 4 and errors["error"].str.contains("500").all()
    ok = requests[requests["error"] == ""]
    assert (ok["output_tokens"] == 5).all() and (ok["chunks"] == 5).all()
    assert (ok["e2e_s"] >= ok["ttft_s"]).all() and (ok["ttft_s"] >= 0).all()
    # the rates are over the point's whole span, failed requests' too (vLLM's duration)
    for (rate, point), row in zip(requests.groupby("rate"), serve.itertuples(), strict=True):
        end = point["sent_s"] + point["e2e_s"].where(point["error"] == "", point["ended_s"]
                                                     - point["sent_s"])  # fmt: skip
        assert str(rate) == str(row.rate)
        assert row.duration_s == pytest.approx(end.max() - point["sent_s"].min())
        assert row.request_throughput_rps == pytest.approx(row.requests / row.duration_s)
    # What was sent: one warm-up request like the first (before any point's clock), then
    # every request, each asking for its length, streamed, with usage. Each point's prompts
    # (and the warm-up's) are drawn afresh, the same lengths: a server's prefix cache
    # serves no point from another's.
    assert len(server.seen) == 1 + 12
    prompts = [tuple(body["prompt"]) for body in server.seen]
    assert len(prompts[0]) == len(prompts[1]) == 8
    warm, first, second = prompts[0], set(prompts[1:7]), set(prompts[7:])
    assert warm not in first | second and not first & second
    for body in server.seen:
        assert body["model"] == MODEL and body["stream"] is True and body["max_tokens"] == 5
        assert body["stream_options"] == {"include_usage": True}
    meta = (out / "metadata.json").read_text()
    assert "secret" not in meta and "user:" not in meta
    assert json.loads(meta)["endpoint"]["served_model"] == MODEL


def test_a_server_that_fails_every_request_is_counted_and_drawn(runner, tmp_path, scripted):
    """Every request a 500 (no point with a latency, the figure's TPOT axis had NaN for its
    top and the run ended in a traceback): exit 0, every request counted failed with its
    reason, the figure drawn, and one line saying the requests failed, not the latencies."""
    url, server = scripted
    server.fail_every = 1
    out = tmp_path / "run"
    args = ["serve-sweep", "--endpoint", url, *ARGS, "--rates", "50", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv")
    assert list(serve["sent"]) == [6] and list(serve["failed"]) == [6]
    assert list(serve["requests"]) == [0]
    # none served over a span of requests that failed: 0 per second, not NaN over nothing
    assert serve["duration_s"].iloc[0] > 0 and serve["request_throughput_rps"].iloc[0] == 0
    assert pd.read_csv(out / "requests.csv")["error"].str.contains("HTTP 500").all()
    assert (out / "serve.png").stat().st_size > 0
    assert "misses the SLO at 50 req/s: 6 of 6 requests failed (requests.csv's error" in (
        result.output)  # fmt: skip
    assert "points of 0 requests" not in result.output and "No artists" not in result.output
    assert json.loads((out / "metadata.json").read_text())["status"] == "complete"


def test_one_token_outputs_have_no_tpot_and_are_drawn(runner, tmp_path, scripted):
    """Outputs of one token have no time per output token: the figure is still drawn."""
    url, server = scripted
    server.fail_every = 0
    out = tmp_path / "run"
    one = [a if a != "5" else "1" for a in ARGS]
    args = ["serve-sweep", "--endpoint", url, *one, "--rates", "50", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv")
    assert list(serve["requests"]) == [6] and serve["tpot_p99_s"].isna().all()
    assert (out / "serve.png").stat().st_size > 0


def test_step_costs_put_the_simulation_beside_the_server(runner, tmp_path, scripted):
    url, server = scripted
    server.fail_every = 0
    costs = tmp_path / "step_cost.csv"
    pd.DataFrame(
        [{"prefill_tokens": p, "decode_tokens": d, "context_tokens": 0, "sequences": max(d, 1),
          "step_ms": 1.0 + 0.01 * p + 0.2 * d} for p in (0, 8, 64) for d in (0, 1, 4)]  # fmt: skip
    ).to_csv(costs, index=False)
    out = tmp_path / "run"
    args = ["serve-sweep", "--endpoint", url, *ARGS, "--rates", "100", "--policies",
            "continuous", "--step-costs", str(costs), "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv")
    assert sorted(serve["source"]) == ["endpoint", "sim-matched"]
    versus = pd.read_csv(out / "sim_vs_real.csv")
    assert set(versus["simulated_policy"]) == {"continuous"}
    assert (versus["policy"] == "endpoint").all()


def test_chat_sends_text_messages_and_counts_the_servers_prompt(runner, tmp_path, scripted):
    url, server = scripted
    server.words = True
    out = tmp_path / "run"
    args = ["serve-sweep", "--endpoint", url + "/v1/chat/completions", *ARGS, "--rates", "50",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv")
    assert list(serve["sent"]) == [6] and list(serve["requests"]) == [6]
    assert list(serve["token_mismatch"]) == [0]  # the role's chunk is no token
    requests = pd.read_csv(out / "requests.csv")
    assert (requests["chunks"] == 5).all() and (requests["output_tokens"] == 5).all()
    assert (requests["server_prompt_tokens"] == 8 + TEMPLATE).all()
    assert (requests["prompt_tokens"] == 8).all()
    assert len(server.seen) == 1 + 6  # the warm-up, then the point
    for body in server.seen:  # text of exactly 8 tokens by the server's /tokenize
        assert "prompt" not in body and len(body["messages"]) == 1
        assert len(body["messages"][0]["content"].split()) == 8
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["endpoint"]["api"] == "/v1/chat/completions"
    assert "/tokenize" in meta["endpoint"]["prompts"]


def test_chat_without_a_way_to_make_text_is_one_line(runner, tmp_path, scripted):
    url, server = scripted  # no /tokenize, no --tokenizer: prompts could only be token ids
    chat = url + "/v1/chat/completions"
    args = ["serve-sweep", "--endpoint", chat, *ARGS, "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--endpoint" in result.output and "--tokenizer" in result.output
    assert "Traceback" not in result.output and not server.seen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "endpoint, flag",
    [
        ("http://127.0.0.1:{free}", "--endpoint"),  # nothing listens there
        ("ftp://127.0.0.1:8000", "--endpoint"),
        ("http://", "--endpoint"),
        ("not a url", "--endpoint"),
        ("http://[::1", "--endpoint"),  # a traceback and exit 1
    ],
)
def test_a_bad_endpoint_is_one_line_and_exit_2(runner, tmp_path, endpoint, flag):
    """{free}: a port free when the test runs (picked then, not when the tests are collected:
    the same name in every pytest worker, and not taken meanwhile)."""
    endpoint = endpoint.replace("{free}", str(_free_port()))
    result = runner.invoke(app, ["serve-sweep", "--endpoint", endpoint, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output


def test_a_model_the_server_does_not_serve_is_named(runner, tmp_path, scripted):
    url, _ = scripted
    args = ["serve-sweep", "--endpoint", url, "--served-model", "other", "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--served-model" in result.output and MODEL in result.output


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--served-model", "x"], "--served-model"),  # without --endpoint
        (["--endpoint", "http://127.0.0.1:1", "--max-concurrency", "0"], "--max-concurrency"),
        (["--endpoint", "http://127.0.0.1:1", "--request-timeout", "-1"], "--request-timeout"),
        (["--endpoint", "http://127.0.0.1:1", "--real-rates", "1"], "--real-rates"),
    ],
)
def test_endpoint_options_are_checked(runner, tmp_path, extra, flag):
    result = runner.invoke(app, ["serve-sweep", *extra, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output


def test_a_server_gone_mid_sweep_stops_it_in_one_line(tmp_path, scripted):
    """The server stopped between points: the rest of the sweep counted every request
    failed ("cannot connect") and read as the server missing its SLO, status complete.
    After a point whose requests could not connect the server is asked again: still there,
    the sweep goes on; gone, one line naming --endpoint and where the points are."""
    from types import SimpleNamespace

    from benchbatch.core.streamed import Streamed
    from benchbatch.errors import UserError
    from benchbatch.experiments.serve.endpoint import _still_there
    from benchbatch.net.endpoint import make_endpoint

    url, _ = scripted
    refused = [Streamed(i, 8, 5, 0.0, [], None, None, error="cannot connect",
                        error_kind="refused") for i in range(3)]  # fmt: skip
    served = [Streamed(3, 8, 5, 0.0, [0.1], 5, 8)]
    here = SimpleNamespace(inputs=(make_endpoint(url, MODEL, 30.0), {}), folder=tmp_path)
    _still_there(here, refused + served, 4.0, None)  # a refusal, the server still there
    gone = SimpleNamespace(inputs=(make_endpoint(f"http://127.0.0.1:{_free_port()}", MODEL,
                                                 30.0), {}), folder=tmp_path)  # fmt: skip
    _still_there(gone, served, 4.0, None)  # nothing refused: not asked
    with pytest.raises(UserError) as e:
        _still_there(gone, refused + served, 4.0, 2)
    assert e.value.option == "endpoint" and "\n" not in e.value.message
    assert e.value.message.startswith("the server stopped answering during the point at 4 "
                                      "req/s, 2 in flight (3 of 4 requests could not connect")
    assert f"the points measured so far are in {tmp_path}" in e.value.message


def test_the_pooled_itl_recomputes_from_requests_csv(runner, tmp_path, scripted):
    """Every number a point prints recomputes from its files: the pooled ITL from each
    served request's chunk gaps (requests.csv's itls_s), as vLLM's --save-detailed keeps
    them (it could not be: requests.csv held only each request's longest gap)."""
    import numpy as np

    url, server = scripted
    server.fail_every = 3
    out = tmp_path / "run"
    args = ["serve-sweep", "--endpoint", url, *ARGS, "--rates", "50", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    requests = pd.read_csv(out / "requests.csv", keep_default_na=False)
    served = requests[requests["error"] == ""]
    gaps = [float(g) for cell in served["itls_s"] for g in str(cell).split()]
    assert len(gaps) == int((served["chunks"] - 1).sum()) > 0
    assert max(gaps) == pytest.approx(pd.to_numeric(served["itl_max_s"]).max(), rel=1e-12)
    (row,) = pd.read_csv(out / "serve.csv").to_dict("records")
    for q in (50, 90, 99):
        assert row[f"itl_p{q}_s"] == pytest.approx(np.percentile(gaps, q), rel=1e-9, abs=1e-12)
    assert row["itl_mean_s"] == pytest.approx(np.mean(gaps), rel=1e-9)
    assert (requests[requests["error"] != ""]["itls_s"] == "").all()


def test_requests_out_at_ctrl_c_keep_their_rows(runner, tmp_path, scripted):
    """Requests sent and unanswered when Ctrl-C came had no row in requests.csv (the ones
    served before did): each is kept, cancelled, and one never sent gets none."""
    url, server = scripted
    server.fail_every = 0
    server.hold_after = (1 + 3, 2, _thread.interrupt_main)  # the warm-up and 3 served
    out = tmp_path / "run"
    args = ["serve-sweep", "--endpoint", url, *ARGS, "--rates", "50", "--max-concurrency", "2",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 130, result.output
    requests = pd.read_csv(out / "requests.csv")
    requests["error"] = requests["error"].fillna("")
    served = requests[requests["error"] == ""]
    cancelled = requests[requests["error"].str.startswith("cancelled")]
    assert len(served) == 3 and len(cancelled) == 2, requests[["request_id", "error"]]
    assert len(requests) == 5  # the sixth waited for a free slot: never sent, no row
    assert json.loads((out / "metadata.json").read_text())["status"] == "interrupted"
