"""A reused calibration's conditions (core/saved_calibration.compare, runtime/calibrate.py's
conditions, experiments/ablation/run.cost_model): every condition that changes a step's
cost is recorded and checked (the model's shape, the weights' layout, --compile and the KV
cache's layout beside device, threads, dtype and versions), what a calibration does not say
is said, a difference is kept with the run (metadata.json's warnings, step_cost.json's
differences), the calibration runs in the cache layout of the runs it prices, and a
calibration's CPU-clock fit prices only a run on the CPU clock."""

from __future__ import annotations

import json

import pytest
from test_calibration import HERE, shared_core_steps

from benchbatch.core import calibration as cal
from benchbatch.core import cpu_clock
from benchbatch.core import saved_calibration as sc
from benchbatch.core.options import RunOptions
from benchbatch.core.workload import Request

NOW = HERE | {"model": "hidden 64, 2 layers, 4 heads (2 KV), intermediate 192, vocab 256",
              "weight_layout": "columns, fused", "compiled": "eager",
              "kv_layout": "contiguous", "benchbatch": "1.0", "host_id": "abc",
              }  # fmt: skip


@pytest.mark.parametrize(("key", "then"), [
    ("model", "hidden 256, 4 layers, 4 heads (4 KV), intermediate 704, vocab 2048"),
    ("weight_layout", "rows, fused"),
    ("compiled", "max-autotune-no-cudagraphs"),
    ("kv_layout", "paged, blocks of 8"),
])  # fmt: skip
def test_the_shape_layouts_and_compile_are_flagged_by_name(key, then):
    """A calibration of another model (predictions x1.3-x5 off, said nowhere), another
    weight layout (chosen by timing in each run), --compile or a paged cache: flagged."""
    lines = sc.compare(NOW | {key: then}, NOW)
    assert len(lines) == 1 and f"{key} {then} at calibration, {NOW[key]} now" in lines[0]
    assert sc.compare(NOW, NOW) == []


def test_what_a_calibration_does_not_say_is_said_and_text_compares_as_text():
    """Conditions missing from a saved calibration (an older benchbatch's, or edited) are
    named as not checked, never passed over in silence; a threads of "1" is 1."""
    partial = {k: v for k, v in NOW.items() if k not in ("device", "model")}
    (line,) = sc.compare(partial, NOW)
    assert "do not say their device, model" in line and "not checked" in line
    assert sc.compare(NOW | {"threads": "1"}, NOW) == []


def test_the_conditions_hold_the_shape_layouts_and_the_runs_cores(tiny_model):
    from benchbatch.runtime import calibrate as cb

    cfg = tiny_model.cfg
    seen = cb.conditions(tiny_model, {"kv_layout": "paged", "block_size": 8}, cores=64)
    assert seen["model"] == (f"hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads "
                             f"({cfg.kv_heads or cfg.heads} KV), intermediate "
                             f"{cfg.intermediate}, vocab {cfg.vocab}")  # fmt: skip
    assert seen["kv_layout"] == "paged, blocks of 8" and seen["compiled"] == "eager"
    assert seen["weight_layout"] == tiny_model.layout.name
    assert cb.conditions(tiny_model)["kv_layout"] == "contiguous"
    # The load class on the run's physical cores (a pinned thread sees one): a load of 2
    # on 64 cores is quiet, whatever this thread's affinity.
    import os

    if hasattr(os, "getloadavg") and os.getloadavg()[0] < 8:
        assert seen["load_class"] == "quiet"


