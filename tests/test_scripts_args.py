"""The benchmark scripts' argument checks and their guards on earlier results: a bad argument
is one clear error line (argparse's exit 2, never a traceback), a non-empty --out is refused
without --force, and a failing child command says why. Each script's own parser runs here
(its main() with the arguments, in this process: nothing is measured, the check comes
first), and nothing is timed."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def script(name: str):
    """scripts/<name>.py as a module (its folder on sys.path, as when it is run)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(capsys, monkeypatch, name: str, args: list[str], entry: str = "main") -> str:
    """Run the script's entry with args: it must stop with exit 2 and one error line."""
    module = script(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *args])
    with pytest.raises(SystemExit) as stop:
        getattr(module, entry)()
    assert stop.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1, errors
    return errors[0]


BAD = [
    ("bench_calibration", ["--reference", "x.csv", "--runs", "0"], "--runs"),
    ("bench_cpu_clock", ["--rounds", "0"], "--rounds"),
    ("bench_cpu_clock", ["--hogs", "0"], "--hogs"),
    ("bench_paged", ["--rounds", "0"], "--rounds"),
    ("bench_paged", ["--batches", "1,x"], "--batches"),
    ("bench_paged", ["--threads", "0"], "--threads"),
    ("bench_packed", ["--rounds", "0"], "--rounds"),
    ("bench_packed", ["--preset", "nope"], "--preset"),
    ("bench_packed", ["--core", "99999"], "--core"),
    ("bench_phases", ["--rounds", "0"], "--rounds"),
    ("bench_phases", ["--threads", "0"], "--threads"),
    ("bench_occupancy", ["--requests", "0"], "--requests"),
    ("bench_scaling", ["--sizes", "1e4"], "--sizes"),
    ("bench_scaling", ["--sizes", "0"], "--sizes"),
    ("http_cost", ["--runs", "0"], "--runs"),
    ("host_drift", ["--quiet", "0.5", "--busy", "1", "--window", "1"], "--quiet"),
    ("host_drift", ["--busy", "0.5", "--window", "1", "--quiet", "1"], "--busy"),
]


@pytest.mark.parametrize(("name", "args", "said"), BAD,
                         ids=[f"{n} {' '.join(a)}" for n, a, _ in BAD])  # fmt: skip
def test_a_bad_argument_is_one_error_line(capsys, monkeypatch, name, args, said):
    assert said in refused(capsys, monkeypatch, name, args)


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--threads", "0"], ["--batches", "1,x"],
                                  ["--rounds-generate", "0"]])  # fmt: skip
def test_bench_peer_checks_its_arguments(capsys, args):
    with pytest.raises(SystemExit) as stop:
        script("bench_peer").parse_args(args)
    assert stop.value.code == 2
    assert args[0] in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--rounds", "0"], ["--ranks", "0"], ["--presets", "nope"]])
def test_bench_tp_checks_its_arguments(capsys, args):
    with pytest.raises(SystemExit) as stop:
        script("bench_tp").parse(args)
    assert stop.value.code == 2
    assert args[0] in capsys.readouterr().err


def test_bench_tp_defaults_parse():
    args = script("bench_tp").parse([])
    assert args.presets == ["tiny", "cpu-small"] and args.layout == "measured"


def test_host_drift_refuses_the_busy_loop_on_the_works_core(capsys, monkeypatch):
    core = sorted(os.sched_getaffinity(0))[0]
    said = refused(capsys, monkeypatch, "host_drift",
                   ["--core", str(core), "--busy-core", str(core)])  # fmt: skip
    assert "--busy-core" in said


