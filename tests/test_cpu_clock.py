"""A CPU's timed steps on the compute thread's CPU clock (issue 28, item 1: right numbers on a
shared machine). With one compute thread torch runs a call inline, so the calling thread's
CPU time is what the core spent on it; the wall time, kept beside it, also counts the time
the thread waited while another process held its core. Checked against what each clock must
say of a call that only sleeps, of one that only computes, and of one computing on a core
that a second process shares; then that the rows, metadata and the ceilings cache say which
clock timed them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from benchbatch.app.cli import app
from benchbatch.experiments import common
from benchbatch.output import ceilings_cache
from benchbatch.runtime import backend, timing
from benchbatch.runtime.timing import TimingOptions

QUICK = TimingOptions(min_repeats=5, min_time_s=0.0, warmup=1, warmup_s=0.0, l2_flush=False)
AFFINITY = hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def spin(cpu_ms: float) -> None:
    """Compute until this thread has used cpu_ms of CPU time."""
    end = time.thread_time() + cpu_ms / 1e3
    while time.thread_time() < end:
        pass


def test_one_thread_times_the_core_s_work_not_the_wait(threads):
    threads(1)
    sleeping = timing.measure(lambda: time.sleep(0.02), torch.device("cpu"), QUICK)
    assert sleeping.clock == "cpu"
    assert min(sleeping.wall_times_ms) >= 20.0  # the wall clock saw every sleep
    assert sleeping.median_ms < 5.0  # the core did (almost) nothing
    assert sleeping.core_share < 0.25
    working = timing.measure(lambda: spin(8.0), torch.device("cpu"), QUICK)
    assert all(t >= 8.0 for t in working.times_ms)
    assert all(w >= t for w, t in zip(working.wall_times_ms, working.times_ms, strict=True))
    assert 0 < working.core_share <= 1.0
    s = working.summary()
    assert s["clock"] == "cpu" and s["step_ms"] == working.median_ms
    assert s["wall_ms"] == pytest.approx(sorted(working.wall_times_ms)[2])


def test_several_threads_or_ranks_take_the_wall_clock(threads, monkeypatch):
    threads(2)
    m = timing.measure(lambda: time.sleep(0.01), torch.device("cpu"), QUICK)
    assert m.clock == "wall" and m.times_ms == m.wall_times_ms
    assert min(m.times_ms) >= 10.0
    assert m.core_share != m.core_share  # NaN: no CPU clock to compare
    threads(1)  # one thread, but a collective waits for the other ranks off its CPU clock
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    assert backend.HostTimer().clock == "wall"


@pytest.mark.skipif(not AFFINITY, reason="no CPU affinity on this platform")
def test_a_process_sharing_the_core_stretches_the_wall_clock_only(threads):
    """A busy process pinned to the compute thread's CPU takes about half its wall time;
    the CPU clock counts the call's own work, the same fixed amount each repeat."""
    threads(1)
    before = os.sched_getaffinity(0)
    cpu = min(before)
    code = "import os,sys; os.sched_setaffinity(0,{%d}); print(1, flush=True)\nwhile True: pass"
    child = subprocess.Popen([sys.executable, "-c", code % cpu], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"1"  # running, on our CPU
        os.sched_setaffinity(0, {cpu})
        m = timing.measure(lambda: spin(60.0), torch.device("cpu"), QUICK)
    finally:
        os.sched_setaffinity(0, before)
        child.kill()
        child.wait()
    assert all(60.0 <= t for t in m.times_ms)
    assert m.core_share < 0.8  # the other process held the core for a share of the time
    assert m.wall_ms > 1.25 * m.median_ms


class _Run:
    """What say_core_share reads of a run: its tables, metadata and notes."""

    def __init__(self, rows):
        self.tables = {"phases": rows}
        self.meta = {"threads": {}}
        self.notes: list[str] = []

    def write_meta(self):
        pass

    def note(self, text):
        self.notes.append(text)


def test_a_run_says_when_other_processes_held_the_core():
    nan = float("nan")
    shared = _Run([{"core_share": x} for x in (0.41, 0.47, 0.52, nan)] + [{"label": "x"}])
    common.say_core_share(shared)
    assert shared.meta["threads"]["core_share"] == 0.47  # the median of the three measured
    (note,) = shared.notes
    assert "ran 47% of the wall time (median of 3 rows)" in note and "wall_ms" in note
    quiet = _Run([{"core_share": 0.99}, {"core_share": 0.97}])
    common.say_core_share(quiet)  # an even count: the middle of the two (0.99 was said)
    assert quiet.meta["threads"]["core_share"] == pytest.approx(0.98) and quiet.notes == []
    # a simulation's rows beside real ones copy their core_share: counted once, not twice
    both = _Run([{"core_share": 0.5, "source": "real"},
                 {"core_share": 0.5, "source": "sim-matched"},
                 {"core_share": 0.9, "source": "real"}])  # fmt: skip
    common.say_core_share(both)
    assert both.meta["threads"]["core_share"] == pytest.approx(0.7)
    assert "median of 2 rows" in both.notes[0]


def test_rows_metadata_and_the_cache_key_name_the_clock(runner, tmp_path, threads):
    out = tmp_path / "run"
    args = ["phases", "--preset", "tiny", "--repeats", "3", "--min-time", "0", "--device",
            "cpu", "--no-roofline", "--prefill", "8", "--decode-batch", "1", "--context", "8",
            "--threads", "1", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["threads"]["clock"] == "cpu" and 0 < meta["threads"]["core_share"] <= 1
    assert "steps timed on its CPU clock" in " ".join(result.stderr.split())
    import pandas as pd

    rows = pd.read_csv(out / "phases.csv")
    assert set(rows["clock"]) == {"cpu"}
    assert (rows["wall_ms"] >= rows["step_ms"] * 0.99).all()  # a clock's tick of slack
    assert ((rows["core_share"] > 0) & (rows["core_share"] <= 1)).all()
    cpu = ceilings_cache.key("cpu", "fp32", "2.13.0", 1, "quiet", "cpu")
    wall = ceilings_cache.key("cpu", "fp32", "2.13.0", 1, "quiet", "wall")
    assert cpu != wall and cpu.endswith("clock cpu")
    assert backend.host_clock(1, True) == "cpu"
    assert backend.host_clock(2, True) == backend.host_clock(1, False) == "wall"