def test_the_calibration_runs_in_the_cache_layout_it_prices(tiny_model, one_thread):
    """occupancy --engine real --kv-layout paged was calibrated on a contiguous cache: the
    calibration's runs now carry the layout, their plans replayed without it (the
    scheduler's), and they run on the paged engine to the steps planned."""
    from benchbatch.runtime import calibrate as cb
    from benchbatch.runtime.runs import Finished

    plan = cb.plan_for(3, [8, 8, 20], 8, 16, tiny_model.cfg.max_context, decode_steps=2)
    paged = {"kv_layout": "paged", "block_size": 4}
    runs = cb.runs(plan, paged)
    assert all(r.run.settings["kv_layout"] == "paged" for r in runs)
    assert all(r.run.settings["block_size"] == 4 for r in runs)
    assert "chunk_size" in runs[-1].run.settings  # the chunked run keeps its own settings
    assert cb.total_steps(runs) == cb.total_steps(cb.runs(plan))
    events = list(cb.events(tiny_model, runs))
    rows = [e for e in events if not isinstance(e, Finished)]
    assert len(rows) == cb.total_steps(runs)
    assert all(e.result.complete for e in events if isinstance(e, Finished))


class _Rec:
    """What cost_model touches of a run: its metadata, folder, tables, warnings, notes."""

    def __init__(self, folder, clock: str) -> None:
        self.meta = {"threads": {"clock": clock, "physical_cores": 2}}
        self.folder, self.tables, self.warnings, self.notes = folder, {}, [], []

    def put(self, table, rows):
        self.tables[table] = rows

    def warning(self, text, later=False):
        if text:
            self.warnings.append(text)

    def note(self, text):
        if text:
            self.notes.append(text)


def _given(tmp_path, **conditions):
    rows = shared_core_steps(lambda i: 0.5)
    out = cpu_clock.with_cpu_clock(cal.fit(rows), rows)
    path = tmp_path / "saved" / "step_cost.json"
    path.parent.mkdir()
    path.write_text(json.dumps(out["summary"] | {"conditions": NOW | conditions}))
    return sc.given([path]), path


def test_a_reused_cpu_clock_fit_prices_only_a_run_on_the_cpu_clock(tmp_path, tiny_model):
    """A calibration's CPU-clock fit (one thread) reused by a real run on the wall clock
    (two threads) priced its sweep at the core share of another thread count (x27 off):
    only a run on the CPU clock gets it, or a simulation with no model (of the
    calibration's own run)."""
    from benchbatch.experiments.ablation.probe import Budgets
    from benchbatch.experiments.ablation.run import cost_model
    from benchbatch.runtime.device import device_name

    given, _ = _given(tmp_path, device=device_name(tiny_model.embed.weight.device))
    assert given["cpu_model"] is not None
    budgets, requests = Budgets(2, 16, 8), [Request(0, 8, 4)]
    for net, clock, expect in ((tiny_model, "cpu", True), (tiny_model, "wall", False),
                               (None, None, True)):  # fmt: skip
        rec = _Rec(tmp_path, clock)
        model, cpu = cost_model(rec, net, budgets, requests, given, RunOptions(),
                                cpu_clock=True)  # fmt: skip
        assert model is given["model"] and (cpu is given["cpu_model"]) == expect, clock


def test_a_reused_calibrations_differences_are_kept_with_the_run(tmp_path, tiny_model):
    """Flagged on stderr once, and never again: the differences are now in step_cost.json
    (with the file the calibration came from) and the run's warnings."""
    from benchbatch.experiments.ablation.probe import Budgets
    from benchbatch.experiments.ablation.run import cost_model
    from benchbatch.runtime.device import device_name

    device = device_name(tiny_model.embed.weight.device)
    given, path = _given(tmp_path, device=device, threads=64, model="another")
    rec = _Rec(tmp_path, "cpu")
    cost_model(rec, tiny_model, Budgets(2, 16, 8), [Request(0, 8, 4)], given, RunOptions())
    text = " ".join(rec.warnings)
    assert "threads 64 at calibration" in text and "model another at calibration" in text
    saved = json.loads((tmp_path / "step_cost.json").read_text())
    assert saved["differences"] == rec.meta["step_cost"]["differences"] == [rec.warnings[0]]
    assert saved["reused_from"] == [str(path.resolve())]
    assert saved["conditions"]["threads"] == 64  # the calibration used, as it was made


