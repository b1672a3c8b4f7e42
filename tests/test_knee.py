"""serve-sweep's knees (issue 28, a conclusion with its noise): each policy's largest rate
within the SLO bisected between the sweep's last rate within and its first outside, against
a brute-force scan of the same simulation; the same knee with every step 10% slower and
faster, each step cost scaled being the same run in scaled time (checked exactly)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchbatch.app.cli import app
from benchbatch.core.options import WorkloadOptions
from benchbatch.core.serving import ServingSLO
from benchbatch.core.step_model import StepCostModel
from benchbatch.experiments.serve import knees, probe, workloads
from benchbatch.experiments.serve.options import ServeOptions

# A small engine: 4 ms a step, 1 ms a decode token, 20 us a prefill token, 1 us a KV entry.
COST = StepCostModel(4e-3, 1e-3, 2e-5, 1e-6, per_sequence_s=2e-4)
SLO = ServingSLO(0.5, 0.02)


def workload(requests: int = 80):
    opts = ServeOptions(slo_ttft=SLO.ttft_s, slo_tpot=SLO.tpot_s)
    lengths = WorkloadOptions(requests=requests, slots=4, max_output=32, median=8.0)
    w = workloads.draw(opts, lengths, seed=3)
    return w, probe.Setup(4, 256, opts.chunk, SLO)


def within(w, setup, policy: str, rate: float, cost=COST) -> bool:
    return setup.slo.within(probe.point_row(probe.simulate_point(w, policy, rate, setup, cost),
                                            setup))  # fmt: skip


@pytest.mark.parametrize("lo, hi", [(1.0, 2.0), (5.0, 6.0), (3.0, 3.3), (0.1, 100.0)])
def test_knee_brackets_a_threshold_from_any_guess_then_bisects_it(lo, hi):
    """A threshold at pi: from a guess below it, above it, around it or far too wide, the
    knee is a rate within, and the one 2% above it is not."""
    calls = []

    def under_pi(rate: float) -> bool:
        calls.append(rate)
        return rate <= math.pi

    got = knees.knee(under_pi, lo, hi, steps=30)
    assert got <= math.pi < got * (1 + knees.KNEE_WIDTH)
    assert len(calls) <= 30


@pytest.mark.parametrize("lo, hi", [(1.0, 4.0), (3.0, 3.3), (2.0, 100.0), (3.1, 3.15)])
def test_knee_calls_count_the_simulations_a_bracket_takes(lo, hi):
    """The progress bar's estimate: a bracket that holds the knee takes exactly
    knee_calls(hi / lo) simulations, known or asked first."""
    for known in (True, False):
        calls = []

        def under_pi(rate: float, calls=calls) -> bool:
            calls.append(rate)
            return rate <= math.pi

        knees.knee(under_pi, lo, hi, known=known)
        assert len(calls) == knees.knee_calls(hi / lo, known=known), (lo, hi, known)


def test_knee_gives_up_within_its_steps():
    """Too few simulations to bracket the knee: NaN, never a guess; too few to finish the
    bisection: the last rate seen within (a lower bound)."""
    assert math.isnan(knees.knee(lambda r: r <= 1.0, 100.0, 101.0, steps=3))
    got = knees.knee(lambda r: r <= math.pi, 1.0, 10.0, known=True, steps=2)
    assert got <= math.pi and got * (1 + knees.KNEE_WIDTH) < math.pi


def test_a_scaled_step_cost_is_the_same_run_in_scaled_time():
    """Every step 1.25x slower at rate r is the same run as the original at 1.25 r, every
    time 1.25x longer: the identity that makes the 10%-slower knee a knee of the same
    simulator (checked on every policy, latencies and duration exactly)."""
    w, setup = workload()
    k = 1.25
    for policy in probe.POLICIES:
        slow = probe.point_row(probe.simulate_point(w, policy, 3.0, setup, COST.scaled(k)),
                               setup)  # fmt: skip
        fast = probe.point_row(probe.simulate_point(w, policy, 3.0 * k, setup, COST), setup)
        for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p99_s", "duration_s"):
            assert slow[key] == pytest.approx(k * fast[key], rel=1e-9), (policy, key)
        assert slow["request_throughput_rps"] == pytest.approx(
            fast["request_throughput_rps"] / k, rel=1e-9
        )


def test_each_knee_is_where_a_brute_force_scan_leaves_the_slo():
    """The knees of a sweep on a coarse grid, against a scan of 150 rates on a fine one:
    each knee lies where the scan leaves the SLO, to 2% (between the scan's first rate
    outside and its last within: a p99 of 80 requests can flicker across the limit over a
    few percent of rate, here up to 5.3%), and so do the knees with every step 10% slower
    and faster; each knee is itself within the SLO."""
    w, setup = workload()
    grid = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    rows = [probe.point_row(probe.simulate_point(w, p, r, setup, COST), setup)
            for p in probe.POLICIES for r in grid]  # fmt: skip
    found = knees.knees(w, rows, setup, COST)
    assert {k["policy"] for k in found} == set(probe.POLICIES)  # each leaves within the grid
    for k in found:
        # The scan spans the coarse grid's own bracket (its last rate within, its first
        # outside), widened 35% each way for the knees of steps 10% slower and faster:
        # 150 rates, 1.1% apart; it must itself start within and end outside.
        mine = [r for r in rows if r["policy"] == k["policy"]]
        first_out = min(r["rate_rps"] for r in mine if not setup.slo.within(r))
        last_in = max(r["rate_rps"] for r in mine if r["rate_rps"] < first_out)
        scan = np.geomspace(last_in / 1.35, first_out * 1.35, 150)
        for name, cost in (("knee_rps", COST), ("knee_rps_slow", COST.scaled(1.1)),
                           ("knee_rps_fast", COST.scaled(0.9))):  # fmt: skip
            ok = [within(w, setup, k["policy"], r, cost) for r in scan]
            assert ok[0] and not ok[-1], (k["policy"], name, "the scan brackets no knee")
            i_out = ok.index(False)
            i_in = max(i for i, x in enumerate(ok) if x)
            assert scan[i_in] / scan[i_out] <= 1.08, "a flicker wider than this test allows for"
            # A flicker narrower than the scan's step can lie between two of its rates.
            low = scan[max(0, i_out - 2)] / (1 + knees.KNEE_WIDTH)
            assert low <= k[name] <= scan[i_in + 1], (k, name)
            assert within(w, setup, k["policy"], k[name], cost)
        assert k["knee_rps_slow"] < k["knee_rps"] < k["knee_rps_fast"]


def test_serve_sweep_reports_each_knee_with_its_range(runner, tmp_path):
    """slo.csv's simulated rows carry their knees between the rates they sustain and leave
    at, metadata says how they were found, the conclusion says them; a rate at the knee is
    within the SLO and one 2.5% above it is not (served again with --rates)."""
    import pandas as pd

    from benchbatch.core import calibration as cal
    from benchbatch.runtime.device import cpu_model

    rows = []  # an engine of 4 ms a step, 1 ms a decode token, 20 us a prefill token
    for b in range(1, 9):
        for n in (16, 64, 256):
            rows.append({"sequences": b, "decode_tokens": b, "prefill_tokens": 0,
                         "context_tokens": b * n, "step_ms": 4.0 + 1.0 * b})  # fmt: skip
            rows.append({"sequences": 1, "decode_tokens": 0, "prefill_tokens": n * b,
                         "context_tokens": 0, "step_ms": 4.0 + 0.02 * n * b})  # fmt: skip
    summary = cal.fit(rows)["summary"]
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps(summary | {"conditions": {"device": cpu_model()}}))
    base = ["serve-sweep", "--engine", "sim", "--step-costs", str(path), "--requests", "80",
            "--slots", "4", "--max-output", "32", "--median", "8", "--slo-ttft", "0.2s",
            "--slo-tpot", "20ms"]  # fmt: skip
    out = tmp_path / "sweep"
    result = runner.invoke(app, [*base, "--out", str(out)])
    assert result.exit_code == 0, result.output
    slo = pd.read_csv(out / "slo.csv").set_index("policy")
    for policy, r in slo.iterrows():
        assert r["sustained_rps"] <= r["knee_rps"] <= r["leaves_slo_rps"], policy
        assert r["knee_rps_slow"] < r["knee_rps"] < r["knee_rps_fast"], policy
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["knees"]["width"] == knees.KNEE_WIDTH and len(meta["knees"]["policies"]) == 3
    assert "the knees, bisected to 2%" in " ".join(result.output.split())
    knee = slo.loc["continuous", "knee_rps"]
    again = tmp_path / "again"
    rates = f"{float(knee)!r},{float(knee) * 1.025!r}"
    result = runner.invoke(app, [*base, "--policies", "continuous", "--rates", rates,
                                 "--out", str(again)])  # fmt: skip
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(again / "serve.csv").sort_values("rate_rps")
    assert serve["within_slo"].tolist() == [True, False]


def sweep_rows(points: dict[str, list[tuple[float, bool, float]]]) -> list[dict]:
    """Simulated serve rows: points[policy] = [(rate_rps, within_slo, request throughput)]."""
    return [{"policy": p, "source": probe.SIM, "rate": f"{r:g}" if math.isfinite(r) else "max",
             "rate_rps": r, "within_slo": ok, "request_throughput_rps": tput,
             "goodput_rps": 0.0, "output_throughput_tps": 0.0}
            for p, pts in points.items() for r, ok, tput in pts]  # fmt: skip


def test_a_knee_is_sought_below_the_policys_capacity_only():
    """The bracket each knee is bisected in: between the last rate within and the first
    outside, capped at the policy's throughput with everything queued (x1.02); above the
    sweep when every finite rate was within; none when the SLO held past that capacity
    (a finite run's end, not a sustained rate), at max too, or never."""
    inf = math.inf
    rows = sweep_rows({
        "static": [(1, True, 1), (2, True, 2), (4, False, 3.5), (inf, False, 10.0)],
        "continuous": [(1, True, 1), (2, True, 2), (4, True, 4), (inf, False, 5.0)],
        "chunked": [(1, True, 1), (2, False, 2), (4, False, 2), (inf, False, 1.5)],
    })  # fmt: skip
    got = {b[0]: b[1:] for b in knees.knee_brackets(rows)}
    assert got == {"static": (2, 4, 10.0), "continuous": (4, 5.0 * 1.02, 5.0),
                   "chunked": (1, 1.5 * 1.02, 1.5)}  # fmt: skip
    rows = sweep_rows({
        "continuous": [(1, True, 1), (2, True, 2), (inf, True, 5.0)],  # within at max
        "chunked": [(1, False, 1), (2, False, 2), (inf, False, 5.0)],  # never within
    })  # fmt: skip
    assert knees.knee_brackets(rows) == []
    # Within the SLO at a swept rate past its capacity (a finite run ends before its queue
    # grows): the knee is the capacity (the quiet newcomer run's continuous, which had none
    # and so nothing to compare with the loaded run's).
    past = sweep_rows({"static": [(1, True, 1), (2, True, 2), (4, True, 3), (inf, False, 3.0)]})
    assert knees.knee_brackets(past) == [("static", 3.0, 3.0, 3.0)]


def test_no_knee_lies_past_the_capacity():
    """A policy within the SLO at every rate up to its capacity (a loose SLO): its knee, and
    those of steps 10% slower and faster, stop at the capacity each cost gives (the slower,
    1/1.1 of it), never past it where only the run's end keeps the latency down."""
    w, setup = workload()
    loose = probe.Setup(setup.slots, setup.budget, setup.chunk, ServingSLO(1e3, 1e3))
    rows = [probe.point_row(probe.simulate_point(w, p, r, loose, COST), loose)
            for p in probe.POLICIES for r in (1.0, 2.0, math.inf)]  # fmt: skip
    top = {r["policy"]: r["request_throughput_rps"] for r in rows if math.isinf(r["rate_rps"])}
    for r in rows:  # the max point made outside, as a tight SLO would make it
        r["within_slo"] = math.isfinite(r["rate_rps"])
    found = knees.knees(w, rows, loose, COST)
    assert {k["policy"] for k in found} == set(probe.POLICIES)
    for k in found:
        cap = top[k["policy"]]
        assert cap / (1 + knees.KNEE_WIDTH) <= k["knee_rps"] <= cap
        assert k["knee_rps_slow"] <= cap / 1.1 and k["knee_rps_fast"] <= cap / 0.9
        assert k["knee_rps_slow"] >= cap / 1.1 / (1 + knees.KNEE_WIDTH)


def test_a_policy_within_the_slo_past_its_capacity_has_its_knee_there():
    """Swept at a rate past its capacity and still within the SLO (the run ended before its
    queue grew): the knee is exactly the capacity, and with every step 10% slower and
    faster the capacity over that factor, bisected to 2%; the progress estimate counts the
    simulations those take."""
    w, setup = workload()
    loose = probe.Setup(setup.slots, setup.budget, setup.chunk, ServingSLO(1e3, 1e3))
    top = probe.point_row(probe.simulate_point(w, "continuous", math.inf, loose, COST), loose)
    cap = top["request_throughput_rps"]
    rows = [probe.point_row(probe.simulate_point(w, "continuous", r, loose, COST), loose)
            for r in (cap / 4, cap * 1.5)] + [top]  # fmt: skip
    for r in rows:  # within at both swept rates, not at max (as a tight TTFT limit makes it)
        r["within_slo"] = math.isfinite(r["rate_rps"])
    calls = []
    found = knees.knees(w, rows, loose, COST, advance=lambda: calls.append(1))
    (k,) = found
    assert k["knee_rps"] == cap
    assert cap / 1.1 / (1 + knees.KNEE_WIDTH) <= k["knee_rps_slow"] <= cap / 1.1
    assert cap / 0.9 / (1 + knees.KNEE_WIDTH) <= k["knee_rps_fast"] <= cap / 0.9
    assert len(calls) <= knees.expected_knee_calls(knees.knee_brackets(rows))
