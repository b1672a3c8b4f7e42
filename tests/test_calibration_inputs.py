"""--step-costs' inputs read with their checks (core/saved_calibration.py, core/stepcost.py):
a step_cost.csv cut short or another run's, a step_cost.json without the fit the runs read,
isolated step times of runs under other conditions; and the probe's cache (its key holds
benchbatch's version, the host and a saturated load) and a cached probe's core_share, which
is not this run's."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_calibration import synthetic_steps

from benchbatch.core import calibration as cal
from benchbatch.core import saved_calibration as sc
from benchbatch.errors import UserError

CONDITIONS = {"device": "AMD EPYC", "torch": "2.5.0", "dtype": "float32", "threads": 1,
              "load_class": "quiet", "pinned_cores": "all"}  # fmt: skip


def _calibration(folder: Path, conditions: dict | None = CONDITIONS, csv: bool = True) -> Path:
    """A calibration saved as a run saves it: step_cost.json and, beside it, step_cost.csv."""
    out = cal.fit(synthetic_steps(60, 0.0))
    doc = out["summary"] | ({} if conditions is None else {"conditions": conditions})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step_cost.json").write_text(json.dumps(doc))
    if csv:
        pd.DataFrame(out["rows"]).to_csv(folder / "step_cost.csv", index=False)
    return folder / "step_cost.json"


def _refused(paths, *words) -> str:
    with pytest.raises(UserError) as e:
        sc.given(paths)
    assert e.value.option == "--step-costs"
    assert "\n" not in e.value.message
    for word in words:
        assert word in e.value.message, e.value.message
    return e.value.message


# --- A: a step_cost.csv cut short ---------------------------------------------------------------


def test_a_step_cost_csv_cut_mid_line_is_refused(tmp_path):
    _calibration(tmp_path)
    csv = tmp_path / "step_cost.csv"
    data = csv.read_bytes()
    assert sc.given([csv])["summary"]["samples"] == 60  # whole, it reads
    # Cut inside a line's later fields: every cut of the last 200 bytes but a line's end.
    for n in range(len(data) * 3 // 4, len(data) * 3 // 4 + 200):
        if data[n - 1 : n] == b"\n":
            continue
        csv.write_bytes(data[:n])
        _refused([csv], str(csv))


def test_a_step_times_csvs_last_line_cut_short_is_refused(tmp_path):
    """A cut inside the last line leaves every step there: the line's own fields say it."""
    _calibration(tmp_path)
    csv = tmp_path / "step_cost.csv"
    data = csv.read_bytes()
    start = data.rstrip(b"\n").rindex(b"\n") + 1
    for n in range(start + 1, data.rindex(b",") + 2):  # up to its last field, empty
        csv.write_bytes(data[:n])
        _refused([csv], "cut short", "line 61 ")
    csv.write_bytes(data.rstrip(b"\n"))  # whole but for the newline: read
    assert sc.given([csv])["summary"]["samples"] == 60


def test_a_field_past_csvs_limit_is_refused_not_a_traceback(tmp_path):
    """A 200,000-digit cell: the cut-short check's csv reader raised its field-limit error
    (a traceback, exit 1; found by scripts/hostile_attack.py, seed 31)."""
    from benchbatch.core.inputs import cut_short

    long = tmp_path / "long_line.csv"
    long.write_text("output_tokens\n" + "9" * 200_000 + "\n")
    assert cut_short(long.read_bytes()) is None
    _refused([long], str(long))
    steps = tmp_path / "steps.csv"
    steps.write_text("decode_tokens,prefill_tokens,context_tokens,step_ms\n1,0,8,"
                     + "9" * 200_000 + "\n")  # fmt: skip
    _refused([steps], str(steps))


def test_a_step_cost_csv_of_fewer_steps_than_its_json_says_is_refused(tmp_path):
    _calibration(tmp_path)
    csv = tmp_path / "step_cost.csv"
    lines = csv.read_bytes().splitlines(keepends=True)
    csv.write_bytes(b"".join(lines[:42]))  # the header and 41 steps, cut at a line's end
    _refused([csv], "has 41 steps", "says 60", "cut short or from another run")


# --- B: a step_cost.json without the fit the runs read -----------------------------------------


def test_a_step_cost_json_without_coefficients_is_refused(tmp_path):
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps({"coefficients_s": {}}))
    _refused([path], "no coefficients")


