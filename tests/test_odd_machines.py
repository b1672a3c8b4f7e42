"""Machines that lack something benchbatch likes to have: an NVIDIA driver, pynvml, a working
NVML, a writable home, git. None of them stops a run; telemetry and metadata say what is
missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchbatch.app.cli import app
from benchbatch.output import results
from benchbatch.runtime import telemetry

ROOT = Path(__file__).resolve().parent.parent
GPU = torch.device("cuda", 0)  # a device object only: nothing here touches a GPU


class NvmlError(Exception):
    pass


class BrokenNvml:
    """pynvml present, but its library or every query fails."""

    def __init__(self, init_fails: bool):
        self.init_fails, self.shutdowns = init_fails, 0

    def nvmlInit(self):
        if self.init_fails:
            raise NvmlError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def __getattr__(self, name):
        def fail(*args):
            raise NvmlError(f"{name}: Driver Not Loaded")

        return fail


def test_not_a_gpu():
    assert telemetry.snapshot(torch.device("cpu")) == {
        "available": False,
        "reason": "not an NVIDIA GPU",
    }


def test_pynvml_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    snap = telemetry.snapshot(GPU)
    assert snap["available"] is False and "not installed" in snap["reason"]
    assert telemetry.throttled(snap) is False
    with telemetry.ThrottleWatch(GPU) as watch:
        assert watch.throttled() is False


def test_no_nvidia_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", BrokenNvml(init_fails=True))
    snap = telemetry.snapshot(GPU)
    assert snap["available"] is False and "NVML failed to start" in snap["reason"]
    assert "Not Found" in snap["reason"]
    with telemetry.ThrottleWatch(GPU) as watch:
        assert watch.throttled() is False


def test_cuda_present_but_nvml_failing(monkeypatch):
    nvml = BrokenNvml(init_fails=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    snap = telemetry.snapshot(GPU)
    assert snap["available"] is False and "NVML query failed" in snap["reason"]
    assert nvml.shutdowns == 1  # started, so shut down again
    with telemetry.ThrottleWatch(GPU) as watch:
        assert watch.throttled() is False and watch.throttled() is False
    assert nvml.shutdowns == 2


def test_a_run_without_pynvml(runner, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    args = ["probe", "--device", "cpu", "--repeats", "1", "--min-time", "0", "--sizes", "32"]
    result = runner.invoke(app, [*args, "--buffer-mb", "1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["telemetry_before"]["available"] is False
    assert meta["status"] == "complete"


# --- no git ------------------------------------------------------------------------------------


def test_no_git_on_the_path(runner, tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert results.git_commit() is None
    result = runner.invoke(app, ["occupancy", "--requests", "20", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["environment"]["git_commit"] is None and meta["status"] == "complete"


@pytest.mark.parametrize(
    "failure",
    [
        subprocess.CompletedProcess([], 128, "", "fatal: not a git repository"),
        subprocess.TimeoutExpired("git", 5),
        PermissionError("git"),
    ],
    ids=["not a repository", "hangs", "not executable"],
)
def test_git_failing(monkeypatch, failure):
    def run(*args, **kwargs):
        if isinstance(failure, BaseException):
            raise failure
        return failure

    monkeypatch.setattr(results.subprocess, "run", run)
    assert results.git_commit() is None


# --- a read-only home ---------------------------------------------------------------------------


@pytest.fixture
def no_mplconfigdir(monkeypatch):
    """MPLCONFIGDIR unset for the test and restored after it, set or not: delenv alone
    records nothing to restore when the variable is absent, so what the test's code sets
    would leak into every later test (and their subprocesses)."""
    monkeypatch.setenv("MPLCONFIGDIR", "set, so that monkeypatch restores the original")
    monkeypatch.delenv("MPLCONFIGDIR")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)


def test_an_unwritable_home_gets_a_stable_matplotlib_folder(tmp_path, monkeypatch, no_mplconfigdir):
    from benchbatch.app import plotting_env

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "file" / "home"))  # cannot exist, even for root
    plotting_env.matplotlib_config_dir()
    folder = Path(os.environ["MPLCONFIGDIR"])
    assert folder.is_dir() and os.access(folder, os.W_OK)
    assert folder.parent == Path(__import__("tempfile").gettempdir())


def test_a_writable_home_is_left_to_matplotlib(tmp_path, monkeypatch, no_mplconfigdir):
    from benchbatch.app import plotting_env

    monkeypatch.setenv("HOME", str(tmp_path))
    plotting_env.matplotlib_config_dir()
    assert "MPLCONFIGDIR" not in os.environ


def test_a_run_with_a_read_only_home(tmp_path):
    """Matplotlib gets one stable folder: it neither warns about a temporary one nor builds
    its font cache again on a second run (the first run on a machine builds it, and says
    so on stderr: that run is the warm-up here)."""
    (tmp_path / "file").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "MPL"))}
    env["HOME"] = str(tmp_path / "file" / "home")
    warm = subprocess.run(
        [sys.executable, "-c", "import benchbatch.app.cli, matplotlib.font_manager"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert warm.returncode == 0 and "Traceback" not in warm.stderr, warm.stderr
    assert "created a temporary" not in warm.stderr  # the cache directory warning
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "benchbatch", "occupancy", "--requests", "30", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Matplotlib" not in proc.stderr
    assert (out / "occupancy.png").stat().st_size > 0
    assert json.loads((out / "metadata.json").read_text())["status"] == "complete"
