"""Numbers right by default on a shared machine (issue 28, item 1): a CPU run chooses its
compute threads (one on a small or busy machine, else one per physical core the load leaves
free), pins its compute thread, says both, warns when other processes compete, and the noise
warnings name the load and --threads 1 when the load is the likely cause."""

from __future__ import annotations

import json
import os

import pytest
import torch

from benchbatch.app.cli import app
from benchbatch.core import machine, noise
from benchbatch.runtime import device

pytestmark = pytest.mark.usefixtures("one_thread")

AFFINITY = hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")


def test_one_thread_on_a_small_or_busy_machine_else_one_per_free_core():
    assert machine.choose_threads(2, 3.1) == (
        1,
        "threads: 1 (2 cores, load 3.1: one thread measures best on a shared machine; "
        "--threads N to choose)",
    )
    assert machine.choose_threads(2, 0.0)[0] == 1  # two cores: one thread, even when quiet
    assert machine.choose_threads(1, None)[0] == 1
    assert machine.choose_threads(8, 4.1)[0] == 1  # 0.51 per core: busy
    # Quiet enough: the cores the load does not take, rounded up to whole cores.
    assert machine.choose_threads(8, 4.0)[0] == 4  # exactly 0.5 per core is not busy
    assert machine.choose_threads(8, 2.2)[0] == 8 - 3
    assert machine.choose_threads(16, 0.0)[0] == 16
    assert "one per physical core the load leaves free" in machine.choose_threads(16, 0.0)[1]
    assert machine.choose_threads(16, None)[0] == 16  # no load average: nothing says busy


def test_the_load_class_takes_the_runs_own_threads_off_the_load():
    assert machine.load_class(None, 2) == "unknown"
    assert machine.load_class(1.0, 2) == "quiet"  # 0.5 per core
    assert machine.load_class(1.2, 2) == "busy"
    assert machine.load_class(2.0, 2, own_threads=1) == "quiet"  # (2 - 1) / 2 = 0.5
    assert machine.load_class(2.2, 2, own_threads=1) == "busy"


def test_hyperthreads_of_one_core_count_once(monkeypatch):
    topology = {0: ("0", "0"), 1: ("0", "0"), 2: ("0", "1"), 3: ("0", "1"), 4: ("1", "0")}
    monkeypatch.setattr(machine, "core_of", topology.__getitem__)
    cores = machine.physical_cores([0, 1, 2, 3, 4])
    assert list(cores.values()) == [[0, 1], [2, 3], [4]]
    monkeypatch.setattr(machine, "usable_cpus", lambda: [0, 1, 2, 3, 4])
    assert machine.core_count() == 3


def test_the_noise_hint_names_the_load_when_it_is_the_likely_cause():
    busy = noise.noisy_hint(3.1, 2)
    assert "load average is 3.1 on 2 physical cores" in busy
    assert "--threads 1" in busy and "close other work" in busy
    assert noise.REPEATS_HINT in busy  # the old advice still follows
    assert noise.noisy_hint(0.4, 2) == noise.REPEATS_HINT  # quiet: repeats average it out
    assert noise.noisy_hint(1.5, 2) == noise.REPEATS_HINT  # this run's own thread is 1 of it
    assert "--threads 1" in noise.noisy_hint(0.1, 8, threads=4)
    # A busy machine and a run already on one pinned thread: the advice is not what it did.
    one = noise.noisy_hint(3.1, 2, threads=1)
    assert "--threads 1" not in one and "close other work" in one and "already" in one
    assert "--threads 1" in noise.noisy_hint(3.1, 2, threads=2)


def test_the_noisy_warning_takes_the_runs_own_threads(monkeypatch):
    from benchbatch.output import render

    monkeypatch.setattr(machine, "load_average", lambda: [3.1, 3.0, 3.0])
    monkeypatch.setattr(machine, "core_count", lambda: 2)
    said = []
    monkeypatch.setattr(render, "warning", said.append)
    for threads in (1, 2):
        meta = {"threads": {"threads": threads}}
        render.warn_untrusted({"noisy": ["decode b=1"]}, render.run_threads(meta))
    assert "--threads 1" not in said[0] and "already computes on one thread" in said[0]
    assert "run with --threads 1" in said[1]
    assert render.run_threads({}) is None


@pytest.mark.skipif(not AFFINITY, reason="no CPU affinity on this platform")
def test_the_default_pins_one_thread_and_gives_the_cpus_back(monkeypatch):
    before = os.sched_getaffinity(0)
    monkeypatch.setattr(machine, "load_average", lambda: [9.0, 9.0, 9.0])  # busy anywhere
    threads = device.apply_threads(torch.device("cpu"), None)
    try:
        assert threads.threads == 1 and torch.get_num_threads() == 1
        assert threads.chosen == "default" and threads.load_class == "busy"
        assert threads.pinned is not None and len(threads.pinned) == 1
        assert os.sched_getaffinity(0) == set(threads.pinned)
        assert threads.pinned[0] in before
        assert threads.reason.startswith("threads: 1 (")
    finally:
        threads.restore()
    assert os.sched_getaffinity(0) == before