@pytest.mark.parametrize("key", ["samples", "kinds", "std_errors_s"])
def test_a_step_cost_json_without_what_its_line_reads_is_refused(tmp_path, key):
    path = _calibration(tmp_path, csv=False)
    doc = json.loads(path.read_text())
    del doc[key]
    path.write_text(json.dumps(doc))
    _refused([path], f'"{key}"')
    doc[key] = "x"
    path.write_text(json.dumps(doc))
    _refused([path], f'"{key}"')


def test_the_ablation_refuses_an_empty_calibration_in_one_line(runner, tmp_path):
    from benchbatch.app.cli import app

    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps({"coefficients_s": {}}))
    args = ["ablation", "--engine", "sim", "--hidden", "64", "--layers", "2", "--heads", "2",
            "--vocab", "256", "--max-context", "512", "--requests", "10", "--prompt-len", "32",
            "--long-prompt-len", "128", "--output-median", "8", "--max-output", "16",
            "--slots", "4", "--step-costs", str(path), "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--step-costs" in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, KeyError)


# --- C: conditions, and step times of runs under other ones ------------------------------------


def _phases_run(folder: Path, meta: dict | None, scale: float = 1.0) -> Path:
    """A phases.csv of a linear engine and, unless meta is None, its run's metadata.json."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"phase": "decode", "batch": b, "tokens": 1, "context": c,
             "step_ms": scale * (1.0 + 0.05 * b + 0.0005 * b * c)}
            for b in (1, 2, 4, 8) for c in (64, 256)]  # fmt: skip
    rows += [{"phase": "prefill", "batch": 1, "tokens": t, "context": 0,
              "step_ms": scale * (1.0 + 0.01 * t)} for t in (32, 64, 128)]  # fmt: skip
    pd.DataFrame(rows).to_csv(folder / "phases.csv", index=False)
    if meta is not None:
        (folder / "metadata.json").write_text(json.dumps(meta))
    return folder / "phases.csv"


def _meta(device="AMD EPYC", threads=1, hidden=64, dtype="fp32") -> dict:
    return {
        "environment": {"device_name": device, "dtype": dtype, "torch_version": "2.5.0",
                        "benchbatch_version": "0.1.0"},
        "threads": {"threads": threads, "load_average": 0.1, "physical_cores": 4},
        "config": {"hidden": hidden, "layers": 2, "heads": 2, "kv_heads": 2,
                   "intermediate": 4 * hidden, "vocab": 256},
    }  # fmt: skip


def test_step_times_of_one_run_carry_its_conditions(tmp_path):
    got = sc.given([_phases_run(tmp_path / "a", _meta())])
    assert got["source"] == "isolated steps" and got["notes"] == []
    cond = got["conditions"]
    assert cond["device"] == "AMD EPYC" and cond["dtype"] == "float32"
    assert cond["threads"] == 1 and cond["load_class"] == "quiet"
    assert cond["model"] == "hidden 64, 2 layers, 2 heads (2 KV), intermediate 256, vocab 256"
    assert got["summary"]["conditions"] == cond  # kept with the run's step_cost.json


def test_step_times_of_two_devices_are_refused(tmp_path):
    a = _phases_run(tmp_path / "a", _meta())
    b = _phases_run(tmp_path / "b", _meta(device="NVIDIA H100 80GB HBM3"))
    _refused([a, b], "AMD EPYC", "NVIDIA H100", "two devices")


def test_step_times_of_runs_under_other_conditions_are_said(tmp_path):
    a = _phases_run(tmp_path / "a", _meta())
    b = _phases_run(tmp_path / "b", _meta(threads=4, hidden=128, dtype="bf16"), scale=3.0)
    got = sc.given([a, b])
    (note,) = got["notes"]
    assert "threads 1" in note and "4 (" in note and "dtype" in note and "model" in note
    assert "\n" not in note
    assert got["conditions"]["device"] == "AMD EPYC" and "threads" not in got["conditions"]


def test_step_times_without_metadata_are_said_unchecked(tmp_path):
    a = _phases_run(tmp_path / "a", _meta())
    bare = _phases_run(tmp_path / "bare", None)
    got = sc.given([a, bare])
    (note,) = got["notes"]
    assert str(bare) in note and "conditions are unknown: not checked" in note
    assert got["conditions"]["device"] == "AMD EPYC"
    alone = sc.given([bare])
    assert alone["conditions"] is None and len(alone["notes"]) == 1


def test_a_calibration_without_conditions_is_said_unchecked(tmp_path):
    path = _calibration(tmp_path / "bare", conditions=None)
    got = sc.given([path])
    assert got["conditions"] is None
    (note,) = got["notes"]
    assert "conditions are unknown" in note
    path = _calibration(tmp_path / "empty", conditions={})
    assert sc.given([path])["notes"] and sc.given([path])["conditions"] is None
    kept = _calibration(tmp_path / "kept")
    assert sc.given([kept])["notes"] == []
    assert sc.given([tmp_path / "kept" / "step_cost.csv"])["notes"] == []
    # A step_cost.csv alone: the conditions of the json it was saved beside are not here.
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "step_cost.csv").write_bytes((tmp_path / "kept" / "step_cost.csv").read_bytes())
    got = sc.given([lone / "step_cost.csv"])
    assert got["conditions"] is None
    (note,) = got["notes"]
    assert "no step_cost.json beside it" in note and "not checked" in note


# --- D: the probe cache's key -------------------------------------------------------------------


def _rec(load: float, cores: int = 2, klass: str = "busy"):
    threads = {"threads": 1, "load_average": load, "physical_cores": cores,
               "load_class": klass, "clock": "cpu"}  # fmt: skip
    target = types.SimpleNamespace(device=torch.device("cpu"), dtype_name="fp32")
    return types.SimpleNamespace(target=target, meta={"threads": threads})


def test_the_cache_key_holds_benchbatch_the_host_and_a_saturated_load(monkeypatch):
    import platform

    import benchbatch
    from benchbatch.experiments.ceilings import cache_key

    busy, saturated = cache_key(_rec(1.5)), cache_key(_rec(4.0))
    assert busy != saturated and "load saturated" in saturated and "load busy" in busy
    assert f"benchbatch {benchbatch.__version__}" in busy
    assert f"host {sc.host_id(platform.node())}" in busy
    monkeypatch.setattr(benchbatch, "__version__", "99.0")
    assert cache_key(_rec(1.5)) != busy
    monkeypatch.undo()
    monkeypatch.setattr(platform, "node", lambda: "another-host")
    assert cache_key(_rec(1.5)) != busy


def test_a_probe_cached_under_the_old_key_is_not_reused():
    import datetime as dt

    from benchbatch.core import machine
    from benchbatch.experiments.ceilings import cache_key
    from benchbatch.output import ceilings_cache
    from benchbatch.runtime import device

    rows = [{"kind": "matmul", "label": "matmul 64", "tflops": 0.1, "gbps": 1.0,
             "status": "ok"}]  # fmt: skip
    now = dt.datetime.now(dt.timezone.utc)
    old = ceilings_cache.key(device.device_name(torch.device("cpu")), "fp32",
                             machine.version("torch"), 1, "busy", "cpu")  # fmt: skip
    assert ceilings_cache.save(old, rows, "old-run", now=now) is not None
    assert ceilings_cache.load(old, now=now) is not None
    assert ceilings_cache.load(cache_key(_rec(1.5)), now=now) is None
    new = cache_key(_rec(1.5))
    assert ceilings_cache.save(new, rows, "new-run", now=now) is not None
    assert ceilings_cache.load(new, now=now).run == "new-run"
    assert ceilings_cache.load(cache_key(_rec(4.0)), now=now) is None  # saturated: another


# --- E: a cached probe's core_share ------------------------------------------------------------


class _Run:
    """What say_core_share reads of a run: its tables, metadata and notes."""

    def __init__(self, tables: dict, meta: dict):
        self.tables = tables
        self.meta = {"threads": {}} | meta
        self.notes: list[str] = []

    def write_meta(self):
        pass

    def note(self, text):
        self.notes.append(text)


def test_a_cached_probes_core_share_is_not_this_runs():
    from benchbatch.experiments import common

    probe = [{"label": f"p{i}", "core_share": 0.3} for i in range(5)]  # hours ago, shared
    phases = [{"core_share": 0.98}, {"core_share": 0.99}]
    cached = _Run({"probe": probe, "phases": phases}, {"ceilings_from": {"run": "earlier"}})
    common.say_core_share(cached)
    assert cached.meta["threads"]["core_share"] == pytest.approx(0.985) and cached.notes == []
    only = _Run({"probe": probe}, {"ceilings_from": {"run": "earlier"}})
    common.say_core_share(only)
    assert "core_share" not in only.meta["threads"]
    measured = _Run({"probe": probe, "phases": phases}, {})  # measured now: this run's
    common.say_core_share(measured)
    assert measured.meta["threads"]["core_share"] == 0.3 and measured.notes
