"""`benchbatch serve`: the engine fed online (runtime/live.py) behind the OpenAI-compatible
API (net/server.py), measured by a client not written here (the `openai` package): the
streamed tokens are the in-process engine's greedy tokens under every policy, a request
that arrives mid-decode joins the next step, a client that goes away frees its slot, bad
input gets OpenAI's error JSON, bad options one line and exit 2, and the command itself
says its URL once ready and keeps what it measured when SIGTERM stops it."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.core.workload import Request
from benchbatch.experiments.server.options import ServerOptions
from benchbatch.net.completions import Served
from benchbatch.net.server import ServerThread, make_app
from benchbatch.runtime.engine import Engine, run_alone
from benchbatch.runtime.live import LiveEngine

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

HANG_S = 300  # a hang guard, never a measure of the work
ROOT = Path(__file__).resolve().parent.parent
# The command's own settings of each policy (a budget of 16 tokens, chunks of 8: prompts of
# up to 40 tokens take several steps).
POLICIES = {
    p: ServerOptions(policy=p, max_num_batched_tokens=16, chunk_size=8).settings()
    for p in ("static", "continuous", "chunked")
}


@contextlib.contextmanager
def serving(model, policy="continuous", slots=3, max_len=512, tokenizer=None, stop=(),
            chat_template=None):  # fmt: skip
    """The engine on its thread and the app on its loop, on a free port; every step row
    and request once stopped (the engine's lists)."""
    scheduler, settings = POLICIES[policy]
    engine = LiveEngine(model, scheduler, slots, max_len, settings, stop, name=policy)
    engine.start()
    assert engine.ready.wait(HANG_S) and engine.error is None
    served = Served(engine, "tiny", max_len, tokenizer, chat_template=chat_template)
    server = ServerThread(make_app(served), "127.0.0.1", 0)
    try:
        yield server.start(), engine
    finally:
        engine.close()
        engine.join(HANG_S)
        server.stop()
    assert engine.error is None


def client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=HANG_S)


def ids_of(text: str) -> list[int]:
    """The placeholder texts (no tokenizer) back to token ids."""
    return [int(t) for t in re.findall(r"<(\d+)>", text)]


def stream(c, prompt, max_tokens, **extra):
    return c.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, stream=True,
                                stream_options={"include_usage": True}, **extra)  # fmt: skip


def streamed(c, prompt, max_tokens, **extra):
    """Every chunk: the ids, the finish reasons seen and the usage."""
    chunks = list(stream(c, prompt, max_tokens, **extra))
    tokens = [t for ch in chunks for choice in ch.choices for t in ids_of(choice.text)]
    reasons = [choice.finish_reason for ch in chunks for choice in ch.choices]
    return tokens, reasons, chunks


def draw(n: int, seed: int, vocab: int = 256) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, int(rng.integers(2, 40))).tolist(), int(rng.integers(1, 24)))
            for _ in range(n)]  # fmt: skip


def alone(model, prompt, n) -> list[int]:
    return run_alone(model, Request(0, len(prompt), n, prompt_ids=tuple(prompt)))


