"""The prediction table (core/prediction.py) and its figure (output/plots/prediction.py):
verdicts on hand-made pairs, the figure's identity line and target band, and serve-sweep's
prediction.csv built from the same pairs as its sim_vs_real.csv."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D

from benchbatch.app.cli import app
from benchbatch.core import prediction as pr
from benchbatch.output.plots import prediction as plot

PAIRS = [
    {"point": "a", "metric": "ttft_p50_s", "simulated": 1.0, "measured": 1.05},  # x1.05 in
    {"point": "b", "metric": "ttft_p50_s", "simulated": 2.0, "measured": 2.4},  # x1.2 out
    {"point": "a", "metric": "ttft_p99_s", "simulated": 1.0, "measured": 1.2},  # x1.2 in
    {"point": "b", "metric": "ttft_p99_s", "simulated": 4.0, "measured": 3.0},  # x0.75 out
    {"point": "a", "metric": "tpot_p50_s", "simulated": 0.0, "measured": 0.01},  # no ratio
    {"point": "a", "metric": "itl_p99_s", "simulated": 1.0, "measured": 9.0},  # no target
    {"point": "a", "metric": "e2e_p50_s", "simulated": 10.0, "measured": 9.0},  # x0.9: edge
]


def test_each_pair_gets_its_ratio_band_and_verdict():
    rows = pr.prediction_rows(PAIRS)
    got = [(r["point"], r["metric"], r["within"]) for r in rows]
    assert got == [
        ("a", "ttft_p50_s", True),
        ("b", "ttft_p50_s", False),
        ("a", "ttft_p99_s", True),
        ("b", "ttft_p99_s", False),
        ("a", "tpot_p50_s", None),
        ("a", "itl_p99_s", None),
        ("a", "e2e_p50_s", True),
    ]
    assert [r["ratio"] for r in rows[:4]] == pytest.approx([1.05, 1.2, 1.2, 0.75])
    assert math.isnan(rows[4]["ratio"])
    assert (rows[0]["target_low"], rows[0]["target_high"]) == (0.9, 1.1)
    assert (rows[2]["target_low"], rows[2]["target_high"]) == (0.8, 1.25)
    assert set(pr.COLUMNS) <= set(rows[0])


def test_the_verdict_line_counts_points_within_each_band():
    line = pr.verdict(pr.prediction_rows(PAIRS))
    assert line.startswith("the simulation predicts TTFT p50 within 10% at 1 of 2 points")
    assert "(x1.05-x1.20)" in line
    assert "TTFT p99 within x0.8-x1.25 at 1 of 2 points (x0.75-x1.20)" in line
    assert "E2E p50 within 10% at 1 of 1 point (x0.90)" in line
    assert "TPOT" not in line and "itl" not in line  # nothing judged for them
    assert pr.verdict(pr.prediction_rows(PAIRS[4:6])) is None
    s = pr.summary(pr.prediction_rows(PAIRS))
    assert (s["pairs"], s["judged"], s["within_target"]) == (7, 5, 3)


def test_pairs_of_takes_the_metrics_both_rows_hold():
    sim = {"ttft_p50_s": 1.0, "e2e_p50_s": 2.0, "x": 1}
    real = {"ttft_p50_s": 1.5, "e2e_p50_s": 2.0, "tpot_p50_s": 3.0}
    pairs = pr.pairs_of("p", sim, real, rate="1")
    assert [(p["metric"], p["simulated"], p["measured"], p["rate"]) for p in pairs] == [
        ("ttft_p50_s", 1.0, 1.5, "1"),
        ("e2e_p50_s", 2.0, 2.0, "1"),
    ]


def test_the_figure_has_the_identity_line_and_the_target_band():
    rows = pr.prediction_rows(PAIRS)
    fig = plot.prediction_figure(rows, None, "test")
    drawn = [ax for ax in fig.axes if ax.get_visible()]
    # A panel per metric with a finite pair: TTFT p50, TTFT p99, TPOT p50 (0 simulated:
    # nothing to draw, left out), ITL p99, E2E p50.
    assert [ax.get_title() for ax in drawn] == ["TTFT p50", "TTFT p99", "itl_p99_s", "E2E p50"]
    for ax in drawn:
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        identity = [a for a in ax.get_children()
                    if isinstance(a, Line2D) and a.get_label() == plot.IDENTITY_LABEL]  # fmt: skip
        assert len(identity) == 1
        x, y = identity[0].get_data()
        assert list(x) == pytest.approx(list(y))
    for ax, (lo, hi) in zip(drawn[:2], [(0.9, 1.1), (0.8, 1.25)], strict=True):
        bands = [
            a
            for a in ax.collections
            if isinstance(a, PolyCollection) and a.get_label().startswith(plot.BAND_LABEL)
        ]
        assert len(bands) == 1  # fmt: skip
        verts = bands[0].get_paths()[0].vertices
        ratios = verts[:, 1] / verts[:, 0]
        assert ratios.min() == pytest.approx(lo) and ratios.max() == pytest.approx(hi)
    itl = drawn[2]  # no target for ITL: no band
    assert not [a for a in itl.collections if a.get_label().startswith(plot.BAND_LABEL)]
    import matplotlib.pyplot as plt

    plt.close(fig)


class _Rec:
    def __init__(self, folder):
        self.folder, self.meta, self.tables = folder, {}, {}

    def put(self, table, rows):
        self.tables[table] = rows


def test_saturated_points_stay_in_the_table_and_out_of_the_verdict(tmp_path):
    pairs = [
        {"point": "1 req/s", "metric": "ttft_p50_s", "simulated": 1.0, "measured": 1.0,
         "below_saturation": True},
        {"point": "max", "metric": "ttft_p50_s", "simulated": 1.0, "measured": 3.0,
         "below_saturation": False},
    ]  # fmt: skip
    rec = _Rec(tmp_path)
    out = plot.record(rec, pairs, "test")
    assert len(rec.tables["prediction"]) == 2
    assert out["verdict"].startswith("the simulation predicts TTFT p50 within 10% at 1 of 1")
    assert out["verdict"].endswith("below saturation: 1 of 2 points")
    assert (tmp_path / "prediction.png").stat().st_size > 0
    assert rec.meta["prediction"] == out


def test_serve_sweep_writes_prediction_from_the_sim_vs_real_pairs(runner, tmp_path):
    out = tmp_path / "real"
    args = ["serve-sweep", "--preset", "tiny", "--requests", "30", "--real-requests", "8",
            "--median", "4", "--max-output", "8", "--prompt-len", "16", "--max-prompt", "64",
            "--rates", "50,max", "--real-rates", "50,max", "--policies", "continuous",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    versus = pd.read_csv(out / "sim_vs_real.csv", dtype={"rate": str})
    table = pd.read_csv(out / "prediction.csv", dtype={"rate": str})
    assert set(table["metric"]) == set(pr.METRICS)
    assert len(table) == 2 * len(pr.METRICS)
    both = table.merge(versus, on=["policy", "rate", "metric"], suffixes=("", "_v"))
    assert len(both) == 2 * 5  # TTFT p50/p99, TPOT p50/p99, E2E p50 in both; E2E p99 here
    assert (both["simulated"] == both["simulated_v"]).all()
    # the prediction is the median over the band (core/prediction.band_median); the one
    # simulation at the calibration's price is serve.csv's sim-matched row
    assert (table["simulated_low"] <= table["simulated"]).all()
    assert (table["simulated"] <= table["simulated_high"]).all()
    matched = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    matched = matched[matched["source"] == "sim-matched"].set_index("rate")
    for _, row in table.iterrows():
        assert row["simulated_at_price"] == pytest.approx(matched.loc[row["rate"], row["metric"]],
                                                          rel=1e-12)  # fmt: skip
    assert (both["measured"] == both["measured_v"]).all()
    assert both["ratio"].to_numpy() == pytest.approx(both["measured_over_simulated"].to_numpy())
    assert not table[table["rate"] == "max"]["below_saturation"].any()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["prediction"]["verdict"].startswith("the simulation predicts")
    assert "the simulation predicts" in result.stdout
    assert (out / "prediction.png").stat().st_size > 0
    cost = json.loads((out / "step_cost.json").read_text())
    assert cost["source"] == "calibration" and set(cost["kinds"]) == {"decode", "prefill",
                                                                      "mixed"}  # fmt: skip
    assert cost["conditions"]["device_type"] == "cpu" and "threads" in cost["conditions"]
    # the fit the sweep is simulated on: the CPU clock's (one thread, a CPU)
    assert meta["sweep_step_costs"] == "cpu clock"
    assert "engine calibration on the CPU clock (" in result.stdout
    # Each ratio's interval, recomputed from requests.csv (the point's own requests, paired
    # by id, the real rows against their sim-matched twins), is prediction.csv's.
    reqs = pd.read_csv(out / "requests.csv", dtype={"rate": str})
    for _, row in table.iterrows():
        column, q = pr.PER_REQUEST[row["metric"]]
        mine = reqs[(reqs["policy"] == row["policy"]) & (reqs["rate"] == row["rate"])]
        real = mine[mine["source"] == "real"].set_index("request_id")[column]
        sim = mine[mine["source"] == "sim-matched"].set_index("request_id")[column]
        ids = sorted(set(real.index) & set(sim.index))
        assert len(ids) == 8
        lo, hi = pr.ratio_interval(real[ids].to_numpy(), sim[ids].to_numpy(), q)
        # over the simulation at the price (the requests' own), carried to the prediction
        shift = row["simulated_at_price"] / row["simulated"]
        assert (row["ratio_low"], row["ratio_high"]) == pytest.approx((lo * shift, hi * shift),
                                                                      nan_ok=True)  # fmt: skip
    p50 = table[table["metric"].str.endswith("p50_s")]
    assert (p50["ratio_low"] <= p50["ratio_high"]).all()
    said = " ".join(result.output.split())
    assert "how sure each point's ratio is, given its requests" in said
    assert ("real engine over its simulation (the same requests at the same times; the median "
            "of its simulations with every step up to 10% slower or faster)") in said
    assert meta["prediction"]["how_sure"] in said
    # Every request queued at once: each time is the steps' own, so with every step up to
    # 10% slower or faster each metric moves by exactly as much.
    at_max = table[table["rate"] == "max"]
    for bound, factor in (("simulated_low", 0.9), ("simulated_high", 1.1)):
        assert (at_max[bound] / at_max["simulated"]).to_numpy() == pytest.approx(factor,
                                                                                 rel=1e-9)
    assert "with every step up to 10% slower or faster" in said
    # Each point's speed, from real_steps.csv by hand: its steps' CPU time (with the gap
    # before each) over their CPU-clock price, summed over the point's non-idle steps. At
    # max every time is the steps' own, so the simulation at that speed is the matched one
    # scaled by it, and the ratio at speed the ratio over it.
    steps = pd.read_csv(out / "real_steps.csv", dtype={"rate": str})
    work = steps[(steps["decode_tokens"] + steps["prefill_tokens"]) > 0]
    spent = work["cpu_ms"] + work["gap_cpu_ms"].fillna(0).clip(lower=0)
    by_hand = (spent.groupby(work["rate"]).sum()
               / work["priced_cpu_ms"].groupby(work["rate"]).sum())  # fmt: skip
    for rate, group in table.groupby("rate"):
        assert group["steps_over_price"].to_numpy() == pytest.approx(by_hand[rate], rel=1e-9)
    # The prediction of each point after the first is priced at the speed of the point
    # served before it (priced_speed; the first at the price): at max, served after 50, the
    # simulations at the two speeds are one another scaled by their quotient.
    first = steps["rate"].iloc[0]
    assert first == "50" and (table[table["rate"] == "50"]["priced_speed"] == 1.0).all()
    assert at_max["priced_speed"].to_numpy() == pytest.approx(by_hand["50"], rel=1e-9)
    assert (at_max["simulated_at_speed"] / at_max["simulated"]).to_numpy() == pytest.approx(
        (at_max["steps_over_price"] / at_max["priced_speed"]).to_numpy(), rel=1e-9)
    assert (at_max["ratio_at_speed"] * at_max["steps_over_price"]).to_numpy() == pytest.approx(
        (at_max["ratio"] * at_max["priced_speed"]).to_numpy(), rel=1e-9)
    served = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    priced = served[served["source"] == "sim-matched"].set_index("rate")["priced_speed"]
    served = served[served["source"] == "real"].set_index("rate")["steps_over_price"]
    assert served.to_dict() == pytest.approx(by_hand.to_dict(), rel=1e-9)
    assert priced.to_dict() == pytest.approx({"50": 1.0, "max": by_hand["50"]}, rel=1e-9)
    assert f"serve.csv's priced_speed: x{by_hand['50']:.2f} of the calibration's price" in said
    assert meta["prediction"]["at_speed"] in said and "priced at its own speed" in said


def test_a_ratio_interval_resamples_requests_in_pairs():
    """Each request's measured and simulated values are drawn together: measured 1.1 x
    simulated for every request, however spread the requests, gives every draw 1.1 (drawn
    apart, the spread alone would widen it); requests without both values are left out."""
    sim = [0.01 * k**2 for k in range(1, 41)]
    assert pr.ratio_interval([1.1 * v for v in sim], sim, 50) == pytest.approx((1.1, 1.1))
    lo, hi = pr.ratio_interval([1.1 * v for v in sim] + [math.nan], sim + [5.0], 99)
    assert (lo, hi) == pytest.approx((1.1, 1.1))
    assert all(math.isnan(v) for v in pr.ratio_interval([1.0], [1.0], 50))


def test_a_ratio_interval_matches_every_resample_enumerated():
    """Against the exact bootstrap distribution (every one of the 4^4 equally likely draws of
    four requests enumerated): at most 5% (plus the sampling's slack) of it lies below the
    interval and above it."""
    import itertools

    import numpy as np

    measured, simulated = [1.0, 2.5, 3.0, 7.0], [1.2, 2.0, 3.5, 5.0]
    exact = []
    for draw in itertools.product(range(4), repeat=4):
        m = np.percentile([measured[i] for i in draw], 50)
        exact.append(m / np.percentile([simulated[i] for i in draw], 50))
    exact = np.array(exact)
    lo, hi = pr.ratio_interval(measured, simulated, 50, draws=20_000)
    assert (exact < lo - 1e-12).mean() <= 0.05 + 0.01
    assert (exact > hi + 1e-12).mean() <= 0.05 + 0.01
    assert lo < np.median(exact) < hi


def test_how_sure_names_each_metrics_median_interval_and_how_many_reach_the_band():
    rows = pr.prediction_rows([
        {"point": "a", "metric": "ttft_p50_s", "simulated": 1.0, "measured": 1.2,
         "ratio_low": 1.05, "ratio_high": 1.4},  # reaches 0.9-1.1
        {"point": "b", "metric": "ttft_p50_s", "simulated": 1.0, "measured": 1.3,
         "ratio_low": 1.2, "ratio_high": 1.44},  # does not
        {"point": "c", "metric": "ttft_p50_s", "simulated": 1.0, "measured": 1.0,
         "ratio_low": 0.95, "ratio_high": 1.045},
        {"point": "a", "metric": "tpot_p50_s", "simulated": 1.0, "measured": 1.0,
         "ratio_low": math.nan, "ratio_high": math.nan},  # no interval: not named
        {"point": "b", "metric": "tpot_p50_s", "simulated": 1.0, "measured": 0.0,
         "ratio_low": 0.0, "ratio_high": 0.0},  # every token at once: no width either
    ])  # fmt: skip
    line = pr.how_sure(rows)
    assert "TTFT p50 x1.20 wide, reaching its band at 2 of 3" in line  # 1.1, 1.2, 1.33
    assert "TPOT" not in line
    assert pr.how_sure(pr.prediction_rows(PAIRS)) is None
    grouped = pr.with_intervals(
        [{"point": "p", "metric": "e2e_p50_s"}, {"point": "p", "metric": "itl_p99_s"},
         {"point": "q", "metric": "e2e_p50_s"}],
        {("p", "measured"): {1: {"e2e_s": 2.0}, 2: {"e2e_s": 4.0}, 3: {"e2e_s": 9.0}},
         ("p", "simulated"): {1: {"e2e_s": 1.0}, 2: {"e2e_s": 2.0}}},
    )  # fmt: skip
    assert (grouped[0]["ratio_low"], grouped[0]["ratio_high"]) == pytest.approx((2.0, 2.0))
    assert all(math.isnan(g["ratio_low"]) for g in grouped[1:])  # no percentile; no requests


def test_a_point_is_below_saturation_when_it_keeps_up_with_its_arrivals():
    """40 requests on a simulated engine of known capacity (one slot, 10 ms a step, 8
    tokens a request: 12.5 req/s): at 6 req/s (48% busy) the point is below saturation even
    with the last request's output 8x the others' (the last token's time alone says 0.90
    of the offered rate, the rule 0.99); at 25 req/s (twice the capacity) the queue grows
    and it is not (0.60); a span of nothing (the max rate) is not."""
    import numpy as np

    from benchbatch.core.prediction import below_saturation
    from benchbatch.core.scheduler import make_scheduler
    from benchbatch.core.serving import latency_columns
    from benchbatch.core.simulate import simulate_timed
    from benchbatch.core.step_model import StepCostModel
    from benchbatch.core.workload import Request

    cost = StepCostModel(0.01, 0.0, 0.0)
    gaps = np.random.default_rng(3).exponential(1.0, 39)

    def point(rate: float, last_output: int = 8) -> tuple[dict, float]:
        arrivals = np.concatenate([[0.0], np.cumsum(gaps / rate)])
        requests = [Request(i, 1, 8) for i in range(39)] + [Request(39, 1, last_output)]
        run = simulate_timed(requests, arrivals, make_scheduler("continuous", 1), cost)
        span = float(arrivals[-1] - arrivals[0])
        last_token = max(m.finish for m in run.metrics.requests)
        return latency_columns(run.metrics) | {"last_token_s": last_token}, span

    row, span = point(6.0, last_output=64)
    assert span / row["last_token_s"] < 0.91  # the last request's drain alone: 0.90
    assert below_saturation(row, span)
    row, span = point(25.0)
    assert not below_saturation(row, span)
    assert not below_saturation(row, 0.0)


class _PricesRec:
    """What step_prices.say_prices writes of a recorder."""

    def __init__(self, rows):
        self._rows, self.meta, self.notes, self.warnings = rows, {}, [], []

    def rows(self, name):
        assert name == "real_steps"
        return self._rows

    def note(self, line):
        self.notes.append(line)

    def warning(self, line):
        self.warnings.append(line)


def _steps(policy, n, step_ms, priced_ms, gap_ms=0.2):
    return [{"policy": policy, "active": 2, "decode_tokens": 2, "prefill_tokens": 0,
             "padded": 0, "step_ms": step_ms, "gap_ms": gap_ms, "priced_ms": priced_ms}
            for _ in range(n)]  # fmt: skip


def test_steps_priced_off_by_the_calibration_are_a_warning_with_the_advice():
    """A run whose steps (with the host gap before each) took x0.80 of what the calibration
    priced them is warned about, with what to do; one within 0.9-1.1, or too few steps to
    judge, is only noted."""
    from benchbatch.experiments.step_prices import say_prices

    off = _PricesRec(_steps("continuous", 40, 7.8, 10.0) + _steps("static", 40, 9.8, 10.0))
    say_prices(off, off.rows("real_steps"))
    assert len(off.warnings) == 1 and "continuous decode steps took x0.80" in off.warnings[0]
    assert "--step-costs" in off.warnings[0] and "quieter" in off.warnings[0]
    steps = {e["policy"]: e["ratio_p50"] for e in off.meta["real"]["step_prices"]}
    assert steps["continuous"] == pytest.approx(0.8) and steps["static"] == pytest.approx(1.0)
    fine = _PricesRec(_steps("continuous", 40, 9.8, 10.0) + _steps("chunked", 5, 5.0, 10.0))
    say_prices(fine, fine.rows("real_steps"))
    assert fine.warnings == [] and len(fine.notes) == 1


def test_the_step_cost_band_line_names_amplified_points_and_misses_it_accounts_for():
    assert pr.spread_factors() == pytest.approx(
        (0.9, 0.925, 0.95, 0.975, 1.0, 1.025, 1.05, 1.075, 1.1), rel=1e-12)
    assert pr.step_cost_band([2.0, math.nan, 1.5, 3.0]) == (1.5, 3.0)
    assert all(math.isnan(v) for v in pr.step_cost_band([math.nan]))
    row = lambda point, metric, lo, hi, measured, within: {  # noqa: E731
        "point": point, "metric": metric, "simulated": 1.0, "simulated_low": lo,
        "simulated_high": hi, "measured": measured, "within": within}
    rows = [row("s @ 4 req/s", "ttft_p50_s", 0.6, 1.5, 0.7, False),  # x2.5 wide: amplified
            row("s @ 4 req/s", "e2e_p50_s", 0.8, 1.25, 0.85, False),  # x1.56: twice the steps'
            row("c @ 4 req/s", "ttft_p50_s", 0.9, 1.1, 0.8, False),  # outside its band
            row("c @ 4 req/s", "tpot_p50_s", 0.9, 1.1, 1.0, True),
            {"point": "x", "metric": "ttft_p50_s", "within": True}]  # fmt: skip
    line = pr.amplified(rows)
    assert line.startswith("with every step up to 10% slower or faster")
    # (1.25 / 0.8) is 2.22 times the log width of (1.1 / 0.9); (1.1 / 0.9) 1 time.
    assert ("2 values at 1 point move by more than 2 times as much (TTFT p50 at s @ 4 req/s "
            "x0.60-x1.50, E2E p50 at s @ 4 req/s x0.80-x1.25)") in line
    assert "of the values outside their target, 2 of 3 lie within their band" in line
    assert "no point moves" in pr.amplified(rows[3:4]) and pr.amplified(rows[4:]) is None


def test_a_queue_amplifies_a_step_cost_error_as_worked_by_hand():
    """Static, one slot, every step c: request 0 (10 tokens) holds the slot for steps 0-9;
    request 1, arriving at a inside them, gets its first token at the end of step 10, so
    TTFT = (c, 11c - a) and its p50 (12c - a) / 2: with every step scaled by f it is
    (12fc - a) / 2, lowest at f = 0.9 and highest at 1.1, a band x0.70-x1.30 here for
    steps x0.9-1.1; E2E p50 ((21fc - a) / 2) likewise; TPOT (request 0's c) moves as f."""
    import numpy as np

    from benchbatch.core.serving import ServingSLO
    from benchbatch.core.step_model import StepCostModel
    from benchbatch.core.workload import Request
    from benchbatch.experiments.serve import probe, workloads

    c, a = 0.01, 0.08
    w = workloads.ServeWorkload([Request(0, 4, 10), Request(1, 4, 1)], np.array([0.0, a]), "", "")
    setup = probe.Setup(1, 64, 64, ServingSLO(1.0, 1.0))
    cost = StepCostModel(base_s=c, per_decode_token_s=0.0, per_prefill_token_s=0.0)
    sim = probe.point_row(probe.simulate_point(w, "static", 1.0, setup, cost), setup)
    assert sim["ttft_p50_s"] == pytest.approx((12 * c - a) / 2, rel=1e-9)
    spread = probe.spread_rows(w, "static", 1.0, setup, cost)
    assert len(spread) == 8  # the nine factors but 1
    band = {p["metric"]: (p["simulated_low"], p["simulated_high"])
            for p in probe.prediction_pairs(sim, sim, 1.0, spread)}  # fmt: skip
    for metric, steps in (("ttft_p50_s", 12), ("e2e_p50_s", 21)):
        assert band[metric] == pytest.approx(((steps * 0.9 * c - a) / 2,
                                              (steps * 1.1 * c - a) / 2), rel=1e-9)
    assert band["tpot_p50_s"] == pytest.approx((0.9 * c, 1.1 * c), rel=1e-9)
    assert math.log(band["ttft_p50_s"][1] / band["ttft_p50_s"][0]) > pr.AMPLIFIED * math.log(
        1.1 / 0.9)
    # Every metric here grows with the steps' cost: the prediction (the band's median) is
    # the simulation at the price.
    for p in probe.prediction_pairs(sim, sim, 1.0, spread):
        assert p["simulated"] == p["simulated_at_price"] == sim[p["metric"]]


def test_a_prediction_across_a_static_groups_edge_is_the_bands_median_as_worked_by_hand():
    """Static, two slots, every step f * c: request 0 (2 tokens) starts a group alone at 0,
    which ends at 2fc; request 1 (10 tokens, arriving at a = 0.5c) waits for it and starts
    the next group; request 2 (1 token, arriving at b = 2.01c) rides that group where it
    arrives before it starts (f >= 1.005: first token at 3fc) and else waits for its
    10 steps (at 13fc). So its TTFT falls by ten steps as the steps get dearer, across an
    edge just past the price: the prediction is the median of the nine factors' TTFT p99
    (numpy's percentile of the three TTFTs), not the price's own, on the edge's far side."""
    import numpy as np

    from benchbatch.core.serving import ServingSLO
    from benchbatch.core.step_model import StepCostModel
    from benchbatch.core.workload import Request
    from benchbatch.experiments.serve import probe, workloads

    c, a, b = 0.01, 0.005, 0.0201
    w = workloads.ServeWorkload([Request(0, 4, 2), Request(1, 4, 10), Request(2, 4, 1)],
                                np.array([0.0, a, b]), "", "")  # fmt: skip
    setup = probe.Setup(2, 64, 64, ServingSLO(1.0, 1.0))
    cost = StepCostModel(base_s=c, per_decode_token_s=0.0, per_prefill_token_s=0.0)

    def p99(f: float) -> float:
        rides = b <= 2 * f * c
        return float(np.percentile([f * c, 3 * f * c - a, (3 if rides else 13) * f * c - b], 99))

    sim = probe.point_row(probe.simulate_point(w, "static", 1.0, setup, cost), setup)
    assert sim["ttft_p99_s"] == pytest.approx(p99(1.0), rel=1e-9)
    spread = probe.spread_rows(w, "static", 1.0, setup, cost)
    pair = next(p for p in probe.prediction_pairs(sim, sim, 1.0, spread)
                if p["metric"] == "ttft_p99_s")  # fmt: skip
    by_hand = [p99(f) for f in pr.spread_factors()]
    assert pair["simulated_at_price"] == pytest.approx(p99(1.0), rel=1e-9)
    assert pair["simulated"] == pytest.approx(float(np.median(by_hand)), rel=1e-9)
    assert pair["simulated"] < pair["simulated_at_price"] / 1.05  # five of nine miss the group
    assert (pair["simulated_low"], pair["simulated_high"]) == pytest.approx(
        (min(by_hand), max(by_hand)), rel=1e-9)


def test_the_bands_median_keeps_the_price_for_a_monotone_metric_and_skips_unknowns():
    at_price = {"ttft_p50_s": 1.0, "tpot_p50_s": 0.5, "label": "x", "e2e_p50_s": math.nan}
    rising = [{"ttft_p50_s": f, "tpot_p50_s": 0.5 * f ** 3, "e2e_p50_s": 2.0 * f}
              for f in pr.spread_factors() if f != 1.0]  # fmt: skip
    out = pr.band_median(at_price, rising, ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "none"))
    assert out["ttft_p50_s"] == 1.0 and out["tpot_p50_s"] == 0.5 and out["label"] == "x"
    # NaN at the price: the median of the eight others (an even count: the middle two's mean)
    assert out["e2e_p50_s"] == pytest.approx(2.0 * (0.975 + 1.025) / 2, rel=1e-12)
    assert "none" not in out and at_price["ttft_p50_s"] == 1.0  # its input left as it was
    jumpy = [{"ttft_p50_s": v} for v in (0.4, 0.45, 0.5, 0.55, 0.9, 0.95, 1.0, 1.05)]
    assert pr.band_median({"ttft_p50_s": 2.0}, jumpy, ["ttft_p50_s"])["ttft_p50_s"] == 0.9
    assert pr.band_median(at_price, [], ["ttft_p50_s"]) == at_price


def test_sim_vs_real_sets_a_point_beside_its_bands_median():
    from benchbatch.experiments.serve import probe
    from benchbatch.experiments.serve.real import versus

    row = {"policy": "static", "rate": "4"} | {k: 2.0 for k in probe.COMPARED}
    at_price = row | {"ttft_p50_s": 3.0}
    spread = [{"ttft_p50_s": v} | {k: 2.0 for k in probe.COMPARED if k != "ttft_p50_s"}
              for v in (0.9, 0.95, 1.0, 1.05, 1.6, 1.7, 1.8, 1.9)]  # fmt: skip
    got = {p["metric"]: p for p in versus(row, at_price, spread)}
    assert set(got) == set(probe.COMPARED)
    assert got["ttft_p50_s"]["simulated"] == 1.6  # the ninth value, 3.0, is the price's
    assert got["ttft_p50_s"]["measured_over_simulated"] == pytest.approx(2.0 / 1.6)
    assert all(p["simulated"] == 2.0 for m, p in got.items() if m != "ttft_p50_s")


def test_an_interval_is_carried_from_the_simulation_at_the_price_to_the_prediction():
    requests = {("p", "measured"): {1: {"e2e_s": 2.0}, 2: {"e2e_s": 4.0}, 3: {"e2e_s": 6.0}},
                ("p", "simulated"): {1: {"e2e_s": 1.0}, 2: {"e2e_s": 2.0}, 3: {"e2e_s": 3.0}}}
    plain = {"point": "p", "metric": "e2e_p50_s", "simulated": 2.0, "measured": 4.0}
    banded = plain | {"simulated": 2.5, "simulated_at_price": 2.0}
    [a], [b] = pr.with_intervals([plain], requests), pr.with_intervals([banded], requests)
    assert (a["ratio_low"], a["ratio_high"]) == pytest.approx((2.0, 2.0))  # every draw x2
    assert (b["ratio_low"], b["ratio_high"]) == pytest.approx((1.6, 1.6))  # 4.0 / 2.5


def test_a_points_speed_sums_its_steps_time_over_their_price():
    """pricing.speed: the steps' time (with the gap before each) over their price, summed:
    nine steps at their price of 10 ms and one at three times it make x1.2 (their median is
    x1.0); idle steps and steps without a price are left out; the CPU clock reads cpu_ms
    and gap_cpu_ms against priced_cpu_ms."""
    from benchbatch.core.pricing import speed

    rows = _steps("c", 9, 9.8, 10.0) + _steps("c", 1, 29.8, 10.0)
    rows += [{"active": 0, "decode_tokens": 0, "prefill_tokens": 0, "padded": 0,
              "step_ms": 50.0, "gap_ms": 0.0, "priced_ms": 1.0},  # idle
             _steps("c", 1, 40.0, math.nan)[0]]  # fmt: skip
    assert speed(rows) == pytest.approx(120.0 / 100.0, rel=1e-12)
    cpu = [r | {"cpu_ms": r["step_ms"] / 2, "gap_cpu_ms": 0.1, "priced_cpu_ms": 5.0}
           for r in _steps("c", 4, 10.0, 10.0)]  # fmt: skip
    assert speed(cpu, clock="cpu") == pytest.approx(5.1 / 5.0, rel=1e-12)
    assert speed(cpu) == pytest.approx(10.2 / 10.0, rel=1e-12)
    assert math.isnan(speed(_steps("c", 3, 10.0, math.nan))) and math.isnan(speed([]))


def test_the_at_speed_line_counts_values_within_at_each_points_own_speed():
    row = lambda point, ratio, at, speed, within: {  # noqa: E731
        "point": point, "metric": "ttft_p50_s", "ratio": ratio, "ratio_at_speed": at,
        "steps_over_price": speed, "target_low": 0.9, "target_high": 1.1, "within": within,
        "below_saturation": True}
    rows = [row("s @ 4 req/s", 1.30, 1.04, 1.25, False),  # the speed accounts for it
            row("c @ 4 req/s", 0.80, 0.85, 0.94, False),  # stays off: the scheduling's
            row("k @ 4 req/s", 1.05, 1.20, 0.875, True),  # within only by chance
            row("t @ 4 req/s", 0.88, 0.92, 0.96, False),  # comes within at its speed
            row("x @ 4 req/s", 1.00, math.nan, math.nan, True),  # no speed: left out
            {"point": "y", "metric": "ttft_p50_s", "within": None}]  # fmt: skip
    line = pr.at_speed(rows)
    assert line.startswith("the points below saturation ran their steps at x0.88-x1.25 of "
                           "the calibration's price; "
                           "outside x0.9-x1.1 at 2 of 4 points (s @ 4 req/s x1.25, "
                           "k @ 4 req/s x0.88)")  # fmt: skip
    assert "2 of 4 values are within their target, against 1 as predicted" in line
    assert pr.at_speed(rows[4:]) is None
    # a speed just outside the band says the digits that show it outside (x1.104 read x1.10)
    edge = [row("e @ 1 req/s", 1.2, 1.05, 1.1041, False), row("f @ 1 req/s", 1.0, 1.0, 0.8996,
                                                             True)]  # fmt: skip
    line = pr.at_speed(edge)
    assert "(f @ 1 req/s x0.8996, e @ 1 req/s x1.104)" in line
    assert line.startswith("the points below saturation ran their steps at x0.8996-x1.104 ")
    # occupancy's runs (no arrivals, so no saturation): said as runs, one speed as one
    runs = [{k: v for k, v in row("static", 1.15, 1.02, 1.13, False).items()
             if k != "below_saturation"}]  # fmt: skip
    line = pr.at_speed(runs)
    assert line.startswith("the runs ran their steps at x1.13 of the calibration's price; "
                           "outside x0.9-x1.1 at 1 of 1 runs (static x1.13)")  # fmt: skip
    assert "1 of 1 values are within their target, against 0 as predicted" in line
    assert "the device's speed over the run but" in line


class _ServeRec(_PricesRec):
    def rows(self, name):
        assert name == "serve"
        return self._rows


def test_points_run_far_off_their_price_are_a_warning_naming_them():
    """A run whose device slowed at its first points and sped up at its last, while its
    medians per step kind sat near 1 (round1-as-is, results/sim-error-cpu-2core-amd-epyc):
    the points outside x0.8-1.25 are named in one warning, the farthest first; a run
    within, a simulated row, or a point without a speed says nothing."""
    from benchbatch.experiments.serve import real

    row = lambda policy, rate, speed, source="real", **extra: {  # noqa: E731
        "policy": policy, "rate": rate, "source": source, "steps_over_price": speed, **extra}
    moved = _ServeRec([row("static", "3.7", 1.27), row("continuous", "3.7", 1.37),
                       row("chunked", "3.7", 1.202), row("static", "max", 0.79,
                                                         max_concurrency=4),
                       row("continuous", "max", 0.80), row("chunked", "max", 1.25),
                       row("static", "3.7", 3.0, "sim-matched"),
                       row("chunked", "5.1", math.nan)])  # fmt: skip
    real.say_speeds(moved)
    assert len(moved.warnings) == 1 and moved.notes == []
    line = moved.warnings[0]
    assert ("at 3 of 6 points the steps took outside x0.8-x1.25 of their price (continuous @ "
            "3.7 req/s x1.37, static @ 3.7 req/s x1.27, static @ max req/s, 4 in flight "
            "x0.79)") in line  # fmt: skip
    assert "ratio_at_speed" in line and "quieter machine" in line
    fine = _ServeRec([row("static", "3.7", 1.2), row("continuous", "max", 0.85)])
    real.say_speeds(fine)
    assert fine.warnings == [] and fine.notes == []


def test_how_sure_says_the_median_width_of_an_even_count():
    """Two points: the median of their widths is the middle of the two (the upper one was
    said: x1.73 where the two were 1.22 and 1.73)."""
    rows = [{"point": p, "metric": "tpot_p99_s", "simulated": 1.0, "measured": 1.0,
             "within": True, "ratio_low": lo, "ratio_high": hi, "target_low": 0.8,
             "target_high": 1.25}
            for p, lo, hi in (("a", 1.0, 1.22), ("b", 1.0, 1.73))]  # fmt: skip
    assert "TPOT p99 x1.48 wide" in pr.how_sure(rows)
