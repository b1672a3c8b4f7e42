"""Never cache or reuse a bad probe (issue 28, item 1): a probe with a noisy row or cut short
is not kept; a probe from another load class, thread count, torch or dtype is measured
again; and every run names where its ceilings came from."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from benchbatch.app.cli import app
from benchbatch.core import machine
from benchbatch.output import ceilings_cache
from benchbatch.runtime import ceilings as probes

pytestmark = pytest.mark.usefixtures("one_thread")

NOW = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.timezone.utc)


def _row(label: str, kind: str, cv: float, noisy: bool = False) -> dict:
    return {"kind": kind, "label": label, "dtype": "fp32", "tflops": 0.2, "gbps": 40.0,
            "cv": cv, "noisy": noisy, "status": "ok"}  # fmt: skip


STEADY = [_row("matmul 1024", "matmul", 0.02), _row("read 256 MiB", "read", 0.031)]
NOISY = [_row("matmul 1024", "matmul", 0.02), _row("read 256 MiB", "read", 0.4, noisy=True)]


def test_a_noisy_or_cut_short_probe_is_not_kept():
    key = ceilings_cache.key("AMD EPYC", "fp32", "2.13.0", 1, "busy")
    assert ceilings_cache.noisy_rows(NOISY) == ["read 256 MiB"]
    assert ceilings_cache.noisy_rows(STEADY) == []
    # A CV over the threshold is noisy even where the flag says otherwise (a CSV's text).
    assert ceilings_cache.noisy_rows([{**STEADY[0], "cv": "0.25", "noisy": "False"}]) == [
        "matmul 1024"
    ]
    assert ceilings_cache.save(key, NOISY, "run-noisy", now=NOW) is None
    assert ceilings_cache.save(key, STEADY, "run-cut", now=NOW, complete=False) is None
    assert ceilings_cache.load(key, now=NOW) is None  # neither was written
    assert ceilings_cache.save(key, STEADY, "run-good", now=NOW) is not None
    cached = ceilings_cache.load(key, now=NOW + dt.timedelta(minutes=5))
    assert cached.run == "run-good"
    # A noisy probe after a good one leaves the good one in place.
    assert ceilings_cache.save(key, NOISY, "run-noisy", now=NOW) is None
    assert ceilings_cache.load(key, now=NOW).run == "run-good"
    assert (
        cached.source() == "cached from run-good, 2025-06-01T12:00:00+00:00 (5 min ago), noise 3.1%"
    )


def test_a_probe_timed_once_is_not_kept_and_its_noise_is_unknown():
    """A probe of one repeat (--repeats 1 --min-time 0) has a CV of 0 because it measured no
    spread: it was cached as "noise 0.0%" and a later run's roofline rested on it."""
    key = ceilings_cache.key("AMD EPYC", "fp32", "2.13.0", 1, "quiet")
    once = [{**r, "cv": 0.0, "repeats": 1} for r in STEADY]
    assert ceilings_cache.noisy_rows(once) == ["matmul 1024", "read 256 MiB"]
    assert ceilings_cache.noise(once) is None and ceilings_cache.noise_text(once) == (
        "noise unknown")  # fmt: skip
    assert ceilings_cache.save(key, once, "run-once", now=NOW) is None
    assert ceilings_cache.load(key, now=NOW) is None
    twice = [{**r, "repeats": 2} for r in STEADY]
    assert ceilings_cache.noisy_rows(twice) == [] and ceilings_cache.noise(twice) == 0.031


def test_a_noisy_probe_cached_before_the_rule_is_not_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(ceilings_cache.ENV, str(tmp_path))
    entry = {"measured_utc": NOW.isoformat(), "run": "old", "rows": NOISY}
    (tmp_path / ceilings_cache.FILE).write_text(json.dumps({"k": entry}))
    assert ceilings_cache.load("k", now=NOW) is None


def test_the_key_holds_threads_and_load_class():
    keys = {
        ceilings_cache.key("cpu", "fp32", "2.13.0", 1, "quiet"),
        ceilings_cache.key("cpu", "fp32", "2.13.0", 2, "quiet"),
        ceilings_cache.key("cpu", "fp32", "2.13.0", 1, "busy"),
        ceilings_cache.key("cpu", "fp32", "2.14.0", 1, "quiet"),
        ceilings_cache.key("cpu", "bf16", "2.13.0", 1, "quiet"),
    }
    assert len(keys) == 5
    ceilings_cache.save(ceilings_cache.key("cpu", "fp32", "2.13.0", 1, "quiet"), STEADY, "a", NOW)
    for other in ((2, "quiet"), (1, "busy")):
        assert (
            ceilings_cache.load(ceilings_cache.key("cpu", "fp32", "2.13.0", *other), now=NOW)
            is None
        )