def full(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.csv").write_text("an earlier run\n")
    return out


def test_an_earlier_runs_folder_is_refused_without_force(capsys, monkeypatch, tmp_path):
    out = str(full(tmp_path))
    reference = tmp_path / "real_steps.csv"
    reference.write_text("step_ms\n1\n")
    for name, args in [
        ("bench_calibration", ["--reference", str(reference), "--out", out]),
        ("bench_cpu_clock", ["--out", out]),
        ("http_cost", ["--out", out]),
    ]:
        assert "not empty" in refused(capsys, monkeypatch, name, args)


def test_bench_calibration_refuses_one_tree_twice(capsys, monkeypatch, tmp_path):
    reference = tmp_path / "real_steps.csv"
    reference.write_text("step_ms\n1\n")
    args = ["--reference", str(reference), "--tree", str(ROOT), "--tree", str(ROOT)]
    assert "--tree" in refused(capsys, monkeypatch, "bench_calibration", args)


def test_bench_vllm_predict_keeps_an_earlier_prediction_csv(capsys, monkeypatch, tmp_path):
    (tmp_path / "prediction.csv").write_text("an earlier run\n")
    said = refused(capsys, monkeypatch, "bench_vllm_predict", ["--out", str(tmp_path)], "parse")
    assert "prediction.csv" in said


def test_newcomer_check_refuses_an_earlier_pass(capsys, tmp_path):
    (tmp_path / "quiet" / "phases").mkdir(parents=True)
    (tmp_path / "quiet" / "phases" / "result.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        script("newcomer_check").main(["--out", str(tmp_path), "--only", "quiet"])
    assert stop.value.code == 2
    assert "already holds phases" in capsys.readouterr().err


def test_newcomer_check_compare_writes_a_new_name(tmp_path, capsys):
    (tmp_path / "comparison.md").write_text("an earlier comparison\n")
    assert script("newcomer_check").main(["--out", str(tmp_path), "--compare"]) == 0
    assert (tmp_path / "comparison.md").read_text() == "an earlier comparison\n"
    assert (tmp_path / "comparison-2.md").read_text().startswith("# Newcomer commands")


def test_newcomer_knees_without_a_range_say_dash():
    nc = script("newcomer_check")
    q = {"continuous": {"knee_rps": 6.0, "knee_rps_slow": None, "knee_rps_fast": 7.0}}
    lo = {"continuous": {"knee_rps": 6.5, "knee_rps_slow": 5.5, "knee_rps_fast": 7.5}}
    (line,) = nc.knees_agree(q, lo)
    assert line.endswith("| - |") and "(--7)" in line
    q["continuous"]["knee_rps_slow"] = 5  # a whole number read back from JSON: still judged
    (line,) = nc.knees_agree(q, lo)
    assert line.endswith("| yes |")


def test_paired_share_refuses_a_folder_without_runs(capsys, monkeypatch, tmp_path):
    said = refused(capsys, monkeypatch, "paired_share", [str(tmp_path)])
    assert "no real points" in said


def test_paired_share_reads_a_client_cap_off_a_row():
    import math

    cap_of = script("paired_share").cap_of
    assert cap_of({"max_concurrency": 4.0}) == 4
    assert cap_of({"max_concurrency": math.nan}) is None
    assert cap_of({}) is None


def test_bench_calibration_prices_with_the_saved_model():
    """The row-block term kept (row_block 3 here) is in the price, as serve-sweep uses it."""
    import pandas as pd

    from benchbatch.core import calibration as cal
    from benchbatch.core import pricing, saved_calibration

    saved = ROOT / "results" / "row-blocks-cpu-2core-intel" / "fused1" / "step_cost.json"
    steps = pd.read_csv(saved.parent / "calibration_steps.csv").head(200).to_dict("records")
    got = script("bench_calibration").priced(saved, steps)
    model = saved_calibration.read(saved)["model"]
    assert model.row_block == json.loads(saved.read_text())["row_block"] == 3
    decode = [r for r in steps if cal.step_kind(r) == "decode" and r["step_ms"] > 0]
    assert got["decode"] == statistics.median(
        pricing.loop_ms(r) / pricing.price_ms(model, r) for r in decode
    )
    summary = json.loads(saved.read_text())
    without = cal.model_of([summary["coefficients_s"].get(t, 0.0) for t in cal.TERMS])
    assert any(pricing.price_ms(without, r) != pricing.price_ms(model, r) for r in decode)


def test_common_types_and_names(tmp_path):
    import argparse

    common = script("script_common")
    assert common.int_list("1, 32,128") == [1, 32, 128]
    assert common.positive_int("3") == 3
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            common.positive_int(bad)
    for bad in ("1,x", "1e4", "0,1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            common.int_list(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        common.positive_float("0")
    path = tmp_path / "comparison.md"
    assert common.new_name(path) == path
    path.write_text("kept")
    assert common.new_name(path) == tmp_path / "comparison-2.md"
    record = common.machine(threads=1)
    assert record["threads"] == 1 and record["cpus"] and "load" in record


def test_a_failing_child_says_why(capsys):
    common = script("script_common")
    child = [sys.executable, "-c", "import sys; sys.exit('--out: x is not empty; pass --force')"]
    with pytest.raises(SystemExit) as stop:
        common.run_child(child, "serve-sweep into x")
    assert "serve-sweep into x failed (exit 1): --out: x is not empty" in str(stop.value.code)
    assert common.run_child([sys.executable, "-c", "print(1)"], "ok",
                            stdout=subprocess.PIPE).stdout == "1\n"  # fmt: skip


CAPPED = ROOT / "results" / "engine-concurrency-cpu-2core-intel"  # a --max-concurrency sweep


def test_paired_share_reproduces_a_capped_runs_prediction():
    """Its points at rate max behind client caps: labelled with the cap, simulated behind it,
    the "share" way gives the run's own prediction.csv ratios."""
    import pandas as pd

    rows = pd.DataFrame(script("paired_share").points(CAPPED))
    share = rows[rows["how"] == "share"]
    assert share["point"].str.contains("in flight").all() and share["below_saturation"].any()
    pred = pd.read_csv(CAPPED / "prediction.csv")
    both = share.merge(pred, on=["point", "metric"], suffixes=("", "_run"))
    assert len(both) == len(share) > 0
    assert both["ratio"].to_numpy() == pytest.approx(both["ratio_run"].to_numpy())


def test_paired_prompt_pairs_finds_capped_points():
    got = script("paired_prompt_pairs").run_folder(CAPPED)
    assert len(got["with"]) == len(got["without"]) > 0
