import errno
import os
from pathlib import Path

import pytest

from benchbatch.errors import UserError
from benchbatch.output import results


def test_default_folders_are_new_each_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results, "utc_stamp", lambda: "20260101-000000Z")
    a = results.run_dir(None, "phases")
    (a / "phases.csv").write_text("x\n")
    b = results.run_dir(None, "phases")
    assert a != b and b.name == "20260101-000000Z-phases-2"


def test_non_empty_out_is_refused_unless_forced(tmp_path):
    (tmp_path / "old.csv").write_text("keep me")
    with pytest.raises(UserError, match="not empty") as err:
        results.run_dir(tmp_path, "phases")
    assert err.value.option == "--out"
    assert results.run_dir(tmp_path, "phases", force=True) == tmp_path
    assert (tmp_path / "old.csv").read_text() == "keep me"


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="not a folder"):
        results.run_dir(blocker, "phases")
    with pytest.raises(UserError, match="cannot write"):
        results.run_dir(blocker / "sub", "phases")


def test_read_only_folder(tmp_path, monkeypatch):
    """A folder the user may not write in (faked: root may write anywhere)."""
    ro = tmp_path / "ro"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.is_relative_to(ro) and self != ro:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_mkdir(self, *args, **kwargs)

    ro.mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(UserError, match="cannot write to .*ro/run: Permission denied") as err:
        results.run_dir(ro / "run", "phases")
    assert err.value.option == "--out"
    monkeypatch.setattr(results, "DEFAULT_ROOT", ro / "results")  # the default folder too
    with pytest.raises(UserError, match="cannot write to .*ro/results/.*-phases"):
        results.run_dir(None, "phases")
    assert list(ro.iterdir()) == []


def test_atomic_writes_leave_no_temporary_files(tmp_path):
    results.write_csv(tmp_path / "a.csv", [{"x": 1, "y": float("nan")}])
    results.write_json(tmp_path / "m.json", {"v": float("inf"), "n": [1.5]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "m.json"]
    assert '"v": null' in (tmp_path / "m.json").read_text()


def test_csv_keeps_full_precision_and_integers_whole():
    import math

    import pandas as pd

    rows = [
        {"step_ms": 16.041486000176, "flops": 13958643712, "batch": 1024.0, "noisy": True,
         "knee": None, "rate": 561933.24, "tiny": 1.23456789e-7, "status": "ok"},
        {"step_ms": math.nan, "flops": 1, "batch": math.nan, "noisy": False,
         "knee": 32.0, "rate": math.inf, "tiny": 0.5, "status": "skipped"},
    ]  # fmt: skip
    text = results.csv_text(rows)
    assert text.splitlines() == [
        "step_ms,flops,batch,noisy,knee,rate,tiny,status",
        "16.041486000176,13958643712,1024,True,,561933.24,1.23456789e-07,ok",
        ",1,,False,32,inf,0.5,skipped",
    ]
    back = pd.read_csv(__import__("io").StringIO(text))
    assert back["flops"].tolist() == [13958643712, 1]  # exact: never through a float format