def test_the_recorders_warnings_reach_metadata_and_result_json(tmp_path):
    """Every warning a run says is kept: metadata.json's and result.json's "warnings"."""
    from benchbatch.output import results
    from benchbatch.output.recorder import Recorder

    rec = Recorder.__new__(Recorder)
    rec.meta = {}
    Recorder.warning(rec, "the step-cost calibration was made under other conditions (x)")
    Recorder.warning(rec, "the step-cost calibration was made under other conditions (x)")
    Recorder.warning(rec, None)
    assert rec.meta["warnings"] == ["the step-cost calibration was made under other conditions (x)"]
    results.write_result(tmp_path, rec.meta, {})
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["warnings"] == rec.meta["warnings"]


def test_a_warning_about_a_finished_table_is_kept_now_and_said_under_it(tmp_path, capsys):
    """A view's warnings under its tables (steps spread wide, a p99 over few requests) were
    said and never kept: the run keeps them now (metadata's "warnings"), and the view's
    last lines say them, before the folder."""
    from benchbatch.output import render
    from benchbatch.output.recorder import Recorder

    rec = Recorder.__new__(Recorder)
    rec.meta, rec.later, rec.folder = {}, [], tmp_path
    Recorder.warning(rec, "said now")
    Recorder.warning(rec, "about the table", later=True)
    now = capsys.readouterr().err
    assert "said now" in now and "about the table" not in now
    assert rec.meta["warnings"] == ["said now", "about the table"]
    render.results_line(rec)
    out = capsys.readouterr()
    assert "about the table" in out.err and "said now" not in out.err
    assert f"results: {tmp_path}" in out.out + out.err


def test_a_reused_calibrations_largest_batch_is_checked_against_the_slots(tmp_path):
    """A calibration at 4 slots pricing a sweep at 32 said nothing of the batches it never
    ran: past its largest batch the price is extrapolated, said; within it, nothing."""
    from benchbatch.experiments.ablation.probe import Budgets
    from benchbatch.experiments.ablation.run import cost_model

    given, _ = _given(tmp_path)
    given["summary"] = given["summary"] | {"largest_batch": 4}
    said = []
    for slots in (4, 32):
        rec = _Rec(tmp_path, "cpu")
        cost_model(rec, None, Budgets(slots, 64, 8), [Request(0, 8, 4)], given, RunOptions())
        said.append(rec.warnings)
    assert said[0] == []
    assert len(said[1]) == 1 and "batches of up to 4 sequences" in said[1][0]
    assert "32 slots" in said[1][0]


def test_a_simulation_on_step_costs_names_the_model_and_device_options_it_ignores(
    runner, tmp_path
):
    """ablation --engine sim --step-costs builds no model: --hidden, --threads and --dtype
    changed nothing and were said nowhere (serve-sweep named --hidden, not --threads)."""
    from test_ablation import SMALL

    from benchbatch.app.cli import app

    _, path = _given(tmp_path)
    args = ["ablation", *SMALL, "--step-costs", str(path), "--hidden", "256", "--threads", "2",
            "--dtype", "bf16", "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stderr.split())
    assert "--hidden, --dtype, --threads only apply with --engine real or without " \
           "--step-costs; ignored" in text  # fmt: skip
    plain = runner.invoke(app, ["ablation", *SMALL, "--step-costs", str(path), "--out",
                                str(tmp_path / "plain")])  # fmt: skip
    assert plain.exit_code == 0 and "ignored" not in plain.stderr


def test_occupancy_says_and_keeps_the_step_costs_it_simulates_on(tmp_path):
    """occupancy --step-costs without the real engine priced its memory policies' time on
    them unsaid: no fit line, nothing in metadata, no word of a batch past the
    calibration's largest. Said and kept now, as every command reusing one does."""
    from typer.testing import CliRunner

    from benchbatch.app.cli import app

    _, path = _given(tmp_path, largest_batch=2)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(doc | {"largest_batch": 2}))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["occupancy", "--requests", "20", "--slots", "4",
                                      "--step-costs", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["step_cost"]["reused_from"] and (out / "step_cost.json").is_file()
    assert "batches of up to 2 sequences" in " ".join(meta["warnings"])
    assert "step costs calibrated on AMD EPYC" in result.stderr  # its conditions, said
    assert "step cost" in result.stdout.lower()  # the fit's line under the tables
