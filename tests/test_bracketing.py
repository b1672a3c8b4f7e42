"""The engine calibrated on both sides of the points it predicts (issue 27): serve-sweep
calibrates again once its real points are served, fits both calibrations together, and
makes every simulation of the run again on that one fit; how far the device's speed moved
between the two (core/calibration.py's drift) and how each alone priced the steps served
are said and saved."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.core import calibration as cal

# A synthetic engine's terms (seconds): base, per sequence, decode, prefill, context token.
TRUE = (2e-3, 3e-4, 5e-4, 2e-4, 2e-7)


def steps(scale: float, seed: int) -> list[dict]:
    """Step rows of decodes (1-16 sequences, contexts to 600), prefills and mixed steps,
    each costing TRUE's linear model times `scale`, exactly (no noise)."""
    rng = np.random.default_rng(seed)
    rows = [{"sequences": 1, "active": 1, "decode_tokens": 1, "prefill_tokens": 0,
             "context_tokens": 100}]  # fmt: skip
    for i in range(60):
        b, ctx, p = int(rng.integers(1, 17)), int(rng.integers(16, 600)), int(rng.integers(8, 300))
        s, d, pt, c = [(b, b, 0, b * ctx), (1, 0, p, 0), (b + 1, b, p, b * ctx)][i % 3]
        rows.append({"sequences": s, "active": s, "decode_tokens": d, "prefill_tokens": pt,
                     "context_tokens": c})  # fmt: skip
    for r in rows:
        base, seq, dec, pre, ctx = TRUE
        t = base + seq * r["sequences"] + dec * r["decode_tokens"] + pre * r["prefill_tokens"]
        r["step_ms"] = 1e3 * scale * (t + ctx * r["context_tokens"])
    return rows


def test_the_drift_is_each_calibrations_own_price_over_the_pooled_fits():
    """Two noiseless calibrations, the second of an engine 10% slower: each fits its own
    engine exactly, so their prices of a one-sequence decode step stand 1.10 apart, each
    the same step's own cost over the pooled fit's price of it."""
    first, second = steps(1.0, 0), steps(1.1, 1)
    own = [cal.fit(part)["model"] for part in (first, second)]
    pooled = cal.fit(first + second)["model"]
    d = cal.drift([(first, own[0]), (second, own[1])], pooled)
    assert d["each"][1] / d["each"][0] == pytest.approx(1.1, rel=1e-9)
    ref = first[0]  # the first decode step of one sequence
    pooled_price = cal.price_ms(pooled, ref)
    assert d["each"][0] == pytest.approx(ref["step_ms"] / pooled_price, rel=1e-9)
    assert d["each"][1] == pytest.approx(1.1 * ref["step_ms"] / pooled_price, rel=1e-9)
    assert d["decode_step_low"] == min(d["each"]) and d["decode_step_high"] == max(d["each"])
    # A calibration that determined no fit of its own is left out, not guessed.
    assert cal.drift([(first, own[0]), (second, None)], pooled)["each"] == d["each"][:1]


def test_priced_ratio_is_the_median_of_measured_over_priced():
    """Steps of a known engine priced by its own model: 1; by a model of an engine twice as
    fast: 2; idle steps and untimed ones left out."""
    rows = steps(1.0, 2)
    exact = cal.fit(rows)["model"]
    half = cal.fit(steps(0.5, 2))["model"]
    idle = {"sequences": 0, "active": 0, "decode_tokens": 0, "prefill_tokens": 0,
            "context_tokens": 0, "step_ms": 5.0}  # fmt: skip
    assert cal.priced_ratio(exact, [*rows, idle]) == pytest.approx(1.0, rel=1e-9)
    assert cal.priced_ratio(half, rows) == pytest.approx(2.0, rel=1e-9)
    assert np.isnan(cal.priced_ratio(exact, [idle]))


TINY = ["--preset", "tiny", "--requests", "30", "--real-requests", "8", "--median", "4",
        "--max-output", "8", "--prompt-len", "16", "--max-prompt", "64", "--rates", "50,max",
        "--threads", "1"]  # fmt: skip


