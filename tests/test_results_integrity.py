"""What a run leaves on disk when the disk says no, when --force meets an earlier run, and in
what mode: a full disk ends the run in one line with metadata marked failed and no
temporary file; --force never mixes two runs' files; compare never writes over what it
reads; files get the usual permissions."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from benchbatch.app.cli import app
from benchbatch.errors import WriteFailed
from benchbatch.output import results

ROOT = Path(__file__).resolve().parent.parent


def meta_of(folder: Path) -> dict:
    return json.loads((folder / "metadata.json").read_text())


def hidden(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name]


# --- a full disk -----------------------------------------------------------------------------


def run_with_file_size_limit(args: list[str], limit: int) -> subprocess.CompletedProcess:
    """The program with every file it writes capped at `limit` bytes (RLIMIT_FSIZE): a write
    past it fails as on a full disk (EFBIG; benchbatch ignores SIGXFSZ)."""

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "benchbatch", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=900, preexec_fn=cap,
    )  # fmt: skip


def test_a_write_past_the_disk_ends_the_run_in_one_line(tmp_path):
    out = tmp_path / "run"
    done = run_with_file_size_limit(["occupancy", "--requests", "5000", "--out", str(out)], 20_000)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"Error: cannot write {out / 'timeline.csv'}: File too large (")
    assert "bytes to write" in lines[0]
    assert meta_of(out)["status"] == "failed" and "timeline.csv" in meta_of(out)["error"]
    assert not hidden(out)
    assert "occupancy.csv" in os.listdir(out)  # what was written before stays


def test_a_disk_too_full_for_the_metadata_is_refused_before_the_run(tmp_path):
    out = tmp_path / "run"
    done = run_with_file_size_limit(["occupancy", "--requests", "20", "--out", str(out)], 100)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"Error: --out: cannot write to {out}: File too large"
    assert not out.exists()


def test_no_space_left_midway_through_the_rows(runner, tmp_path, monkeypatch):
    """ENOSPC on the fourth file write of a phases run: one line, metadata failed, the first
    rows kept, no temporary file."""
    writes = []

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def write(self, data):
            writes.append(len(data))
            if len(writes) == 4:
                raise OSError(28, "No space left on device")
            return self.f.write(data)

    real_fdopen = results.os.fdopen
    monkeypatch.setattr(results.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    out = tmp_path / "run"
    args = ["phases", "--preset", "tiny", "--device", "cpu", "--no-roofline", "--repeats", "1"]
    args += ["--min-time", "0", "--prefill", "8", "--decode-batch", "1,2", "--context", "8"]
    args += ["--dtype", "fp32"]  # no note about the dtype: stderr holds the error alone
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    # the error is one line, the last; before it only the run's notes and warnings (the
    # threads chosen, a busy machine) may stand
    assert "No space left on device" in lines[-1], result.stderr
    assert all(line.startswith(("note:", "warning:")) for line in lines[:-1]), result.stderr
    assert "Traceback" not in result.stderr
    assert meta_of(out)["status"] == "failed" and not hidden(out)


def test_write_failed_names_the_file_and_the_bytes(tmp_path):
    with pytest.raises(WriteFailed) as e:
        results.atomic_write_text(tmp_path / "no" / "such" / "dir.csv", "x" * 3000)
    assert str(e.value).startswith(f"cannot write {tmp_path / 'no' / 'such' / 'dir.csv'}: ")
    assert "3,000 bytes to write" in str(e.value)


# --- permissions -----------------------------------------------------------------------------


def test_written_files_get_the_usual_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        results.write_csv(tmp_path / "a.csv", [{"x": 1}])
        results.write_json(tmp_path / "m.json", {"x": 1})
    finally:
        os.umask(old)
    for name in ("a.csv", "m.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name


def test_a_runs_files_are_readable_by_others_under_the_common_umask(runner, tmp_path):
    old = os.umask(0o022)
    try:
        assert runner.invoke(app, ["occupancy", "--requests", "20", "--out", str(tmp_path / "r")])
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "r").iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes


# --- --force ---------------------------------------------------------------------------------


def occupancy(runner, out: Path, *extra: str):
    return runner.invoke(app, ["occupancy", "--requests", "20", "--out", str(out), *extra])


def test_force_replaces_the_previous_run_of_the_same_command(runner, tmp_path):
    out = tmp_path / "run"
    assert occupancy(runner, out, "--seeds", "2").exit_code == 0
    assert (out / "occupancy_seeds.csv").exists()
    (out / "notes.txt").write_text("mine")  # not a run's file: kept
    assert occupancy(runner, out, "--force").exit_code == 0
    assert not (out / "occupancy_seeds.csv").exists()  # the earlier run's table is gone
    assert (out / "notes.txt").read_text() == "mine"
    assert meta_of(out)["options"]["seeds"] == 1


def test_force_refuses_a_folder_of_another_command(runner, tmp_path):
    out = tmp_path / "run"
    assert occupancy(runner, out).exit_code == 0
    costs = tmp_path / "costs.csv"
    costs.write_text(
        "decode_tokens,prefill_tokens,context_tokens,step_ms\n1,0,10,1\n8,0,80,2\n0,64,0,3\n"
        "0,128,0,5\n4,64,100,4.5\n"
    )
    args = ["ablation", "--step-costs", str(costs), "--out", str(out), "--force"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: --force: ") and "holds a occupancy run" in result.stderr
    assert meta_of(out)["command"] == "occupancy"


def test_force_refuses_a_metadata_json_benchbatch_did_not_write(runner, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metadata.json").write_text('{"something": "else"}')
    result = occupancy(runner, out, "--force")
    assert result.exit_code == 2 and "was not written by benchbatch" in result.stderr
    assert (out / "metadata.json").read_text() == '{"something": "else"}'


# --- compare --------------------------------------------------------------------------------


@pytest.fixture
def two_runs(runner, tmp_path):
    for name in ("a", "b"):
        assert occupancy(runner, tmp_path / name).exit_code == 0
    return tmp_path / "a", tmp_path / "b"


def test_compare_never_writes_into_a_folder_it_reads(runner, two_runs):
    a, b = two_runs
    before = {p.name: p.read_bytes() for p in a.iterdir()}
    for extra in ([], ["--force"]):
        result = runner.invoke(app, ["compare", str(a), str(b), "--out", str(a), *extra])
        assert result.exit_code == 2 and "one of the folders compared" in result.stderr
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before


def test_compare_the_same_folder_twice_says_so(runner, two_runs, tmp_path):
    a, _ = two_runs
    result = runner.invoke(app, ["compare", str(a), str(tmp_path / "x" / ".." / "a")])
    assert result.exit_code == 2 and "the same folder was given twice" in result.stderr
    labelled = ["compare", str(a), str(a), "--label", "one,two", "--out", str(tmp_path / "c")]
    assert runner.invoke(app, labelled).exit_code == 0


def test_force_removes_only_what_the_previous_run_wrote_never_an_input(runner, tmp_path):
    """`occupancy --trace ff/mytrace.csv --out ff --force` kept neither the trace it was
    replaying nor the user's notes: every CSV/PNG/JSON/MD/HTML in the folder went. Now the
    previous run's metadata.json lists its files and --force removes those alone, never an
    input of this run, even one the last run wrote (a trace_POLICY.csv, say)."""
    out = tmp_path / "ff"
    assert occupancy(runner, out, "--seeds", "2").exit_code == 0
    listed = meta_of(out)["written_files"]
    assert {"occupancy.csv", "occupancy_seeds.csv", "metadata.json"} <= set(listed)
    assert sorted(listed) == sorted(p.name for p in out.iterdir())  # every file it wrote
    (out / "NOTES.md").write_text("mine")
    (out / "extra.csv").write_text("a\n1\n")
    trace = out / "mytrace.csv"
    trace.write_text("output_tokens\n5\n7\n")
    meta = json.loads((out / "metadata.json").read_text())
    meta["written_files"].append("mytrace.csv")  # as if the last run had written it
    (out / "metadata.json").write_text(json.dumps(meta))
    done = occupancy(runner, out, "--force", "--trace", str(trace))
    assert done.exit_code == 0, done.output
    assert (out / "NOTES.md").read_text() == "mine"
    assert (out / "extra.csv").read_text() == "a\n1\n"
    assert trace.read_text() == "output_tokens\n5\n7\n"
    assert not (out / "occupancy_seeds.csv").exists()  # the last run's own table went
    assert meta_of(out)["options"]["trace"] == str(trace)
    assert "mytrace.csv" not in meta_of(out)["written_files"]  # a later --force keeps it


def test_force_refuses_a_run_that_did_not_list_its_files(runner, tmp_path):
    out = tmp_path / "run"
    assert occupancy(runner, out).exit_code == 0
    meta = json.loads((out / "metadata.json").read_text())
    del meta["written_files"]  # as an older benchbatch wrote it
    (out / "metadata.json").write_text(json.dumps(meta))
    done = occupancy(runner, out, "--force")
    assert done.exit_code == 2
    assert "does not list the files its run wrote" in done.output
    assert (out / "occupancy.csv").exists()


# The disk full as a run ends, as seen on a 200 kB tmpfs: (a) result.json never fits, nor
# a metadata.json grown by its error; (b) result.json (complete) fits, then nothing more.
FULL_AT_THE_END = {
    "result": lambda name, obj, written: name == "result.json" or (
        name == "metadata.json" and "error" in obj),
    "metadata": lambda name, obj, written: "result.json" in written and (
        name == "metadata.json" or obj.get("status") != "complete"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FULL_AT_THE_END))
def test_a_disk_full_at_the_end_never_leaves_a_complete_marker(runner, tmp_path, monkeypatch,
                                                               case):  # fmt: skip
    """(a) left metadata.json "complete" of a run that exited 1 (compare then took it
    whole); (b) left result.json "complete" beside a metadata.json "running"."""
    real, full, written = results.write_json, FULL_AT_THE_END[case], []

    def write_json(path, obj):
        if full(path.name, obj, written):
            raise WriteFailed(path, 4508, OSError(28, "No space left on device"))
        written.append(path.name)
        return real(path, obj)

    monkeypatch.setattr(results, "write_json", write_json)
    out = tmp_path / "run"
    args = ["phases", "--preset", "tiny", "--device", "cpu", "--no-roofline", "--repeats", "1",
            "--min-time", "0", "--prefill", "8", "--decode-batch", "1", "--context", "8",
            "--dtype", "fp32", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
    assert meta_of(out)["status"] != "complete"
    if (out / "result.json").exists():
        doc = json.loads((out / "result.json").read_text())
        assert doc["complete"] is False and doc["status"] != "complete"


def test_an_interrupted_runs_line_says_what_it_kept(tmp_path):
    """phases stopped before its group of steps ended said "rows measured so far are in"
    a folder that held none: the line counts each table's rows, or says none was."""
    from benchbatch.output.run_folder import kept

    (tmp_path / "metadata.json").write_text("{}")
    (tmp_path / "phases.csv").write_text("step,ms\n")  # a header, no row
    assert kept(tmp_path) == f"no row was measured yet: {tmp_path} holds the run's metadata only"
    (tmp_path / "probe.csv").write_text("kind,gflops\nmatmul,1\ncopy,2\n")
    (tmp_path / "phases.csv").write_text("step,ms\nprefill,3\n")
    assert kept(tmp_path) == (f"rows measured so far are in {tmp_path} (phases.csv 1, "
                              "probe.csv 2)")  # fmt: skip
