"""result.json, as vLLM's --save-result (issue 28): in every run folder, at the run's end
whatever the end (complete, or interrupted with "complete": false), written whole, listed in
metadata.json's written_files (so --force replaces it and a plain --out never overwrites it);
its metrics are the command's --json document. And CSVs keep raw times at full precision."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd

from benchbatch.app.cli import app
from benchbatch.output import results

TINY = ["--preset", "tiny", "--device", "cpu", "--no-roofline", "--repeats", "1", "--min-time", "0"]
PHASES = ["phases", *TINY, "--prefill", "8", "--decode-batch", "1,2", "--context", "8"]
OCCUPANCY = ["occupancy", "--requests", "30", "--slots", "4", "--max-output", "40"]


def saved(folder) -> dict:
    return json.loads((folder / "result.json").read_text())


def meta_of(folder) -> dict:
    return json.loads((folder / "metadata.json").read_text())


def test_result_json_metrics_are_the_json_document(runner, tmp_path):
    for command in (PHASES, OCCUPANCY):
        out = tmp_path / command[0]
        result = runner.invoke(app, [*command, "--json", "--out", str(out)])
        assert result.exit_code == 0, result.output
        printed = json.loads(result.stdout)
        assert printed.pop("folder") == str(out)
        doc = saved(out)
        assert doc["metrics"] == printed  # one source: the view's document
        assert doc["complete"] is True and doc["status"] == "complete"
        assert doc["command"] == command[0] and doc["options"] == meta_of(out)["options"]
        assert doc["finished_utc"] == meta_of(out)["finished_utc"]
        on_disk = sorted(p.name for p in out.iterdir())
        assert doc["files"] == meta_of(out)["written_files"] == on_disk
    phases = saved(tmp_path / "phases")
    assert phases["device"]["device"] == "cpu" and phases["device"]["dtype"] == "fp32"
    assert phases["model"]["name"] == "tiny"
    rows = pd.read_csv(tmp_path / "phases" / "phases.csv")
    assert [r["step_ms"] for r in phases["metrics"]["rows"]] == rows["step_ms"].tolist()
    occupancy = saved(tmp_path / "occupancy")
    assert occupancy["device"]["device"] is None  # a simulation uses no device
    steps = pd.read_csv(tmp_path / "occupancy" / "occupancy.csv")["total_steps"].tolist()
    assert [r["total_steps"] for r in occupancy["metrics"]["rows"]] == steps


def test_an_interrupted_run_writes_result_json_marked_incomplete(runner, tmp_path, monkeypatch):
    from benchbatch.output.plots import phases

    def interrupted(rows, path, title):  # Ctrl-C as the figure is drawn, every row measured
        raise KeyboardInterrupt

    monkeypatch.setattr(phases, "phases_figure", interrupted)
    out = tmp_path / "run"
    result = runner.invoke(app, [*PHASES, "--out", str(out)])
    assert result.exit_code == 130, result.output
    doc = saved(out)
    assert doc["complete"] is False and doc["status"] == "interrupted"
    assert len(doc["metrics"]["rows"]) == len(pd.read_csv(out / "phases.csv")) == 3
    assert "result.json" in meta_of(out)["written_files"]
    assert doc["files"] == meta_of(out)["written_files"] == sorted(p.name for p in out.iterdir())


def test_a_run_whose_metrics_fail_still_writes_result_json(runner, tmp_path, monkeypatch):
    from benchbatch.app import registry

    view = next(v for e, v in registry.registered() if e.name == "occupancy")

    def broken(rec):
        raise KeyError("summary")

    monkeypatch.setattr(view, "document", broken)
    out = tmp_path / "run"
    assert runner.invoke(app, [*OCCUPANCY, "--out", str(out)]).exit_code == 0
    doc = saved(out)
    assert doc["complete"] is True and doc["metrics"] is None
    assert doc["metrics_error"] == "KeyError: 'summary'"


def test_every_commands_metrics_are_made_from_a_run_cut_before_its_end():
    """A run interrupted before its end-of-run metadata (reproduce's claims, a summary):
    result.json's metrics are made of what was measured, never a KeyError in place of them
    (an interrupted reproduce wrote "metrics_error": "KeyError: 'claims'")."""
    from benchbatch.app import registry

    class Cut:  # a run's recorder with no row kept and none of its end-of-run metadata
        meta, tables, ceilings, quiet = {}, {}, None, True

        def rows(self, table):
            return []

    for experiment, view in registry.registered():
        doc = view.document(Cut())
        assert isinstance(doc, dict), experiment.name
        results.json_text(doc)  # as result.json writes it


def test_result_json_is_never_overwritten_without_force(runner, tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, [*OCCUPANCY, "--out", str(out)]).exit_code == 0
    first = (out / "result.json").read_text()
    again = runner.invoke(app, [*OCCUPANCY, "--seed", "3", "--out", str(out)])
    assert again.exit_code == 2 and (out / "result.json").read_text() == first
    forced = runner.invoke(app, [*OCCUPANCY, "--seed", "3", "--out", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    doc = saved(out)
    assert doc["options"]["seed"] == 3 and json.loads(first)["options"]["seed"] != 3
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_csv_times_keep_full_precision(tmp_path):
    """Arrival times around t = 50 s (a Poisson stream at 20 req/s), as serve-sweep writes
    requests.csv: 6 significant digits lost 1e-4 s of each (4% of a gap); they now read back
    within 1e-12, and as text exactly the floats written."""
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1 / 20, 1200))
    assert arrivals[-1] > 50
    rows = [{"request_id": i, "arrival_s": t, "ttft_s": t * 1e-3} for i, t in enumerate(arrivals)]
    results.write_csv(tmp_path / "requests.csv", rows)
    text = (tmp_path / "requests.csv").read_text()
    back = pd.read_csv(io.StringIO(text))
    late = arrivals > 50
    rel = np.abs(back["arrival_s"].to_numpy() - arrivals) / arrivals
    assert late.any() and rel[late].max() <= 1e-12 and rel.max() <= 1e-12
    cells = [line.split(",") for line in text.splitlines()[1:]]
    assert [float(c[1]) for c in cells] == arrivals.tolist()  # the very floats
    assert [float(c[2]) for c in cells] == (arrivals * 1e-3).tolist()
    assert back["request_id"].tolist() == list(range(1200))  # counts stay integers
    assert not math.isnan(back["arrival_s"].iloc[-1])


def test_json_prints_numpy_numbers_as_result_json_writes_them(tmp_path, capsys):
    """--json and result.json write one JSON: a number numpy made as Python's, NaN null."""
    from benchbatch.output import render

    doc = {"n": np.int64(3), "ok": np.bool_(True), "x": np.float64("nan"), "y": [np.float32(0.5)]}
    render.print_json(doc)
    printed = json.loads(capsys.readouterr().out)
    results.write_json(tmp_path / "r.json", doc)
    assert printed == json.loads((tmp_path / "r.json").read_text())
    assert printed == {"n": 3, "ok": True, "x": None, "y": [0.5]}