def rows_with(rows: list[dict], column: str, rid: int) -> list[dict]:
    return [r for r in rows if str(rid) in r[column].split()]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_streamed_tokens_are_the_in_process_engines(tiny_model, policy):
    """The chunked policy is continuous batching with chunked prefill (the command's settings).
    Eight concurrent streaming requests: each gets the tokens of the in-process engine
    (Engine.run of the same requests under the same policy, and run_alone), one chunk per
    token, finish_reason length on the last, then the usage chunk with the right counts."""
    asks = draw(8, seed=3)
    requests = [Request(i, len(p), n, prompt_ids=tuple(p)) for i, (p, n) in enumerate(asks)]
    scheduler, settings = POLICIES[policy]
    batch = Engine(tiny_model, scheduler, 3, **settings).run(requests).tokens
    with serving(tiny_model, policy) as (url, engine):
        c = client(url)
        with ThreadPoolExecutor(len(asks)) as pool:
            got = list(pool.map(lambda a: streamed(c, *a), asks))
    for i, ((prompt, n), (tokens, reasons, chunks)) in enumerate(zip(asks, got, strict=True)):
        assert tokens == batch[i] == alone(tiny_model, prompt, n), (policy, i)
        assert reasons == [None] * (n - 1) + ["length"]
        assert chunks[-1].choices == []
        usage = chunks[-1].usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), n)
        assert usage.total_tokens == len(prompt) + n
    served = [r.row() for r in engine.requests]
    assert sorted(r["output_tokens"] for r in served) == sorted(n for _, n in asks)
    assert {r["status"] for r in served} == {"finished"}
    steps = pd.DataFrame(engine.step_rows)
    assert (steps["policy"] == policy).all()
    # every token after a request's first came out of exactly one step's decodes
    decoded = sum(len(r.split()) for r in steps["decodes"])
    assert decoded == sum(n - 1 for _, n in asks)
    prefill_steps = max(len(rows_with(engine.step_rows, "prefills", r.id)) for r in engine.requests)
    if policy == "chunked":  # the budget held, and long prompts were cut into chunks
        assert (steps["prefill_tokens"] + steps["decode_tokens"]).max() <= 16
        assert prefill_steps > 1
    else:
        assert prefill_steps == 1


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_a_request_arriving_mid_decode_joins_the_next_step(tiny_model, policy):
    """A decodes a long output; B, sent once A's tokens are flowing, is taken in between two
    steps and prefilled in the very next one, beside A's decode (continuous batching does
    not wait for A). Its tokens are the in-process engine's."""
    a_prompt, b_prompt = list(range(1, 12)), [7, 8, 9, 200, 3]
    with serving(tiny_model, policy, slots=2, max_len=4096) as (url, engine):
        c = client(url)
        a = stream(c, a_prompt, 4000)
        it = iter(a)
        for _ in range(3):
            next(it)
        b, _, _ = streamed(c, b_prompt, 6)
        a.close()  # A's client leaves: it would decode thousands more otherwise
        _until(lambda: engine.requests[0].status == "cancelled")
    assert b == alone(tiny_model, b_prompt, 6)
    rows = engine.step_rows
    a_id, b_id = engine.requests[0].id, engine.requests[1].id
    (joined,) = rows_with(rows, "received", b_id)
    k = rows.index(joined)
    assert b_id in map(int, joined["admitted"].split())
    assert b_id in map(int, joined["prefills"].split())
    assert a_id in map(int, joined["decodes"].split())  # A did not wait
    queued = engine.requests[1].queued_s
    assert rows[k - 1]["end_s"] <= queued <= joined["start_s"]
    assert engine.requests[1].queued_step == joined["step"]
    assert engine.requests[0].status == "cancelled"


def test_static_batching_admits_a_late_request_only_after_the_group(tiny_model):
    """Static: B, arriving while A's group runs, waits for the group's end (here A's client
    leaving ends it), then runs; its tokens are still the engine's."""
    b_prompt = [5, 6, 7]
    with serving(tiny_model, "static", slots=2, max_len=4096) as (url, engine):
        c = client(url)
        a = stream(c, [1, 2, 3], 4000)
        it = iter(a)
        next(it)
        done: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: done.put(streamed(c, b_prompt, 4)), daemon=True).start()
        _until(lambda: len(engine.requests) == 2 and engine.requests[1].queued_s is not None)
        a.close()
        b, _, _ = done.get(timeout=HANG_S)
    assert b == alone(tiny_model, b_prompt, 4)
    rows = engine.step_rows
    a_id, b_id = engine.requests[0].id, engine.requests[1].id
    (admitted,) = rows_with(rows, "admitted", b_id)
    (gone,) = rows_with(rows, "cancelled", a_id)
    assert admitted is gone  # the first step once A's slot (the group) came free
    before = rows[: rows.index(admitted)]
    assert all(b_id not in map(int, r["prefills"].split()) for r in before)


def _until(condition) -> None:
    """Wait for the server to have done something (a hang guard, not a timing)."""
    done = threading.Event()
    for _ in range(HANG_S * 100):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the server never got there")