def test_a_probe_is_complete_only_with_every_planned_row():
    plan = probes.plan([64, 128], 2**20)
    rows = [{"label": p.label} for p in plan]
    assert probes.complete(plan, rows)
    assert not probes.complete(plan, rows[:-1])  # the last probe never ran (interrupted)


@pytest.fixture
def small_probe(monkeypatch):
    small = probes.plan([64], 2**20)
    monkeypatch.setattr(probes, "default_plan", lambda dev, dtype=None: small)


@pytest.fixture
def load(monkeypatch):
    """The load average the runs see, set by the test (the cache's key holds its class)."""
    value = {"now": 0.0}
    monkeypatch.setattr(machine, "load_average", lambda: [value["now"]] * 3)
    return value


def _phases(runner, out, *extra):
    args = ["phases", "--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device",
            "cpu", "--prefill", "16", "--decode-batch", "1", "--context", "8",
            "--out", str(out), *extra]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "metadata.json").read_text())


def test_a_noisy_probe_is_used_but_measured_again_next_time(
    runner, tmp_path, small_probe, load, monkeypatch
):
    real_row = probes.probe_row

    def noisy_row(probe, dtype, m, status="ok"):  # every probe row comes out noisy
        return {**real_row(probe, dtype, m, status), "cv": 0.5, "noisy": True, "repeats": 2}

    monkeypatch.setattr(probes, "probe_row", noisy_row)
    first, meta = _phases(runner, tmp_path / "a")
    assert "are noisy: this run uses them, but they are not kept" in " ".join(first.stderr.split())
    assert meta["ceilings_source"] == "measured now, noise 50.0%"
    monkeypatch.setattr(probes, "probe_row", real_row)
    second, meta_b = _phases(runner, tmp_path / "b")
    assert "latest probe" not in second.stderr and "ceilings_from" not in meta_b
    assert meta_b["ceilings_source"].startswith("measured now, noise ")


def test_another_load_class_or_thread_count_measures_again(runner, tmp_path, small_probe, load,
                                                          steady_probe):  # fmt: skip
    _, a = _phases(runner, tmp_path / "a", "--threads", "1")
    assert a["ceilings_source"].startswith("measured now")
    _, b = _phases(runner, tmp_path / "b", "--threads", "1")
    assert b["ceilings_source"].startswith(f"cached from {tmp_path / 'a'}, ")
    assert b["ceilings_from"]["key"].endswith("| threads 1 | load quiet | clock cpu")
    load["now"] = 50.0  # another process now takes the cores
    result, c = _phases(runner, tmp_path / "c", "--threads", "1")
    assert "latest probe" not in result.stderr and "ceilings_from" not in c
    assert c["threads"]["load_class"] == "busy"
    load["now"] = 0.0
    _, d = _phases(runner, tmp_path / "d", "--threads", "2")
    assert "ceilings_from" not in d  # two threads: other ceilings


def test_the_roofline_names_its_ceilings(runner, tmp_path, small_probe, load, monkeypatch,
                                         steady_probe):  # fmt: skip
    from benchbatch.output.plots import roofline

    titles = []
    real = roofline.roofline_figure

    def spy(rows, ceilings, path, sheet=None, title=""):
        titles.append(title)
        return real(rows, ceilings, path, sheet, title)

    monkeypatch.setattr(roofline, "roofline_figure", spy)
    result, meta = _phases(runner, tmp_path / "a")
    source = meta["ceilings_source"]
    assert source.startswith("measured now, noise ")
    assert titles and titles[-1].endswith(f"\nceilings {source}")
    assert meta["ceilings"]["source"] == source
    # ...and the table's line under it says the same (a second run: the cached probe's)
    assert f"ceilings (mfu, mbu, bound): {source}" in " ".join(result.stdout.split())
    result, again = _phases(runner, tmp_path / "b")
    cached = again["ceilings_source"]
    assert cached.startswith(f"cached from {tmp_path / 'a'}, ") and titles[-1].endswith(cached)
    assert again["ceilings"]["source"] == cached
    assert f"ceilings (mfu, mbu, bound): {cached}" in " ".join(result.stdout.split())
