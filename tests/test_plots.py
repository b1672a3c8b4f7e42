"""Figures that say how sure they are: labels that never overlap, unmeasured steps on the
axis with their status, counts as integers, titles from the rows' own labels."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from benchbatch.core.roofline import Ceilings
from benchbatch.output.plots import compare as compare_plots
from benchbatch.output.plots import phases as phases_plots
from benchbatch.output.plots import roofline as roofline_plots
from benchbatch.output.plots import spread

CEIL = Ceilings("fp32", 0.18, 43.0, "matmul 1024", "read 256 MiB")


def test_labels_are_spread_at_least_a_gap_apart():
    wanted = [0.1, 0.1, 0.11, 0.5, 0.95, 0.96, 0.97]
    out = roofline_plots.spread_out(wanted, gap=0.05)
    assert all(b - a >= 0.05 - 1e-12 for a, b in zip(out, out[1:], strict=False))
    assert 0 <= out[0] and out[-1] <= 1.0
    assert out[3] == 0.5  # a label with room stays level with its point
    crowded = roofline_plots.spread_out([0.5] * 30, gap=0.05)
    assert crowded[0] == pytest.approx(0, abs=1e-12) and crowded[-1] == pytest.approx(0.05 * 29)


def row(label, x, tflops, status="ok", phase="decode", noisy=False, source="sweep"):
    ms = 10.0
    return {"label": label, "arithmetic_intensity": x, "tflops": tflops, "status": status,
            "phase": phase, "source": source, "step_ms": ms, "step_ms_p10": 9.0,
            "step_ms_p90": 13.0, "noisy": noisy}  # fmt: skip


@pytest.fixture
def captured(monkeypatch):
    """The figure a plot function saves, kept open to be inspected."""
    figures = []
    monkeypatch.setattr(roofline_plots, "save", lambda fig, path: figures.append(fig))
    monkeypatch.setattr(phases_plots, "save", lambda fig, path: figures.append(fig))
    return figures


def test_roofline_labels_overlap_neither_each_other_nor_the_legend(captured, tmp_path):
    # A batch sweep bunched near the ridge, as on a CPU, plus a step that was skipped.
    rows = [row(f"b={b}", 4 + 0.1 * i, 0.03 + 0.001 * i) for i, b in enumerate((1, 8, 32, 64))]
    rows += [row("prefill 512", 48, 0.12, phase="prefill", source="phases", noisy=True)]
    rows += [row("b=256", 7.0, math.nan, status="skipped")]
    roofline_plots.roofline_figure(rows, CEIL, tmp_path / "r.png", title="t")
    (fig,) = captured
    fig.canvas.draw()
    ax = fig.axes[0]
    texts = [t for t in ax.texts if t.get_text()]
    assert sorted(t.get_text() for t in texts) == sorted(
        ["b=1", "b=8", "b=32", "b=64", "prefill 512", "b=256: skipped"]
    )
    # The labels' own boxes (an annotation's extent would include its leader line).
    boxes = [Text.get_window_extent(t) for t in texts]
    legend = ax.get_legend().get_window_extent()
    for i, a in enumerate(boxes):
        assert not a.overlaps(legend)
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b)
    assert ax.get_ylabel() == "achieved GFLOP/s"  # a CPU's rates
    legend_texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert spread.NOISY_LABEL in legend_texts and spread.BARS_LABEL in legend_texts
    assert "not measured (status beside it)" in legend_texts


def test_an_unmeasured_step_has_no_made_up_height():
    p = roofline_plots._point(row("b=256", 7.0, 0.5, status="oom"))
    assert p["y"] is None and p["label"] == "b=256: oom" and p["bounds"] is None


def test_error_bars_span_the_repeats_percentiles():
    r = row("x", 1.0, 2.0)  # median 10 ms, p10 9 ms, p90 13 ms
    assert spread.time_bounds(r) == (9.0, 13.0)
    low, high = spread.rate_bounds(r, 2.0)  # a rate goes as 1 / time
    assert low == pytest.approx(2.0 * 10 / 13) and high == pytest.approx(2.0 * 10 / 9)
    assert spread.time_scaled_bounds(r, 50.0) == pytest.approx((45.0, 65.0))
    assert spread.yerr([2.0, math.nan], [(1.5, 3.0), (1.0, 2.0)]) == [[0.5, 0.0], [1.0, 0.0]]
    assert spread.rate_bounds({"step_ms": 1.0}, 5.0) is None


def test_titles_say_how_noisy_and_what_the_rows_say():
    rows = [row("a", 1, 1, noisy=True), row("b", 1, 1), row("c", 1, 1, status="skipped")]
    assert spread.noise_note(rows) == "noisy: 1 of 2 steps (ringed)"
    assert spread.noise_note(rows[1:2]) == "no noisy step"
    bounds = [{"phase": "prefill", "bound": "compute"}, {"phase": "decode", "bound": "memory"},
              {"phase": "decode", "bound": "compute"}]  # fmt: skip
    assert phases_plots.bound_title(bounds) == (
        "roofline: prefill compute-bound, decode compute and memory-bound"
    )
    assert phases_plots.bound_title([{"phase": "decode"}]).startswith("achieved FLOP/s")


def test_phases_figure_marks_a_failed_step_on_the_axis(captured, tmp_path):
    rows = [row("prefill 512", 48, 0.12, phase="prefill") | {"us_per_token": 240.0},
            row("decode b=32", 5, math.nan, status="oom") | {"us_per_token": math.nan}]  # fmt: skip
    phases_plots.phases_figure(rows, tmp_path / "p.png", "t")
    (fig,) = captured
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "oom" in texts and "120" in texts  # the value at the bar's foot, in GFLOP/s


def test_compare_bars_say_not_run_and_print_counts_as_integers():
    assert compare_plots._value_label(9602.0) == "9,602"
    assert compare_plots._value_label(0.123) == "0.123"
    assert compare_plots._value_label(np.nan) == ""
    rows = pd.DataFrame([{"policy": "static", "status": "oom"}]).set_index("policy")
    assert compare_plots._why(rows, "static") == "oom"
    assert compare_plots._why(rows, "continuous") == "not run"