def test_a_disconnecting_client_frees_its_slot(tiny_model):
    """One slot: A holds it, B and C queue. C's client leaves while waiting: C is taken off
    the queue, never admitted. A's client leaves mid-decode: A is stopped before the next
    step, and that step admits B into the freed slot 0."""
    with serving(tiny_model, "continuous", slots=1, max_len=4096) as (url, engine):
        c = client(url)
        a = stream(c, [1, 2, 3, 4], 4000)
        it = iter(a)
        next(it)
        done: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: done.put(streamed(c, [9, 9, 8], 5)), daemon=True).start()
        _until(lambda: len(engine.requests) == 2 and engine.requests[1].queued_s is not None)
        waiting = stream(c, [4, 4], 5)  # headers come at once: the stream is open
        _until(lambda: len(engine.requests) == 3 and engine.requests[2].queued_s is not None)
        waiting.close()
        _until(lambda: engine.requests[2].status == "cancelled")
        a.close()
        b, reasons, _ = done.get(timeout=HANG_S)
    assert b == alone(tiny_model, [9, 9, 8], 5) and reasons[-1] == "length"
    a_req, b_req, c_req = engine.requests
    assert a_req.status == "cancelled" and 1 <= a_req.output_tokens < 4000
    assert c_req.status == "cancelled" and c_req.first_token_s is None
    assert b_req.status == "finished" and b_req.output_tokens == 5
    rows = engine.step_rows
    (gone,) = rows_with(rows, "cancelled", a_req.id)
    k = rows.index(gone)
    assert a_req.id in map(int, rows[k - 1]["decodes"].split())  # decoding until it left
    assert gone["admitted"] == str(b_req.id) and gone["prefill_slots"] == "0"
    assert not any(rows_with(rows, "admitted", c_req.id))


def test_loopback_names_bind_one_address():
    from benchbatch.experiments.server.options import is_loopback
    from benchbatch.net.server import bind_address

    assert bind_address("localhost") == "127.0.0.1" and bind_address("::1") == "::1"
    assert [is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "LocalHost")] == [
        True
    ] * 5
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""))


