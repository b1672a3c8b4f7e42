"""compare reads a peer's saved result beside benchbatch's runs: vLLM bench serve's
--save-result --save-detailed JSON and GuideLLM's JSON report (real files, tests/data/),
every metric recomputed from their per-request times (core/peers/), on one table and one
figure with a serve-sweep folder."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from benchbatch.app.cli import app

DATA = Path(__file__).parent / "data"
COSTS = Path(__file__).parent.parent / "results" / "cpu-2core-amd-epyc-serve" / "step_cost.csv"


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    from typer.testing import CliRunner

    out = tmp_path_factory.mktemp("sim") / "run"
    args = ["serve-sweep", "--engine", "sim", "--step-costs", str(COSTS), "--rates", "2,4,max",
            "--requests", "60", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    "name, source", [("vllm_bench_serve_20.json", "vllm-bench-serve"),
                     ("vllm_guidellm_report.json", "guidellm")],  # fmt: skip
)
def test_a_peers_result_stands_beside_a_run(runner, tmp_path, sim_run, name, source):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", str(sim_run), str(DATA / name), "--out", str(out)])
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "compare-serve.csv")
    peer = serve[serve["source"] == source]
    assert len(peer) >= 1 and (peer["run"] == name).all()
    assert set(serve[serve["run"] == "run"]["source"]) == {"sim"}
    checked = pd.read_csv(out / "compare-peer_check.csv")
    same = checked[checked["same_definition"]]
    assert len(same) > 0 and same["agrees"].all()  # their numbers, recomputed here
    assert "recomputed exactly" in result.output
    assert (out / "compare-serve.png").exists()


def test_a_json_that_is_no_peers_result_is_one_line(runner, tmp_path, sim_run):
    bad = tmp_path / "other.json"
    bad.write_text('{"hello": 1}')
    result = runner.invoke(app, ["compare", str(sim_run), str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "other.json" in result.output
