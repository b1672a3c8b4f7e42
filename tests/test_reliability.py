"""What benchbatch guarantees about results: an interrupted run keeps what it measured,
folders are never overwritten, metadata carries a schema version, untrustworthy rows are
flagged (noisy, throttled) and warned about, and simulations are deterministic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.errors import UserError
from benchbatch.output import csv_rows, results
from benchbatch.output import recorder as runs
from benchbatch.output.run_folder import Run
from benchbatch.runtime import steps, telemetry

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--preset", "tiny", "--device", "cpu", "--no-roofline"]
FAST = [*TINY, "--repeats", "1", "--min-time", "0"]
SLOW = [*TINY, "--repeats", "1", "--min-time", "0.3"]  # each step lasts 0.3 s at least


def meta_of(folder: Path) -> dict:
    return json.loads((folder / "metadata.json").read_text())


def leftovers(folder: Path) -> list[str]:
    """Anything a write stopped halfway could leave: hidden or temporary names."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name]


# --- interrupts of real runs, in a subprocess ---------------------------------------------


def start(args: list[str]) -> subprocess.Popen:
    # SIGINT as a terminal's Ctrl-C delivers it, even if this test runs where it is ignored.
    return subprocess.Popen(
        [sys.executable, "-m", "benchbatch", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


# A guard against a hung run, not a measure of the work: at load 8 or more, the first row of
# a run (its estimate, its first steps) took over 60 s here, and a 60 s wait failed the test.
HANG_S = 900


def wait_for_rows(proc: subprocess.Popen, csv: Path, rows: int = 1, timeout: float = HANG_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if csv.exists() and len(csv.read_text().splitlines()) > rows:
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {csv.name} had {rows} row(s): {proc.stderr.read()}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"no row in {csv} after {timeout} s")


def stop(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG_S)
    return proc.returncode, err


def check_interrupted(folder: Path, code: int, err: str, table: str, at_least: int) -> None:
    assert code == 130, err
    assert "Traceback" not in err and "interrupted" in err
    meta = meta_of(folder)
    assert meta["status"] == "interrupted" and "finished_utc" in meta
    assert meta["schema_version"] == results.SCHEMA_VERSION
    df = pd.read_csv(folder / f"{table}.csv")
    assert len(df) >= at_least
    assert not leftovers(folder)


# 40 steps of 0.3 s or more: the run lasts long enough to be interrupted mid-way.
MANY_BATCHES = ",".join(str(b) for b in range(1, 41))
MANY_CONTEXTS = ",".join(str(8 * c) for c in range(1, 21))


def test_ctrl_c_keeps_the_measured_rows_and_json_says_them(tmp_path):
    """--json interrupted printed nothing (a script's json.loads failed): it prints what
    was measured, as result.json has it, with the status."""
    out = tmp_path / "run"
    shape = ["--prefill", "8", "--decode-batch", MANY_BATCHES, "--context", "8"]
    proc = start(["phases", *SLOW, *shape, "--json", "--out", str(out)])
    wait_for_rows(proc, out / "phases.csv")
    proc.send_signal(signal.SIGINT)
    printed, err = proc.communicate(timeout=HANG_S)
    check_interrupted(out, proc.returncode, err, "phases", at_least=1)
    df = pd.read_csv(out / "phases.csv")
    assert len(df) < 41 and (df["status"] == "ok").all() and df["step_ms"].notna().all()
    assert list(df["label"][:1]) == ["prefill 8"]
    doc = json.loads(printed)
    assert doc["folder"] == str(out) and doc["status"] == "interrupted"
    result = json.loads((out / "result.json").read_text())
    assert [r["label"] for r in doc["rows"]] == [r["label"] for r in result["metrics"]["rows"]]
    assert len(doc["rows"]) == len(df)


def test_sigterm_keeps_the_measured_rows(tmp_path):
    out = tmp_path / "run"
    # Each context's batches are timed together (their rows come when the group ends):
    # many contexts of two batches each, so rows keep coming.
    proc = start(["sweep", *SLOW, "--batch", "1,2", "--context", MANY_CONTEXTS, "--out", str(out)])
    wait_for_rows(proc, out / "sweep.csv", rows=2)
    code, err = stop(proc, signal.SIGTERM)
    check_interrupted(out, code, err, "sweep", at_least=2)
    assert not (out / "sweep.png").exists()  # the figure is drawn from a complete sweep only


def test_ctrl_c_during_the_real_engine_keeps_its_steps(tmp_path):
    """Interrupted in the second policy's run, whatever the machine's speed: with one slot
    both policies take the same steps, so the continuous run lasts as long as the static
    one the test waited for (engine_steps.csv appears when the static run ends)."""
    out = tmp_path / "run"
    proc = start(
        ["occupancy", "--engine", "real", "--preset", "tiny", "--device", "cpu"]
        + ["--requests", "100", "--slots", "1", "--median", "20", "--max-output", "60"]
        + ["--out", str(out)]
    )
    wait_for_rows(proc, out / "engine_steps.csv")
    static = pd.read_csv(out / "engine_steps.csv")
    code, err = stop(proc, signal.SIGINT)
    check_interrupted(out, code, err, "engine_steps", at_least=len(static))
    steps = pd.read_csv(out / "engine_steps.csv")
    assert set(static["policy"]) == {"static"} and len(static) == static["step"].max() + 1
    pd.testing.assert_frame_equal(steps[: len(static)], static)  # kept whole
    assert len(pd.read_csv(out / "occupancy.csv")) == 2  # the simulation, done before


# --- interrupts at awkward moments, in-process ----------------------------------------------


def run_phases(runner, out: Path, *extra: str):
    args = ["phases", *FAST, "--prefill", "8", "--decode-batch", "1,2", "--context", "8"]
    return runner.invoke(app, [*args, "--out", str(out), *extra])


def test_ctrl_c_while_the_figure_is_written(runner, tmp_path, monkeypatch):
    from benchbatch.output.plots import phases

    def half_drawn(rows, path, title):
        path.with_name(f".{path.name}.tmp.png").write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(phases, "phases_figure", half_drawn)
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code == 130, result.output
    assert meta_of(tmp_path / "run")["status"] == "interrupted"
    assert len(pd.read_csv(tmp_path / "run" / "phases.csv")) == 3
    assert not leftovers(tmp_path / "run") and not (tmp_path / "run" / "phases.png").exists()


def test_ctrl_c_while_a_row_is_written_still_saves_the_row(runner, tmp_path, monkeypatch):
    """The CSV write of row 2 is cut short: the file keeps row 1 whole, and the interrupt
    handler writes row 2 (measured, in memory) before it exits."""
    replace, writes = os.replace, []

    def interrupted_replace(src, dst):
        if Path(dst).name == "phases.csv":
            writes.append(dst)
            if len(writes) == 2:
                raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(results.os, "replace", interrupted_replace)
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code == 130, result.output
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    assert list(df["label"]) == ["prefill 8", "decode b=1"]
    assert meta_of(tmp_path / "run")["status"] == "interrupted"
    assert not leftovers(tmp_path / "run")


def test_a_second_ctrl_c_cannot_cut_the_last_writes_short(runner, tmp_path, monkeypatch):
    from benchbatch.output.plots import phases

    def impatient(rows, path, title):
        raise KeyboardInterrupt

    snapshots = []

    def snapshot_then_ctrl_c(device):
        snapshots.append(device)
        if len(snapshots) == 2:  # the one taken after the run, as metadata.json is finished
            os.kill(os.getpid(), signal.SIGINT)
        return {"available": False, "reason": "test"}

    monkeypatch.setattr(phases, "phases_figure", impatient)
    monkeypatch.setattr(telemetry, "snapshot", snapshot_then_ctrl_c)
    before = signal.getsignal(signal.SIGINT)
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code == 130, result.output
    meta = meta_of(tmp_path / "run")
    assert meta["status"] == "interrupted" and meta["telemetry_after"]["reason"] == "test"
    assert len(snapshots) == 2 and signal.getsignal(signal.SIGINT) == before


def test_signal_handlers_are_restored(runner, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert run_phases(runner, tmp_path / "run").exit_code == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_failed_run_says_so_and_leaves_no_temporary_file(runner, tmp_path, monkeypatch):
    from benchbatch.output.plots import phases

    def broken(rows, path, title):
        path.with_name(f".{path.name}.tmp.png").write_bytes(b"")
        raise OSError("disk full")

    monkeypatch.setattr(phases, "phases_figure", broken)
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code != 0
    meta = meta_of(tmp_path / "run")
    assert meta["status"] == "failed" and "disk full" in meta["error"]
    assert not leftovers(tmp_path / "run")


def test_remove_temporaries_keeps_results(tmp_path):
    for name in ("phases.csv", ".phases.csv.abc.tmp", ".sweep.png.tmp.png", ".write-test-x"):
        (tmp_path / name).write_text("")
    (tmp_path / ".keep").write_text("")
    removed = results.remove_temporaries(tmp_path)
    assert sorted(removed) == [".phases.csv.abc.tmp", ".sweep.png.tmp.png", ".write-test-x"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keep", "phases.csv"]


# --- result folders --------------------------------------------------------------------------


def test_default_folders_are_new_even_within_one_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results, "utc_stamp", lambda: "20260101-000000Z")
    folders, barrier = [], threading.Barrier(8)

    def claim():
        barrier.wait()
        folders.append(results.run_dir(None, "sweep"))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(folders)) == 8 and all(f.is_dir() for f in folders)


def test_two_runs_in_one_second_write_two_folders(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results, "utc_stamp", lambda: "20260101-000000Z")
    args = ["occupancy", "--requests", "20"]
    assert runner.invoke(app, args).exit_code == 0
    assert runner.invoke(app, args).exit_code == 0
    names = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert names == ["20260101-000000Z-occupancy", "20260101-000000Z-occupancy-2"]
    for name in names:
        assert meta_of(tmp_path / "results" / name)["status"] == "complete"


def test_a_non_empty_out_is_refused_unless_forced(runner, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "yesterday.csv").write_text("keep me\n")
    refused = runner.invoke(app, ["occupancy", "--requests", "20", "--out", str(out)])
    assert refused.exit_code == 2 and "--out" in refused.stderr and "--force" in refused.stderr
    assert sorted(p.name for p in out.iterdir()) == ["yesterday.csv"]
    forced = runner.invoke(app, ["occupancy", "--requests", "20", "--out", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    assert (out / "yesterday.csv").read_text() == "keep me\n"
    assert meta_of(out)["status"] == "complete"


def test_under_torchrun_only_rank_0_checks_the_out_folder(tmp_path, monkeypatch):
    """Rank 0 makes --out and writes its metadata.json; a rank that reaches the check later
    (a loaded machine) must not find the folder 'not empty' and stop the run: the ten-run
    check saw `torchrun ... --out DIR` fail that way, every rank exiting 2."""
    from benchbatch.core.options import RunOptions

    out = tmp_path / "run"
    first = runs.Recorder.open("occupancy", RunOptions(out=out), None, None, {})
    first.finish()
    made = sorted(p.name for p in out.iterdir())
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    later = runs.Recorder.open("occupancy", RunOptions(out=out), None, None, {})
    assert later.folder == out and sorted(p.name for p in out.iterdir()) == made
    assert meta_of(out)["status"] == "complete"  # rank 0's, untouched by rank 1
    monkeypatch.setenv("RANK", "0")  # rank 0 itself still refuses a folder that is not empty
    with pytest.raises(UserError, match="not empty"):
        runs.Recorder.open("occupancy", RunOptions(out=out), None, None, {})


REPRODUCE = [
    "--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time", "0",
    "--prefill", "16", "--decode-batch", "1,2", "--batch", "1,2", "--context", "8",
    "--requests", "20", "--slots", "4", "--median", "6", "--max-output", "20",
    "--probe-sizes", "32", "--probe-buffer-mb", "1",
]  # fmt: skip
EVERY_COMMAND = {
    "phases": ["phases", *FAST, "--prefill", "8", "--decode-batch", "1", "--context", "8"],
    "sweep": ["sweep", *FAST, "--batch", "1,2", "--context", "8"],
    "probe": ["probe", "--device", "cpu", *FAST[-4:], "--sizes", "32", "--buffer-mb", "1"],
    "occupancy": ["occupancy", "--requests", "20"],
    "reproduce": ["reproduce", *REPRODUCE],
    "ablation": ["ablation", "--preset", "tiny", "--device", "cpu", *FAST[-4:]]
    + ["--requests", "20", "--max-num-batched-tokens", "64", "--chunk-size", "32"]
    + ["--long-prompt-len", "64", "--max-output", "60"],
    "piggyback": ["piggyback", "--preset", "tiny", "--device", "cpu", "--no-roofline"]
    + [*FAST[-4:], "--decode-batch", "2", "--context", "8", "--prefill", "4"]
    + ["--chunk-prompt", "16", "--chunks", "8", "--tiles", "8,9"],
    "project": ["project", "--tp", "1,2"],
    "serve-sweep": ["serve-sweep", "--preset", "tiny", "--device", "cpu", *FAST[-4:]]
    + ["--engine", "sim", "--requests", "20", "--rates", "1,max"],
    "serve": ["serve", "--preset", "tiny", "--device", "cpu", "--port", "0", "--duration", "0.5"],
}


def registered() -> set[str]:
    import typer.main

    return set(typer.main.get_command(app).commands)


def test_every_command_is_listed():
    """A renamed or new command fails here, rather than skipping its case."""
    assert {*EVERY_COMMAND, "compare"} == registered()


@pytest.mark.parametrize("command", [*EVERY_COMMAND, "compare"])
def test_every_command_writes_a_schema_version(runner, tmp_path, request, command):
    if command == "ablation":
        request.getfixturevalue("linear_step_costs")
    assert command in registered(), f"{command} is not a command (renamed? update this test)"
    if command == "compare":
        for name in ("a", "b"):
            args = [*EVERY_COMMAND["occupancy"], "--out", str(tmp_path / name)]
            assert runner.invoke(app, args).exit_code == 0
        args = ["compare", str(tmp_path / "a"), str(tmp_path / "b")]
    else:
        args = EVERY_COMMAND[command]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    meta = meta_of(tmp_path / "run")
    assert meta["schema_version"] == results.SCHEMA_VERSION
    assert meta["command"] == command and meta["status"] == "complete"
    # result.json too (tests/test_result_json.py checks its content): complete, listed.
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["complete"] and saved["command"] == command and saved["metrics"]
    assert saved["files"] == meta["written_files"] and "result.json" in saved["files"]
    assert not leftovers(tmp_path / "run")


# --- noisy and throttled rows ----------------------------------------------------------------


class FakeWatch:
    """Says the GPU slowed down during the second row only."""

    def __init__(self, device):
        self.looks = 0

    def look(self):
        from benchbatch.runtime.telemetry import Slowdown

        self.looks += 1
        return Slowdown(throttled=self.looks == 2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


THROTTLED = {  # the command, and the name of its second row
    "phases": (EVERY_COMMAND["phases"], "decode b=1"),
    "sweep": (EVERY_COMMAND["sweep"], "ctx 8 batch 2"),
}


@pytest.mark.parametrize("table", THROTTLED)
def test_throttled_rows_are_flagged_and_warned_about(runner, tmp_path, monkeypatch, table):
    args, second = THROTTLED[table]
    monkeypatch.setattr(telemetry, "ThrottleWatch", FakeWatch)
    # Each step timed alone: rows timed together share one look at the GPU (and its flag).
    monkeypatch.setattr(steps, "group_budget", lambda device: 0)
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / f"{table}.csv")
    assert list(df["throttled"]) == [False, True, False][: len(df)]
    assert meta_of(tmp_path / "run")["untrusted"]["throttled"] == [second]
    warning = " ".join(result.stderr.split())
    assert f"slowed its clocks (thermal or power limit) during: {second}" in warning
    assert "--repeats" in warning and "--min-time" in warning


def test_rows_are_not_throttled_on_a_cpu(runner, tmp_path):
    result = runner.invoke(app, [*EVERY_COMMAND["sweep"], "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert not df["throttled"].any() and "slowed its clocks" not in result.stderr


def test_noisy_rows_are_warned_about_with_what_to_try(runner, tmp_path, monkeypatch):
    from benchbatch.runtime import timing

    monkeypatch.setattr(timing.Measurement, "noisy", property(lambda m: m.repeats > 0))
    result = runner.invoke(app, [*EVERY_COMMAND["sweep"], "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert pd.read_csv(tmp_path / "run" / "sweep.csv")["noisy"].all()
    warning = " ".join(result.stderr.split())
    assert "noisy (CV over 10%, or timed once): ctx 8 batch 1, ctx 8 batch 2" in warning
    assert "more --repeats or --min-time" in warning


class FakeField:
    def __init__(self, ns: int, ret: int = 0):
        self.nvmlReturn = ret
        self.value = type("V", (), {"ullVal": ns})()


class FakeNvml:
    """pynvml's few calls ThrottleWatch makes, with slowdown counters a test moves."""

    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = 1
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = 2
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = 3
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = 4

    def __init__(self, fields_work: bool = True):
        self.ns, self.reasons, self.fields_work, self.open = [0, 0, 0, 0], 0, fields_work, 0

    def nvmlInit(self):
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise RuntimeError("no such GPU")

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetFieldValues(self, handle, ids):
        return [FakeField(self.ns[i - 1], 0 if self.fields_work else 2) for i in ids]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons


def test_throttle_watch_reads_slowdown_counters(monkeypatch):
    import torch

    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with telemetry.ThrottleWatch(torch.device("cuda", 0)) as watch:
        assert nvml.open == 1 and watch.throttled() is False
        nvml.ns[2] += 1_000_000  # hw thermal slowdown for a millisecond during this row
        assert watch.throttled() is True
        assert watch.throttled() is False  # the counter did not move again
        nvml.reasons = 0x1  # gpu_idle is no slowdown
        assert watch.throttled() is False
        nvml.reasons = 0x4  # sw_power_cap holds right now: routine power capping, no throttling
        assert watch.throttled() is False
        assert watch.look() == telemetry.Slowdown(throttled=False, power_capped=True)
        nvml.reasons = 0x40  # hw_thermal_slowdown holds right now
        assert watch.look() == telemetry.Slowdown(throttled=True, power_capped=False)
        nvml.reasons = 0
        nvml.ns[0] += 1_000_000  # the power-cap counter grew during this row
        assert watch.look() == telemetry.Slowdown(throttled=False, power_capped=True)
        assert watch.look() == telemetry.Slowdown()
    assert nvml.open == 0


def test_throttle_watch_falls_back_to_the_reasons_of_the_moment(monkeypatch):
    import torch

    nvml = FakeNvml(fields_work=False)  # an older driver without the counters
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with telemetry.ThrottleWatch(torch.device("cuda")) as watch:
        assert watch.throttled() is False
        nvml.reasons = 0x20  # sw_thermal_slowdown
        assert watch.throttled() is True


def test_throttle_watch_on_a_cpu_never_touches_nvml(monkeypatch):
    import torch

    monkeypatch.setitem(sys.modules, "pynvml", None)
    with telemetry.ThrottleWatch(torch.device("cpu")) as watch:
        assert watch.throttled() is False


# --- determinism -------------------------------------------------------------------------------


def test_the_same_seed_gives_byte_identical_simulation_files(runner, tmp_path):
    args = ["occupancy", "--requests", "60", "--seed", "5", "--seeds", "3", "--arrival-rate", "0.5"]
    for name in ("a", "b"):
        assert runner.invoke(app, [*args, "--out", str(tmp_path / name)]).exit_code == 0
    csvs = sorted(p.name for p in (tmp_path / "a").glob("*.csv"))
    assert csvs == ["memory.csv", "memory_timeline.csv", "occupancy.csv", "occupancy_seeds.csv",
                    "timeline.csv"]  # fmt: skip
    for csv in csvs:
        assert (tmp_path / "a" / csv).read_bytes() == (tmp_path / "b" / csv).read_bytes()


# --- the Run itself ----------------------------------------------------------------------------


def test_flush_writes_every_table_again(tmp_path):
    run = Run(tmp_path, "test", {})
    run.add("a", {"x": 1})
    run.tables["a"].append({"x": 2})  # measured, its write cut short
    run.flush()
    assert list(pd.read_csv(tmp_path / "a.csv")["x"]) == [1, 2]


def test_a_stream_table_appends_its_new_rows_and_ends_whole(tmp_path, monkeypatch):
    """A streamed table (the engine's steps) on disk as it grows: each write after the first
    appends the new rows only (no whole rewrite: the engine paid 3-9 ms for one between two
    steps), a row with a new column rewrites it whole, and the file read mid-run and after
    the run's end is every row, numbers exact."""
    whole = []
    plain = csv_rows.write_csv_plain
    monkeypatch.setattr(csv_rows, "write_csv_plain", lambda path, rows, columns: (
        whole.append(len(rows)), plain(path, rows, columns)))  # fmt: skip
    monkeypatch.setattr(results, "write_csv", lambda *a: pytest.fail("pandas mid-stream"))
    monkeypatch.setattr(Run, "STREAM_INTERVAL_S", 0.0)  # every row written: no clock read
    run = Run(tmp_path, "test", {})
    rows = [{"step": i, "step_ms": 10.0 + i / 3, "kind": "decode"} for i in range(5)]
    for row in rows:
        run.add("steps", row, stream=True)
    assert whole == [1]  # the first row wrote the file; the other four were appended
    back = pd.read_csv(tmp_path / "steps.csv")
    assert back.to_dict("records") == rows
    run.add("steps", {"step": 5, "step_ms": 0.5, "kind": "decode", "gathered": 7}, stream=True)
    run.add("steps", {"step": 6, "step_ms": 1e-7, "kind": "mixed"}, stream=True)
    assert whole == [1, 6]  # a new column: whole again, then appending resumes
    back = pd.read_csv(tmp_path / "steps.csv")
    assert back["step_ms"].tolist() == [r["step_ms"] for r in rows] + [0.5, 1e-7]
    assert back["gathered"].isna().tolist() == [True] * 5 + [False, True]
    monkeypatch.undo()
    run.flush()
    assert pd.read_csv(tmp_path / "steps.csv").equals(back)


def test_streaming_rows_never_imports_pandas(tmp_path):
    """A streamed table's writes land mid-run, while serve-sweep's client thread stamps
    chunks: pandas' first import there held the interpreter's lock ~280 ms (an audit saw
    chunks sent 10 ms apart read 104-108 ms apart). In a fresh interpreter, a run that
    streams rows, a new column among them, has not imported pandas, and its file is whole."""
    code = f"""
import sys
from pathlib import Path
from benchbatch.output.run_folder import Run
Run.STREAM_INTERVAL_S = 0.0
run = Run(Path({str(tmp_path)!r}), "test", {{}})
for i in range(3):
    run.add("requests", {{"request_id": i, "ttft_s": 0.05 + i / 7}}, stream=True)
run.add("requests", {{"request_id": 3, "error": "refused, x"}}, stream=True)
assert "pandas" not in sys.modules, "pandas imported"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    back = pd.read_csv(tmp_path / "requests.csv")
    assert back["request_id"].tolist() == [0, 1, 2, 3]
    assert back["ttft_s"].tolist()[:3] == [0.05 + i / 7 for i in range(3)]
    assert back["error"].tolist()[3] == "refused, x"


def test_an_appended_rows_cells_are_written_as_a_whole_writes_them(tmp_path):
    """csv_rows.append_csv formats each cell without pandas as csv_text does with it: full
    precision, whole floats as integers, empty NaN and None, inf, booleans, text quoted."""
    import math

    import numpy as np

    rows = [{"a": 16.041486000176, "b": 1024.0, "c": math.nan, "d": True, "e": "x,y",
             "f": math.inf, "g": np.float64(1.23456789e-7), "h": np.int64(7)},
            {"a": 0.1, "b": 3.0, "c": None, "d": False, "e": "plain", "f": -math.inf,
             "g": 2.5, "h": 8}]  # fmt: skip
    columns = list(rows[0])
    path = tmp_path / "t.csv"
    path.write_text(",".join(columns) + "\n")
    csv_rows.append_csv(path, rows, columns)
    assert path.read_text() == results.csv_text(rows)
    csv_rows.write_csv_plain(whole := tmp_path / "w.csv", rows, columns)  # header and rows
    assert whole.read_text() == results.csv_text(rows)


def test_an_interrupted_run_ends_marked_even_when_its_last_write_breaks(tmp_path, monkeypatch):
    """A signal inside pandas' import leaves pandas half-initialised, so writing the rows
    kept in memory raises something other than WriteFailed: the run still ends marked, with
    the rows already on disk, and no temporary file (the clean-clone CI run once saw exit 1
    here instead of 130)."""
    (tmp_path / "b").mkdir()
    run, complete = Run(tmp_path, "test", {}), Run(tmp_path / "b", "test", {})
    run.add("a", {"x": 1})
    run.tables["a"].append({"x": 2})
    complete.add("a", {"x": 1})

    def half_imported(path, rows):
        path.with_name(f".{path.name}.x.tmp").write_text("half")
        raise AttributeError("partially initialized module 'pandas' has no attribute 'DataFrame'")

    monkeypatch.setattr(results, "write_csv", half_imported)
    run.end("interrupted")
    assert json.loads((tmp_path / "metadata.json").read_text())["status"] == "interrupted"
    assert list(pd.read_csv(tmp_path / "a.csv")["x"]) == [1]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    with pytest.raises(AttributeError):  # a complete run whose write breaks is a failure
        complete.end("complete")


def test_signals_held_delivers_ctrl_c_once_the_writes_are_done():
    before, done = signal.getsignal(signal.SIGINT), []
    with pytest.raises(KeyboardInterrupt):
        with runs.signals_held():
            os.kill(os.getpid(), signal.SIGINT)  # held: the writes go on
            done.append("written")
    assert done == ["written"] and signal.getsignal(signal.SIGINT) == before