def test_bad_requests_get_openai_errors(tiny_model):
    with serving(tiny_model, max_len=64) as (url, engine):
        c = client(url)
        cases = [
            (dict(temperature=0.7), openai.BadRequestError, 400, "temperature"),
            (dict(model="nope"), openai.NotFoundError, 404, "model"),
            (dict(max_tokens=60), openai.BadRequestError, 400, "max_tokens"),
            (dict(prompt="hello"), openai.BadRequestError, 400, "prompt"),
            (dict(prompt=[1, 2, 999]), openai.BadRequestError, 400, "prompt"),
            (dict(max_tokens=0), openai.BadRequestError, 400, "max_tokens"),
            (dict(frequency_penalty=0.5), openai.BadRequestError, 400, "frequency_penalty"),
            (dict(stop=["x"]), openai.BadRequestError, 400, "stop"),
            (dict(n=2), openai.BadRequestError, 400, "n"),
            # fields that change the output: refused, never left out (200 with other tokens)
            (dict(best_of=3), openai.BadRequestError, 400, "best_of"),
            (dict(logit_bias={"5": 100}), openai.BadRequestError, 400, "logit_bias"),
            (dict(suffix="x"), openai.BadRequestError, 400, "suffix"),
            (dict(extra_body={"stop_token_ids": [3]}), openai.BadRequestError, 400,
             "stop_token_ids"),
            (dict(extra_body={"guided_choice": ["a"]}), openai.BadRequestError, 400,
             "guided_choice"),
            (dict(extra_body={"min_tokens": 5}), openai.BadRequestError, 400, "min_tokens"),
            (dict(stream_options={"include_usage": True}), openai.BadRequestError, 400,
             "stream_options"),
            # sampling fields: greedy only, so refused (they were served greedy, unsaid)
            (dict(top_p=0.5), openai.BadRequestError, 400, "top_p"),
            (dict(extra_body={"top_k": 5}), openai.BadRequestError, 400, "top_k"),
            (dict(extra_body={"min_p": 0.1}), openai.BadRequestError, 400, "min_p"),
            (dict(seed="x"), openai.BadRequestError, 400, "seed"),
            (dict(echo=True), openai.BadRequestError, 400, "echo"),
        ]
        for change, kind, status, param in cases:
            ask = {"model": "tiny", "prompt": [1, 2, 3, 4, 5], "max_tokens": 4} | change
            with pytest.raises(kind) as e:
                c.completions.create(**ask)
            assert e.value.status_code == status, change
            assert e.value.body["param"] == param and e.value.body["code"] == status, change
        too_long = c.completions.create  # the message names both lengths
        with pytest.raises(openai.BadRequestError, match=r"5 in the prompt, 60 for max_tokens"):
            too_long(model="tiny", prompt=[1, 2, 3, 4, 5], max_tokens=60)
        with pytest.raises(openai.BadRequestError, match="token ids, or start it with --tok"):
            c.completions.create(model="tiny", prompt="hello", max_tokens=2)
        status, body = _post(url + "/v1/completions", b'{"model": "tiny", "prompt": [1, ')
        assert status == 400 and "not JSON" in body["error"]["message"]
        for bad in (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # too deep
                    b'{"prompt": [1, ' + b"9" * 5000 + b"]}"):  # a number past Python's digits
            status, body = _post(url + "/v1/completions", bad)
            assert status == 400 and "not JSON" in body["error"]["message"], body
        # a body past what a prompt within the context takes (1 MiB here): refused as it
        # comes (413), never parsed on the loop; a prompt of the whole context, indented, is
        # well within
        too_big = b'{"prompt": [' + b"1, " * 400_000 + b'1], "max_tokens": 2}'
        status, body = _post(url + "/v1/completions", too_big)
        assert status == 413 and body["error"]["type"] == "RequestTooLarge", body
        assert "over 1,048,576 bytes" in body["error"]["message"]
        assert "context of 64 tokens" in body["error"]["message"]
        whole = b'{"prompt": [' + b"1,\n            " * 62 + b'1], "max_tokens": 1}'
        assert _post(url + "/v1/completions", whole)[0] == 200
        status, body = _post(url + "/v1/completions", b"[1, 2]")
        assert status == 400 and body["error"]["type"] == "BadRequestError"
        status, body = _post(url + "/tokenize", b'{"prompt": "hi"}')
        assert status == 400 and "no tokenizer" in body["error"]["message"]
        status, body = _post(url + "/v1/nothing", b"{}")
        assert status == 404 and body["error"]["code"] == 404
        models = c.models.list()
        assert [m.id for m in models.data] == ["tiny"]
        with urllib.request.urlopen(url + "/health", timeout=HANG_S) as r:
            assert r.status == 200
        ok = c.completions.create(
            model="tiny",
            prompt=[1, 2, 3],
            max_tokens=3,
            temperature=0,
            best_of=1,
            extra_body={"repetition_penalty": 1.0, "stop_token_ids": [], "min_tokens": 3},
        )  # as vLLM's client, with the neutral values of fields not served
        assert ids_of(ok.choices[0].text) == alone(tiny_model, [1, 2, 3], 3)
        assert ok.usage.completion_tokens == 3 and ok.choices[0].finish_reason == "length"
    assert len(engine.requests) == 2  # only the two good requests reached the engine


