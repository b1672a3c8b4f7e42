"""One set of ceilings per machine: the latest probe is kept and reused by the commands that
follow, said with its age; a run whose step beats a roof raises it for every row."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.output import ceilings_cache

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = [
    {"kind": "matmul", "label": "matmul 1024", "dtype": "fp32", "tflops": 0.2, "gbps": 1.0,
     "status": "ok"},
    {"kind": "read", "label": "read 256 MiB", "dtype": "fp32", "tflops": 0.01, "gbps": 40.0,
     "status": "ok"},
]  # fmt: skip
NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.timezone.utc)


def test_the_latest_probe_is_reused_while_recent():
    key = ceilings_cache.key("AMD EPYC", "fp32", "2.13.0")
    assert ceilings_cache.load(key, now=NOW) is None
    path = ceilings_cache.save(key, ROWS, "results/run-1", now=NOW)
    assert path is not None and path.exists()
    later = ceilings_cache.load(key, now=NOW + dt.timedelta(minutes=12))
    assert later.rows == ROWS and later.run == "results/run-1"
    assert later.age_s == 720 and "12 min ago by results/run-1" in later.describe()
    stale = NOW + dt.timedelta(seconds=ceilings_cache.MAX_AGE_S + 1)
    assert ceilings_cache.load(key, now=stale) is None
    # Another dtype or torch build is another device as far as ceilings go.
    assert ceilings_cache.load(ceilings_cache.key("AMD EPYC", "bf16", "2.13.0"), now=NOW) is None
    assert ceilings_cache.load(ceilings_cache.key("AMD EPYC", "fp32", "2.14.0"), now=NOW) is None


def test_a_broken_or_unwritable_cache_is_no_cache(tmp_path, monkeypatch):
    (tmp_path / ceilings_cache.FILE).write_text("{not json")
    monkeypatch.setenv(ceilings_cache.ENV, str(tmp_path))
    assert ceilings_cache.load("k", now=NOW) is None
    assert ceilings_cache.save("k", ROWS, "run", now=NOW) is not None  # rewritten whole
    assert json.loads((tmp_path / ceilings_cache.FILE).read_text())["k"]["rows"] == ROWS
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(ceilings_cache.ENV, str(blocked / "below"))
    assert ceilings_cache.save("k", ROWS, "run", now=NOW) is None


def _phases(runner, out, *extra):
    args = ["phases", "--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device",
            "cpu", "--prefill", "16", "--decode-batch", "1", "--context", "8",
            "--out", str(out), *extra]  # fmt: skip
    return runner.invoke(app, args)


@pytest.fixture
def small_probe(monkeypatch):
    from benchbatch.runtime import ceilings

    small = ceilings.plan([64], 2**20)
    monkeypatch.setattr(ceilings, "default_plan", lambda dev, dtype=None: small)


@pytest.fixture
def quiet_load(monkeypatch):
    """A steady load average: the cache's key holds the load class, which must not flip
    between two runs of a test on a loaded machine."""
    from benchbatch.core import machine

    monkeypatch.setattr(machine, "load_average", lambda: [0.0, 0.0, 0.0])


def test_commands_reuse_the_latest_probe_and_say_so(runner, tmp_path, small_probe, quiet_load,
                                                    steady_probe):  # fmt: skip
    first = _phases(runner, tmp_path / "a")
    assert first.exit_code == 0, first.output
    assert "latest probe" not in first.stderr
    second = _phases(runner, tmp_path / "b")
    assert second.exit_code == 0, second.output
    assert "ceilings: the latest probe of this device in fp32, measured" in second.stderr
    assert str(tmp_path / "a") in second.stderr and "--reprobe" in second.stderr
    a = pd.read_csv(tmp_path / "a" / "probe.csv")
    b = pd.read_csv(tmp_path / "b" / "probe.csv")
    assert list(a["step_ms"]) == list(b["step_ms"])  # the same probe, not a new one
    meta_a = json.loads((tmp_path / "a" / "metadata.json").read_text())
    meta_b = json.loads((tmp_path / "b" / "metadata.json").read_text())
    assert meta_b["ceilings_from"]["run"] == str(tmp_path / "a")
    # The same ceilings: identical unless a step of either run beat them (then raised).
    if "ceilings_raised" not in meta_a and "ceilings_raised" not in meta_b:
        drop = lambda c: {k: v for k, v in c.items() if k != "source"}  # noqa: E731
        assert drop(meta_a["ceilings"]) == drop(meta_b["ceilings"])
        # Each names where its ceilings came from: measured now, or which run cached them.
        assert meta_a["ceilings"]["source"].startswith("measured now, noise ")
        assert meta_b["ceilings"]["source"].startswith(f"cached from {tmp_path / 'a'}, ")
    assert meta_b["ceilings_source"].startswith(f"cached from {tmp_path / 'a'}, ")
    assert meta_b["ceilings_from"]["key"].endswith("| threads 1 | load quiet | clock cpu")
    third = _phases(runner, tmp_path / "c", "--reprobe")
    assert third.exit_code == 0 and "latest probe" not in third.stderr
    assert "ceilings_from" not in json.loads((tmp_path / "c" / "metadata.json").read_text())


def test_a_step_over_the_probe_raises_the_ceiling_for_every_row(runner, tmp_path):
    # A probe far below what the tiny model reaches: every step beats its roofs.
    probe = tmp_path / "probe.csv"
    probe.write_text(
        "kind,label,dtype,tflops,gbps,status\n"
        "matmul,matmul 64,fp32,2e-6,,ok\nread,read 1 MiB,fp32,,2e-3,ok\n"
    )
    args = ["--decode-batch", "1,4", "--prefill", "16,32", "--ceilings", str(probe)]
    result = _phases(runner, tmp_path / "run", *args)
    assert result.exit_code == 0, result.output
    assert "the ceiling is raised to it for every row of this run" in result.stderr
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert (df["mfu"] <= 1 + 1e-9).all() and (df["mbu"] <= 1 + 1e-9).all()
    assert df["mfu"].max() == pytest.approx(1.0) and df["mbu"].max() == pytest.approx(1.0)
    c = meta["ceilings"]
    assert c["peak_tflops"] == pytest.approx(df["tflops"].max(), rel=1e-5)
    assert c["peak_gbps"] == pytest.approx(df["gbps"].max(), rel=1e-5)
    ridge = c["peak_tflops"] * 1e12 / (c["peak_gbps"] * 1e9)
    for x, bound in zip(df["arithmetic_intensity"], df["bound"], strict=True):
        # Every row placed on the final ceilings. A row that set both roofs sits on the
        # ridge itself, where the CSV's 6 digits cannot say which side: either label.
        if abs(x / ridge - 1) > 1e-4:
            assert bound == ("compute" if x >= ridge else "memory"), (x, ridge, bound)
    assert {r["ceiling"] for r in meta["ceilings_raised"]} == {"matmul", "memory"}
