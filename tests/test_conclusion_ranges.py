"""The ratios phases and sweep conclude with carry their steps' noise: each ratio's range
with every step anywhere in its p10-p90, checked against the ratio itself recomputed from
the rows' own quantities (throughput, TFLOP/s, us per token) at every corner."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.app.cli import app
from benchbatch.core.noise import range_text, summary_range, time_ratio_range
from benchbatch.experiments.phases import probe as phases
from benchbatch.experiments.sweep import probe as sweep

FAST = ["--preset", "tiny", "--repeats", "3", "--min-time", "0", "--device", "cpu", "--no-roofline"]

spread = st.tuples(
    st.floats(0.5, 500), st.floats(0.3, 1.0), st.floats(1.0, 3.0)
)  # median ms, p10 and p90 as fractions of it


def decode_row(batch: int, context: int, ms: float, lo: float, hi: float, flops: float = 1e9):
    """A timed decode row whose quantities follow from its step time, as probe rows do."""
    return {
        "phase": "decode", "label": f"decode b={batch}", "context": context, "batch": batch,
        "status": "ok", "step_ms": ms, "step_ms_p10": ms * lo, "step_ms_p90": ms * hi,
        "tokens_per_s": batch / ms * 1e3, "us_per_token": ms * 1e3 / batch,
        "tflops": flops / ms / 1e9, "flops": flops,
    }  # fmt: skip


def at(row: dict, ms: float) -> dict:
    """The row as if its step had taken `ms`: every quantity recomputed from the time."""
    return {
        **row, "step_ms": ms, "tokens_per_s": row["batch"] / ms * 1e3,
        "us_per_token": ms * 1e3 / row["batch"], "tflops": row["flops"] / ms / 1e9,
    }  # fmt: skip


def corners(a: dict, b: dict, ratio) -> tuple[float, float]:
    """The ratio's least and greatest value over both rows at their p10 and p90."""
    values = [
        ratio(at(a, ta), at(b, tb))
        for ta, tb in itertools.product(
            (a["step_ms_p10"], a["step_ms_p90"]), (b["step_ms_p10"], b["step_ms_p90"])
        )
    ]
    return min(values), max(values)


@settings(max_examples=200, deadline=None)
@given(spread, spread, st.sampled_from([2, 8, 32, 128]))
def test_sweep_ranges_are_the_extremes_of_the_rows_corners(one, big, batch):
    first, last = decode_row(1, 512, *one), decode_row(batch, 512, *big)
    c = sweep.claim([last, first])
    want = corners(first, last, lambda a, b: b["tokens_per_s"] / a["tokens_per_s"])
    assert (c["throughput_ratio_low"], c["throughput_ratio_high"]) == pytest.approx(want)
    want = corners(first, last, lambda a, b: b["step_ms"] / a["step_ms"])
    assert (c["step_latency_ratio_low"], c["step_latency_ratio_high"]) == pytest.approx(want)
    assert c["throughput_ratio_low"] <= c["throughput_ratio"] <= c["throughput_ratio_high"]


@settings(max_examples=200, deadline=None)
@given(spread, spread, spread)
def test_phases_ranges_are_the_extremes_of_the_rows_corners(pre, one, big):
    prefill = {**decode_row(1, 0, *pre, flops=5e11), "phase": "prefill", "label": "prefill 512"}
    rows = [prefill, decode_row(1, 512, *one), decode_row(32, 512, *big, flops=3e10)]
    s = phases.summary(rows)
    want = corners(prefill, rows[1], lambda p, d: p["tflops"] / d["tflops"])
    got = (s["prefill_over_decode_tflops_low"], s["prefill_over_decode_tflops_high"])
    assert got == pytest.approx(want)
    want = corners(rows[1], rows[2], lambda a, b: a["us_per_token"] / b["us_per_token"])
    got = (s["decode_token_cost_ratio_low"], s["decode_token_cost_ratio_high"])
    assert got == pytest.approx(want)