def _post(url: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def word_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<unk>", "<s>", "hello", "world", "the", "cat", "sat", "on", "a", "mat"]
    words += [f"w{i}" for i in range(256 - len(words))]
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok


def test_text_prompts_and_tokenize_with_a_tokenizer(tiny_model, word_tokenizer):
    text = "the cat sat on a mat"
    ids = word_tokenizer.encode(text).ids
    with serving(tiny_model, tokenizer=word_tokenizer) as (url, _):
        c = client(url)
        chunks = list(stream(c, text, 7, extra_body={"return_token_ids": True}))
        status, body = _post(url + "/tokenize", json.dumps({"prompt": text}).encode())
    tokens = [t for ch in chunks for choice in ch.choices for t in choice.token_ids]
    assert tokens == alone(tiny_model, ids, 7)
    said = "".join(ch.choices[0].text for ch in chunks if ch.choices)  # the prompt continued
    assert said == word_tokenizer.decode(ids + tokens)[len(word_tokenizer.decode(ids)) :]
    assert said == " " + word_tokenizer.decode(tokens)
    assert chunks[-1].usage.prompt_tokens == len(ids)
    assert status == 200 and body == {"count": len(ids), "max_model_len": 512, "tokens": ids,
                                      "token_strs": None}  # vLLM's null unless asked


def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(tiny_model):
    """vLLM's stream_options.continuous_usage_stats (with include_usage): each chunk the
    usage up to its tokens, then the usage chunk; without include_usage, no usage at all."""
    prompt, n = [3, 1, 4, 1, 5], 5
    both = {"include_usage": True, "continuous_usage_stats": True}
    with serving(tiny_model) as (url, _):
        c = client(url)
        counted = list(c.completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                            stream=True, stream_options=both))  # fmt: skip
        plain = list(stream(c, prompt, n))
        alone_ = list(c.completions.create(model="tiny", prompt=prompt, max_tokens=n, stream=True,
                                           stream_options={"continuous_usage_stats": True}))
    so_far = [*range(1, n + 1), n]
    assert [ch.usage.completion_tokens for ch in counted] == so_far
    assert [ch.usage.total_tokens for ch in counted] == [len(prompt) + k for k in so_far]
    assert [ch.usage is None for ch in plain] == [True] * n + [False]
    assert all(ch.usage is None for ch in alone_) and len(alone_) == n


def test_response_ids_are_the_servers_and_the_requests(tiny_model):
    """A response's id is cmpl-RUN-ID: ID the request's in the engine's rows, RUN this
    server's, so two servers (or one restarted) never answer with the same id (they
    restarted at cmpl-0)."""
    runs = []
    for _ in range(2):
        with serving(tiny_model) as (url, engine):
            c = client(url)
            ids = [list(stream(c, [3, 1, 4], 2))[0].id for _ in range(2)]
            whole = c.completions.create(model="tiny", prompt=[3, 1, 4], max_tokens=2).id
        runs.append(ids + [whole])
        prefix = ids[0].rsplit("-", 1)[0]
        assert re.fullmatch(r"cmpl-[0-9a-f]{8}", prefix)
        assert runs[-1] == [f"{prefix}-{r.id}" for r in engine.requests]
    assert not set(runs[0]) & set(runs[1])


def test_end_of_sequence_stops_unless_ignored(tiny_model):
    """With the checkpoint's stop token the request ends at it (finish_reason stop), unless
    ignore_eos or min_tokens say otherwise; the slot it held serves the next request."""
    prompt = [3, 1, 4, 1, 5]
    free = alone(tiny_model, prompt, 12)
    eos = free[3]
    first = free.index(eos)
    with serving(tiny_model, slots=1, stop={eos}) as (url, engine):
        c = client(url)
        stopped, reasons, chunks = streamed(c, prompt, 12)
        ignored, ignored_reasons, _ = streamed(c, prompt, 12, extra_body={"ignore_eos": True})
        late, _, _ = streamed(c, prompt, 12, extra_body={"min_tokens": first + 2})
        held, _, _ = streamed(c, prompt, 12, extra_body={"min_tokens": first + 1})
    assert stopped == free[: first + 1] and reasons[-1] == "stop"
    assert chunks[-1].usage.completion_tokens == first + 1
    assert ignored == free and ignored_reasons[-1] == "length"
    # as vLLM's min_tokens: stop tokens held back while fewer than min_tokens came, so the
    # earliest that ends it is token min_tokens + 1
    later = [i + 1 for i, t in enumerate(free) if t == eos and i + 1 > first + 2]
    assert late == free[: later[0]] if later else free
    # the end-of-sequence token as token min_tokens itself does not end it (vLLM's)
    assert len(held) > first + 1 and held[: first + 1] == free[: first + 1]
    assert [r.finish_reason for r in engine.requests][:2] == ["stop", "length"]


