"""compare of serve-sweep folders (issue 28): points matched by absolute rate (rate_rps within
a rounding tolerance, not by their labels), which ones matched and which exist in one run
only said; whole run names; the SLO table says "none" for a run that never met the SLO.

The folders are written here, so every number is known: two machines' sweeps whose rates
are partly the same (1, 2 req/s and max), one rate a rounding apart (1 and 1.0000004), and
one label shared by two different rates (3 req/s against 3.4 req/s, both labelled "3")."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from benchbatch.app.cli import app
from benchbatch.output import compare_serve as merging

SERVE_COLUMNS = ("tpot_p50_s", "tpot_p99_s", "ttft_p50_s", "output_throughput_tps")
POLICIES = ("static", "continuous")


def write_sweep(folder, rates: list[tuple[str, float]], ttft: dict, sustained: dict) -> None:
    """A serve-sweep folder: serve.csv (each point's p99 TTFT from ttft[(policy, rate_rps)])
    and slo.csv (sustained[policy], None: never within the SLO)."""
    folder.mkdir()
    serve = [
        {"policy": p, "source": "sim", "rate": label, "rate_rps": rps,
         "ttft_p99_s": ttft[(p, rps)], **dict.fromkeys(SERVE_COLUMNS, 0.5)}
        for p in POLICIES for label, rps in rates
    ]  # fmt: skip
    pd.DataFrame(serve).to_csv(folder / "serve.csv", index=False)
    slo = [{"policy": p, "source": "sim", "sustained_rps": sustained[p]} for p in POLICIES]
    pd.DataFrame(slo).to_csv(folder / "slo.csv", index=False)
    meta = {"schema_version": 1, "command": "serve-sweep", "status": "complete",
            "written_files": ["metadata.json", "serve.csv", "slo.csv"],
            "environment": {"device_name": "cpu"}}  # fmt: skip
    (folder / "metadata.json").write_text(json.dumps(meta))


A_RATES = [("1", 1.0), ("2", 2.0), ("3", 3.0), ("max", math.inf)]
B_RATES = [("1.0000004", 1.0000004), ("2", 2.0), ("3", 3.4), ("8", 8.0), ("max", math.inf)]


def ttft_of(rates, scale: float) -> dict:
    """A distinct p99 TTFT per point: policy index + rate / 100, times the run's scale."""
    return {(p, rps): scale * (i + 1 + min(rps, 100) / 100) for i, p in enumerate(POLICIES)
            for _, rps in rates}  # fmt: skip


@pytest.fixture
def sweeps(tmp_path):
    a, b = tmp_path / "a-machine-with-a-long-name-one", tmp_path / "b-machine-with-a-long-name-two"
    write_sweep(a, A_RATES, ttft_of(A_RATES, 1.0), {"static": 2.0, "continuous": 3.0})
    write_sweep(b, B_RATES, ttft_of(B_RATES, 10.0), {"static": None, "continuous": 8.0})
    return a, b


def compare(tmp_path, *args):
    result = CliRunner().invoke(app, ["compare", *map(str, args), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    return result


def test_points_are_matched_by_absolute_rate_not_by_label(tmp_path, sweeps):
    a, b = sweeps
    compare(tmp_path, a, b, "--label", "A,B")
    merged = pd.read_csv(tmp_path / "c" / "compare-serve.csv", dtype={"matched_rate": str})
    keys = {(r.run, r.rate_rps): r.matched_rate for r in merged.itertuples()}
    assert keys[("A", 1.0)] == keys[("B", 1.0000004)] == "1"  # a rounding apart: one point
    assert keys[("A", 3.0)] == "3" and keys[("B", 3.4)] == "3.4"  # one label, two rates
    assert keys[("A", math.inf)] == keys[("B", math.inf)] == "max"
    meta = json.loads((tmp_path / "c" / "metadata.json").read_text())
    assert meta["serve_rates"] == {
        "tolerance": merging.RATE_TOLERANCE,
        "matched": ["1", "2", "max"],
        "not_in_every_run": [
            {"rate": "3", "runs": ["A"]},
            {"rate": "3.4", "runs": ["B"]},
            {"rate": "8", "runs": ["B"]},
        ],  # fmt: skip
    }


def printed_rows(stdout: str, title: str) -> list[list[str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rule = next(i for i in range(start, len(lines)) if set(lines[i].strip()) == {"─"})
    rows = []
    for line in lines[rule + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_the_table_sets_matched_points_side_by_side_and_says_which(tmp_path, sweeps):
    a, b = sweeps
    out = compare(tmp_path, a, b, "--label", "A,B").stdout
    rows = {tuple(r[:3]): r[3:] for r in printed_rows(out, "serve:")}
    a_ttft, b_ttft = ttft_of(A_RATES, 1.0), ttft_of(B_RATES, 10.0)
    one = [f"{a_ttft[('static', 1.0)]:.3g}", f"{b_ttft[('static', 1.0000004)]:.3g}", "x10"]
    assert rows[("static", "sim", "1")] == one
    assert rows[("continuous", "sim", "3")][1:] == ["-", "-"]  # B has no 3 req/s point
    assert rows[("continuous", "sim", "3.4")][0] == "-"
    # In rate order within each policy: 1, 2, 3, 3.4, 8, max.
    static = [r[2] for r in printed_rows(out, "serve:") if r[0] == "static"]
    assert static == ["1", "2", "3", "3.4", "8", "max"]
    said = next(line for line in out.splitlines() if line.startswith("serve points matched"))
    assert "in every run 1, 2, max" in said
    assert "3 only in A" in said and "3.4 only in B" in said and "8 only in B" in said


def test_the_slo_table_says_none_for_a_run_that_never_met_it(tmp_path, sweeps):
    a, b = sweeps
    out = compare(tmp_path, a, b, "--label", "A,B").stdout
    rows = {tuple(r[:2]): r[2:] for r in printed_rows(out, "slo:")}
    assert rows[("static", "sim")] == ["2", "none", "-"]
    assert rows[("continuous", "sim")] == ["3", "8", "x2.67"]


def test_whole_run_names_are_shown(tmp_path, sweeps):
    """Folder names of 30 characters on an 80-column terminal: wrapped, never cut."""
    a, b = sweeps
    out = compare(tmp_path, a, b).stdout
    assert "…" not in out
    first_cells = [r[0] for r in printed_rows(out, "runs")]
    joined = "".join(first_cells)
    assert a.name in joined and b.name in joined
    assert joined.index(b.name) == len(a.name)  # the two names, each whole, in order


def test_rate_groups_keep_one_runs_points_apart():
    shared = merging.rate_groups({"x": [1.0, 1.0001], "y": [1.00005]})
    assert shared["x"] == {1.0: 1.0, 1.0001: 1.0001}  # a run's own points never merge
    assert shared["y"] == {1.00005: 1.0}


def write_knees(folder, knees: dict) -> None:
    """slo.csv's knee columns added to a written sweep: knees[policy] = (knee, slow, fast),
    None: the sweep never bracketed the knee (empty cells)."""
    slo = pd.read_csv(folder / "slo.csv")
    for i, col in enumerate(merging.KNEE_COLUMNS):
        slo[col] = [knees[p][i] if knees[p] else math.nan for p in slo["policy"]]
    slo.to_csv(folder / "slo.csv", index=False)


def test_the_simulated_knees_are_set_side_by_side_with_their_ranges(tmp_path, sweeps):
    """Each run's knee with its range (every step 10% slower-faster), then B's over A's and
    whether the ranges overlap: static's do (2.2-2.9 against 1.8-2.4), continuous's do not
    (5.5-7 against 7.2-9); a run without a bisected knee shows "-"."""
    a, b = sweeps
    write_knees(a, {"static": (2.5, 2.2, 2.9), "continuous": (6.2, 5.5, 7.0)})
    write_knees(b, {"static": (2.1, 1.8, 2.4), "continuous": (8.1, 7.2, 9.0)})
    out = compare(tmp_path, a, b, "--label", "A,B").stdout
    rows = {r[0]: " ".join(r[1:]) for r in printed_rows(out, "slo: simulated knee")}
    assert rows["static"] == "2.5 (2.2-2.9) 2.1 (1.8-2.4) x0.84, ranges overlap"
    assert rows["continuous"] == "6.2 (5.5-7) 8.1 (7.2-9) x1.31, ranges apart"
    merged = pd.read_csv(tmp_path / "c" / "compare-slo.csv")
    assert set(merging.KNEE_COLUMNS) <= set(merged.columns)  # the numbers, unrounded
    write_knees(b, {"static": None, "continuous": (6.0, 5.4, 6.7)})
    again = tmp_path / "again"
    again.mkdir()
    out = compare(again, a, b, "--label", "A,B").stdout
    rows = {r[0]: " ".join(r[1:]) for r in printed_rows(out, "slo: simulated knee")}
    assert rows["static"] == "2.5 (2.2-2.9) - -"
    assert rows["continuous"] == "6.2 (5.5-7) 6 (5.4-6.7) x0.968, ranges overlap"


def test_ranges_overlap_at_a_shared_end_and_not_past_it():
    assert merging.ranges_overlap((1.0, 2.0), (2.0, 3.0))
    assert not merging.ranges_overlap((1.0, 2.0), (2.0000001, 3.0))
    assert merging.ranges_overlap((3.0, 1.0), (1.5, 1.6))  # either end order, one inside
    assert merging.ranges_overlap((1.0, 2.0), (math.nan, 3.0)) is None
    # whole-number ends (a knee range of batches read back from JSON) are ends: they read
    # as missing, None
    assert merging.ranges_overlap((8, 16), (12.0, 32)) is True
    assert merging.ranges_overlap((8, 16), (17, 32)) is False
    assert merging.ranges_overlap((True, 2.0), (1.0, 3.0)) is None


def write_sweep_steps(folder, steps: dict[int, tuple[float, float, float]]) -> None:
    """A sweep folder at context 8: steps[batch] = (median, p10, p90) ms."""
    folder.mkdir()
    rows = [
        {"phase": "decode", "label": f"decode b={b}", "context": 8, "batch": b, "step_ms": ms,
         "step_ms_p10": p10, "step_ms_p90": p90, "tokens_per_s": b / ms * 1e3, "status": "ok"}
        for b, (ms, p10, p90) in steps.items()
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(folder / "sweep.csv", index=False)
    meta = {"schema_version": 1, "command": "sweep", "status": "complete",
            "written_files": ["metadata.json", "sweep.csv"],
            "environment": {"device_name": "cpu"}}  # fmt: skip
    (folder / "metadata.json").write_text(json.dumps(meta))


def test_the_ratios_runs_conclude_with_are_set_side_by_side_with_their_ranges(tmp_path):
    """Sweep's throughput and step-time ratios, batch 1 to 4, from each run's rows with their
    p10-p90, worked by hand: A's throughput x2 (4 x 8/25 = 1.28 to 4 x 12/18 = 2.67), step
    time x2 (18/12 = 1.5 to 25/8 = 3.12); B's x2.67 (4 x 9/17 = 2.12 to 4 x 11/13 = 3.38)
    and x1.5 (13/11 = 1.18 to 17/9 = 1.89): both ranges overlap A's. C's batch 4 as fast as
    its batch 1: x4 (3.27-4.89) and x1 (0.818-1.22), apart from A's."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c-run"
    write_sweep_steps(a, {1: (10.0, 8.0, 12.0), 4: (20.0, 18.0, 25.0)})
    write_sweep_steps(b, {1: (10.0, 9.0, 11.0), 4: (15.0, 13.0, 17.0)})
    write_sweep_steps(c, {1: (10.0, 9.0, 11.0), 4: (10.0, 9.0, 11.0)})
    result = CliRunner().invoke(app, ["compare", str(a), str(b), str(c), "--label", "A,B,C",
                                      "--out", str(tmp_path / "out"), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    said = {k["ratio"]: k for k in json.loads(result.stdout)["conclusions"]}
    tp = said["throughput, batch 1 to 4, context 8"]
    step = said["step time, batch 1 to 4, context 8"]
    assert tp["runs"]["A"] == pytest.approx([2.0, 1.28, 4 * 12 / 18])
    assert tp["runs"]["B"] == pytest.approx([40 / 15, 4 * 9 / 17, 4 * 11 / 13])
    assert step["runs"]["A"] == pytest.approx([2.0, 1.5, 25 / 8])
    assert step["runs"]["C"] == pytest.approx([1.0, 9 / 11, 11 / 9])
    for k in (tp, step):
        assert k["versus_first"]["B"]["overlap"] is True
        assert k["versus_first"]["C"]["overlap"] is False
    assert tp["versus_first"]["C"]["ratio"] == pytest.approx(2.0)
    (tmp_path / "printed").mkdir()
    out = compare(tmp_path / "printed", a, b, c, "--label", "A,B,C").stdout
    table = out[out.index("conclusions:") :]
    for cell in ("(1.28-2.67)", "(2.12-3.38)", "(3.27-4.89)", "(1.5-3.12)", "(0.818-1.22)"):
        assert cell in table  # never folded inside
    words = table.split()  # cells wrap across lines: count the words
    assert words.count("overlap") == 2 and words.count("apart") == 2


def test_a_rate_that_never_left_the_slo_is_a_lower_bound_and_so_is_its_ratio(tmp_path):
    """continuous within the SLO at every rate of run A (up to 2: it sustains 2 at least)
    and leaving it at 1.5 in run B read "2, 1, x0.5", a halving it does not establish: A's
    2 is said ">=2" and the ratio "<=x0.5"; both bounds, no ratio."""
    a, b = tmp_path / "a", tmp_path / "b"
    rates = [("1", 1.0), ("2", 2.0)]
    write_sweep(a, rates, ttft_of(rates, 1.0), {"static": 1.0, "continuous": 2.0})
    write_sweep(b, rates, ttft_of(rates, 1.0), {"static": 1.0, "continuous": 1.0})
    for folder, leaves in ((a, {"static": 2.0, "continuous": None}),
                           (b, {"static": None, "continuous": 2.0})):  # fmt: skip
        slo = pd.read_csv(folder / "slo.csv")
        slo["leaves_slo_rps"] = [leaves[p] for p in slo["policy"]]
        slo.to_csv(folder / "slo.csv", index=False)
    out = compare(tmp_path, a, b, "--label", "A,B").stdout
    rows = {tuple(r[:2]): r[2:] for r in printed_rows(out, "slo:")}
    assert rows[("continuous", "sim")] == [">=2", "1", "<=x0.5"]
    assert rows[("static", "sim")] == ["1", ">=1", ">=x1"]