def test_no_spread_no_range():
    row = {"step_ms": 2.0}
    assert all(math.isnan(v) for v in time_ratio_range(3.0, row, row))
    assert range_text(math.nan, 4.0) == "" and summary_range({"r": 2.0}, "r") == ""
    assert range_text(4.123, 9.2) == " (x4.12-x9.2 across the steps' p10-p90)"
    assert range_text(2.0, 12345.0).endswith("x12,345 across the steps' p10-p90)")


def test_phases_and_sweep_state_their_ratios_with_the_range(runner, tmp_path):
    for cmd, extra, keys in (
        ("phases", ["--prefill", "16", "--decode-batch", "1,4", "--context", "8"],
         ("prefill_over_decode_tflops", "decode_token_cost_ratio")),
        ("sweep", ["--batch", "1,4", "--context", "8"],
         ("throughput_ratio", "step_latency_ratio")),
    ):  # fmt: skip
        out = tmp_path / cmd
        result = runner.invoke(app, [cmd, *FAST, *extra, "--out", str(out)])
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "metadata.json").read_text())["summary"]
        summary = summary[0] if isinstance(summary, list) else summary
        for key in keys:
            low, high = summary[f"{key}_low"], summary[f"{key}_high"]
            assert low <= summary[key] <= high
            assert summary_range(summary, key) in " ".join(result.stdout.split())
        assert result.stdout.count("across the steps' p10-p90") == 2


def test_reproduce_claims_quote_the_ranges_of_their_ratios():
    from benchbatch.output.report.claims import claims

    pre = {**decode_row(1, 0, 200.0, 0.9, 1.1, flops=5e11), "phase": "prefill"}
    pre["label"] = "prefill 512"
    rows = [pre, decode_row(1, 512, 10.0, 0.8, 1.3), decode_row(32, 512, 60.0, 0.9, 1.2)]
    s = phases.summary(rows)
    a = sweep.claim([rows[1], rows[2]])
    b, cheaper, latency = (c.measured for c in claims(s, a, None)[:3])
    lo, hi = s["prefill_over_decode_tflops_low"], s["prefill_over_decode_tflops_high"]
    assert b.endswith(f"; x{lo:.3g}-x{hi:.3g} across the steps' p10-p90)")
    lo, hi = s["decode_token_cost_ratio_low"], s["decode_token_cost_ratio_high"]
    assert f"(batch 1 to 32; x{lo:.3g}-x{hi:.3g} across" in cheaper
    t = f"x{a['throughput_ratio_low']:.3g}-x{a['throughput_ratio_high']:.3g}"
    lat = f"x{a['step_latency_ratio_low']:.3g}-x{a['step_latency_ratio_high']:.3g}"
    assert latency.endswith(f"(batch 1 to 32; {t} and {lat} across the steps' p10-p90)")
    # Results from before the ranges: the claims as they were.
    old = {k: v for k, v in s.items() if not k.endswith(("_low", "_high"))}
    want = f"{s['decode_token_cost_ratio']:.3g}x cheaper (batch 1 to 32)"
    assert claims(old, None, None)[1].measured == want


def test_the_report_section_quotes_the_sweep_ranges():
    from benchbatch.output.report.sections import _section_a

    rows = [decode_row(1, 512, 10.0, 0.8, 1.3), decode_row(32, 512, 60.0, 0.9, 1.2)]
    for r in rows:
        r["mbu"] = 0.5
    a = sweep.claim(rows)
    (note,) = [n for n in _section_a(rows, a, None).notes if n.startswith("From batch")]
    t = f"x{a['throughput_ratio_low']:.3g}-x{a['throughput_ratio_high']:.3g}"
    lat = f"x{a['step_latency_ratio_low']:.3g}-x{a['step_latency_ratio_high']:.3g}"
    assert f"({t} across the steps' p10-p90), step time" in note
    assert f"({lat} across the steps' p10-p90) (article" in note