@pytest.mark.parametrize(
    "args, option",
    [
        (["--port", "70000"], "--port"),
        (["--host", "0.0.0.0"], "--host"),
        (["--host", "example.com"], "--host"),
        (["--slots", "0"], "--slots"),
        (["--max-model-len", "5000"], "--max-model-len"),
        (["--policy", "chunked", "--max-num-batched-tokens", "4"], "--max-num-batched-tokens"),
        (["--tokenizer", "no-such.json"], "--tokenizer"),
    ],
)
def test_bad_options_are_one_line(runner, tmp_path, args, option):
    out = tmp_path / "run"
    argv = ["serve", "--preset", "tiny", "--device", "cpu", "--out", str(out), *args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and option in lines[0], result.output
    assert not out.exists()


def test_the_command_says_its_url_when_ready_and_keeps_its_rows_at_sigterm(tmp_path):
    """The real command in a subprocess: `listening on URL` on stderr once it accepts
    requests; a request through the openai client; SIGTERM ends it with exit 0, and
    steps.csv, requests.csv and metadata.json hold what it served."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "benchbatch", "serve", "--preset", "tiny", "--device", "cpu",
            "--port", "0", "--threads", "1", "--slots", "2", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)  # fmt: skip
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    try:
        url = None
        while url is None:
            line = lines.get(timeout=HANG_S)
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            url = found and found.group(1)
        meta = json.loads((out / "metadata.json").read_text())
        assert meta["server"]["url"] == url and meta["server"]["threads"] == 1
        if len(os.sched_getaffinity(0)) >= 2:  # the model thread and the HTTP loop apart
            model, http = meta["server"]["model_cores"], meta["server"]["http_cores"]
            assert model and http and not set(model) & set(http)
        tokens, _, chunks = streamed(client(url), [10, 20, 30], 5)
        for bad in (b'{"prompt": [1, ', b'{"prompt": [1], "temperature": 1}'):
            assert _post(url + "/v1/completions", bad)[0] == 400
        assert _post(url + "/v1/nothing", b"{}")[0] == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(tokens) == 5 and chunks[-1].usage.completion_tokens == 5
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["server"]["stopped_by"] == "signal"
    requests = pd.read_csv(out / "requests.csv")
    assert requests[["prompt_tokens", "output_tokens"]].values.tolist() == [[3, 5]]
    assert requests["status"].tolist() == ["finished"]
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == 5 and steps["prefill_tokens"].tolist()[0] == 3
    assert meta["summary"]["output_tokens"] == 5
    assert meta["summary"]["error_responses"] == {"400": 2, "404": 1}  # none reached the engine


def test_duration_ends_the_server(runner, tmp_path):
    out = tmp_path / "run"
    argv = ["serve", "--preset", "tiny", "--device", "cpu", "--port", "0", "--duration", "0.2",
            "--no-pin", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert re.search(r"listening on http://127\.0\.0\.1:\d+", result.output)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["server"]["stopped_by"] == "duration" and meta["summary"]["requests"] == 0
    assert meta["server"]["model_cores"] is None


def _bytes_tokenizer():
    """A byte-level tokenizer, one token per byte."""
    tokenizers = pytest.importorskip("tokenizers")
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok = tokenizers.Tokenizer(tokenizers.models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok


def test_text_held_inside_a_character_comes_whole():
    """"ü" is two tokens of a byte-level tokenizer: its first piece waits for the second
    (an empty piece, its chunk still sent), and bytes that never make a character are held
    (vLLM's DecodeStream the same), said with the first character after them."""
    from benchbatch.net.completions import Detokenizer

    tok = _bytes_tokenizer()
    ids = tok.encode("aü b").ids
    assert len(ids) == 5  # a, two bytes of ü, space, b
    d = Detokenizer(tok)
    assert [d.add([i]) for i in ids] == ["a", "", "ü", " ", "b"]
    stray = ids[1:2] * 6 + ids[:1]  # the first byte of ü, six times, then a
    d = Detokenizer(tok)
    pieces = [d.add([i]) for i in stray]
    assert pieces[:-1] == [""] * 6 and pieces[-1] == tok.decode(stray) == "\ufffd" * 6 + "a"


def _words_tokenizer(decoder: str):
    """A word-level tokenizer whose words carry their space: SentencePiece's (Metaspace,
    "▁world") or byte-level BPE's ("Ġworld")."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    words = ["Hello", "world", "there", "again", "you"]
    if decoder == "metaspace":
        pieces = ["<unk>", "<s>", "</s>", *("\u2581" + w for w in words)]
        vocab = {w: i for i, w in enumerate(pieces)}
        tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    else:
        spaced = [w if i == 0 else "\u0120" + w for i, w in enumerate(words)]
        vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *words, *spaced])}
        tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


@pytest.mark.parametrize("decoder", ["metaspace", "bytelevel"])
def test_a_streams_text_continues_its_prompt_as_one_decoding_of_both(decoder):
    """The text of a completion is what decoding prompt and output together adds to the
    prompt's own decoding: a SentencePiece tokenizer's first output word kept its space
    only when the stream knew the prompt (decoded alone, "▁world" is "world"); streamed
    piece by piece, in one batch of tokens, or whole, the same text."""
    from benchbatch.net.completions import Detokenizer

    tok = _words_tokenizer(decoder)
    ids = tok.encode("Hello world there again you").ids
    for cut in range(1, len(ids)):
        prompt, out = ids[:cut], ids[cut:]
        want = tok.decode(ids)[len(tok.decode(prompt)) :]
        assert want.startswith(" ") and want.strip() == tok.decode(out).strip()
        d = Detokenizer(tok, prompt_ids=prompt)
        assert "".join(d.add([i]) for i in out) == want
        assert Detokenizer(tok, prompt_ids=prompt).add(out) == want
    if decoder == "metaspace":  # without the prompt the space is lost: the old bug
        assert Detokenizer(tok).add(ids[1:]) == tok.decode(ids[1:]) == "world there again you"


def test_the_stop_token_that_ended_a_request_is_not_in_its_text():
    """vLLM leaves the stop token that ended a request out of its text even with
    skip_special_tokens false (include_stop_str_in_output false); a special token that
    did not end it is kept."""
    from benchbatch.net.completions import Detokenizer

    tok = _words_tokenizer("metaspace")
    hello, world, eos = (tok.token_to_id(w) for w in ("\u2581Hello", "\u2581world", "</s>"))
    assert Detokenizer(tok, False, [hello]).add([world, eos], stopped=True) == " world"
    assert Detokenizer(tok, False, [hello]).add([world, eos]) == " world</s>"
    assert Detokenizer(tok, True, [hello]).add([world, eos]) == " world"
    # without a tokenizer the text is the ids, every one
    assert Detokenizer(None, True, [hello]).add([world, eos], stopped=True) == f"<{world}><{eos}>"


def test_help_and_a_bad_option_import_no_torch():
    """`serve --help` and a refused option come before anything heavy is imported."""
    from test_torch_free import HEAVY, run_without

    for argv, code in ((["serve", "--help"], 0), (["serve", "--host", "0.0.0.0"], 2),
                       (["serve", "--port", "-1"], 2)):  # fmt: skip
        source = f"import sys; sys.argv = ['benchbatch', *{argv!r}]\n"
        source += "from benchbatch.app.cli import main\nmain()\n"
        done = run_without(HEAVY, source)
        assert done.returncode == code, done.stderr
        assert "blocked" not in done.stderr


def test_a_checkpoint_is_answered_under_the_path_it_was_given():
    """vLLM serves a checkpoint under the path it was given, so `vllm bench serve --model
    PATH` sends that path: it got a 404 here (the served name is the folder's)."""
    from benchbatch.net.completions import ApiError, Served, check_model

    served = Served(None, "tiny-llama", 512, aliases=("/models/tiny-llama",))
    for name in (None, "tiny-llama", "/models/tiny-llama"):
        check_model({"model": name}, served)
    with pytest.raises(ApiError) as e:
        check_model({"model": "/models/other"}, served)
    assert e.value.status == 404 and e.value.param == "model"