def test_threads_given_are_kept_and_said(monkeypatch):
    monkeypatch.setattr(machine, "load_average", lambda: [0.0, 0.0, 0.0])
    threads = device.apply_threads(torch.device("cpu"), 1)
    try:
        assert threads.chosen == "--threads" and torch.get_num_threads() == 1
        assert threads.to_dict()["reason"].startswith("threads: 1 (--threads;")
    finally:
        threads.restore()


def _phases(runner, out, *extra):
    args = ["phases", "--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device",
            "cpu", "--no-roofline", "--prefill", "8", "--decode-batch", "1", "--context", "8",
            "--out", str(out), *extra]  # fmt: skip
    return runner.invoke(app, args)


def test_a_cpu_run_says_its_threads_and_warns_on_a_busy_machine(runner, tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "load_average", lambda: [50.0, 50.0, 50.0])
    before = os.sched_getaffinity(0) if AFFINITY else None
    result = _phases(runner, tmp_path / "busy")
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    meta = json.loads((tmp_path / "busy" / "metadata.json").read_text())
    t = meta["threads"]
    assert t["threads"] == 1 and t["chosen"] == "default" and t["load_class"] == "busy"
    assert t["load_average"] == 50.0 and t["physical_cores"] == machine.core_count()
    assert t["reason"] in err
    assert "one thread measures best on a shared machine" in err
    assert "warning: the machine is busy: load average 50.0" in err and "close other work" in err
    if AFFINITY:
        assert len(t["pinned_cpus"]) == 1 and "pinned to CPU" in err
        assert os.sched_getaffinity(0) == before  # given back when the run ends


def test_the_busy_warning_says_the_clock_the_steps_are_timed_on():
    """Under torchrun (several ranks, none pinned) the steps are on the wall clock: the
    warning said they count the thread's own CPU time, which the run's note contradicted."""
    cpu = machine.busy_warning(5.0, 2, 1)
    wall = machine.busy_warning(5.0, 2, 1, cpu_clock=False)
    assert "timed steps count the compute thread's own CPU time" in cpu
    assert "timed on the wall clock" in wall and "own CPU time" not in wall
    assert machine.busy_warning(0.1, 2, 1, cpu_clock=False) is None  # quiet: nothing


def test_threads_past_the_cores_are_warned_about(runner, tmp_path, monkeypatch):
    """--threads past the physical cores the process may use: a warning naming both (the
    audit's --threads 1000 on 2 cores ran a 16-token prefill ~300x slower, unsaid)."""
    monkeypatch.setattr(machine, "load_average", lambda: [0.0, 0.0, 0.0])
    monkeypatch.setattr(machine, "physical_cores", lambda: {0: [0]})  # one core
    result = _phases(runner, tmp_path / "over", "--threads", "2")
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    assert "warning: --threads 2 is more than the 1 physical core this process may use" in err
    assert "(at most 1 measures it)" in err
    result = _phases(runner, tmp_path / "within", "--threads", "1")
    assert result.exit_code == 0 and "is more than the" not in result.stderr


def test_a_load_that_rises_during_the_run_is_warned_about(runner, tmp_path, monkeypatch):
    out = tmp_path / "rise"
    # Quiet until the run has written its first rows, busy from then on.
    monkeypatch.setattr(
        machine, "load_average", lambda: [40.0] * 3 if (out / "phases.csv").exists() else [0.0] * 3
    )
    result = _phases(runner, out)
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    assert "the machine is busy" not in err
    assert "the load average rose from 0.0 to 40.0 during the run" in err
    assert json.loads((out / "metadata.json").read_text())["threads"]["load_class"] == "quiet"


def test_noisy_rows_on_a_busy_machine_get_the_thread_advice(monkeypatch, capsys):
    from benchbatch.output import render

    monkeypatch.setattr(machine, "load_average", lambda: [30.0, 30.0, 30.0])
    render.warn_untrusted({"noisy": ["decode b=1"]})
    err = " ".join(capsys.readouterr().err.split())
    assert "noisy (CV over 10%, or timed once): decode b=1" in err
    assert "--threads 1" in err and "load average is 30.0" in err
    monkeypatch.setattr(machine, "load_average", lambda: [0.0, 0.0, 0.0])
    render.warn_untrusted({"noisy": ["decode b=1"]})
    err = " ".join(capsys.readouterr().err.split())
    assert "try more --repeats or --min-time." in err and "--threads" not in err


def test_the_recorded_torch_version_keeps_its_build_tag(monkeypatch):
    """metadata's torch_version is the imported torch's own (2.13.0+cpu, 2.14.1+cu130: which
    build ran), where a wheel's metadata may drop the tag; a package not imported is read
    from its metadata."""
    import sys
    import types
    from importlib import metadata

    assert machine.version("torch") == torch.__version__
    monkeypatch.setitem(sys.modules, "fakepkg", types.SimpleNamespace(__version__="1.2.3+cu999"))
    assert machine.version("fakepkg") == "1.2.3+cu999"
    assert machine.version("typer") == metadata.version("typer")  # typer keeps no tag
    assert machine.version("no-such-package-here") is None