def test_serve_sweep_calibrates_again_after_its_real_points_and_simulates_on_both(
    runner, tmp_path
):
    """The same calibration workload before the real points and after them (each row says
    which); step_cost.json is both fitted together (a refit of every calibration row gives
    its coefficients), with the drift between them; every simulation of the run is priced
    by that fit: the sweep's rows are those of a simulation of the same requests on the
    saved step costs (--engine sim --step-costs), each real step's price is the saved fit's
    price of it, and sim_vs_real's simulated values are the sim-matched rows'."""
    from benchbatch.runtime.calibrate import fit_rows

    out = tmp_path / "real"
    result = runner.invoke(app, ["serve-sweep", *TINY, "--real-rates", "max", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "then the engine calibrated again (about" in text
    steps_ = pd.read_csv(out / "calibration_steps.csv")
    before, after = (steps_[steps_["when"] == w] for w in ("before", "after"))
    assert len(before) == len(after) > 0 and len(before) + len(after) == len(steps_)
    key = ["calibration", "step", "sequences", "decode_tokens", "prefill_tokens"]
    assert before[key].to_numpy().tolist() == after[key].to_numpy().tolist()  # one workload

    saved = json.loads((out / "step_cost.json").read_text())
    assert saved["calibrations"] == 2 and saved["samples"] == len(steps_)
    refit = cal.fit(fit_rows(steps_.to_dict("records")))["summary"]["coefficients_s"]
    for term, value in saved["coefficients_s"].items():
        assert value == pytest.approx(refit[term], rel=1e-9, abs=1e-15), term
    assert len(saved["drift"]["each"]) == 2 and saved["drift"]["rule"] == cal.DRIFT_RULE
    assert saved["conditions_after"]["threads"] == saved["conditions"]["threads"] == 1
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["step_cost"]["calibrations"] == 2
    each = meta["real"]["calibrations_priced"]["each"]
    assert len(each) == 2 and all(r > 0 for r in each)
    assert f"the one after at x{each[1]:.2f}" in text

    model = cal.read(out / "step_cost.json")["model"]
    real_steps = pd.read_csv(out / "real_steps.csv").to_dict("records")
    assert real_steps and all(
        r["priced_ms"] == pytest.approx(cal.price_ms(model, r), rel=1e-9) for r in real_steps
    )
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    matched = serve[serve["source"] == "sim-matched"].set_index("policy")
    versus = pd.read_csv(out / "sim_vs_real.csv", dtype={"rate": str})
    for v in versus.itertuples():
        assert v.simulated == pytest.approx(matched.loc[v.policy, v.metric], rel=1e-12)

    again = tmp_path / "sim"
    args = ["serve-sweep", *TINY, "--engine", "sim", "--step-costs", str(out / "step_cost.json"),
            "--out", str(again)]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    sim = pd.read_csv(again / "serve.csv", dtype={"rate": str})
    columns = ["policy", "rate", "ttft_p50_s", "tpot_p50_s", "e2e_p99_s", "duration_s"]
    mine = serve[serve["source"] == "sim"][columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, sim[sim["source"] == "sim"][columns].reset_index(drop=True))


def test_a_run_given_its_step_costs_calibrates_nothing(runner, tmp_path):
    """--step-costs beside the real engine: its calibration is used as given, none made
    before the points or after them."""
    first = tmp_path / "first"
    args = ["serve-sweep", *TINY, "--real-rates", "max", "--policies", "continuous"]
    assert runner.invoke(app, [*args, "--out", str(first)]).exit_code == 0
    given = tmp_path / "given"
    result = runner.invoke(
        app, [*args, "--step-costs", str(first / "step_cost.json"), "--out", str(given)]
    )
    assert result.exit_code == 0, result.output
    assert not (given / "calibration_steps.csv").exists()
    assert "calibrated again" not in result.output
    meta = json.loads((given / "metadata.json").read_text())
    assert "calibrations_priced" not in meta["real"]
