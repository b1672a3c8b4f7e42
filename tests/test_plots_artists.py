"""The figures read back through their artists: every label present, inside its axes and
clear of every other (text boxes from the renderer), one y-range per panel that holds its
data, the request rate on serve.png's x-axis with `max` at the edge, SLO lines drawn and
labelled, no series drawn exactly over another, value labels above their error bars' caps,
"not run" inside its panel, and project.png drawn from project.csv."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D
from matplotlib.text import Text
from test_serve import write_step_costs

from benchbatch.app.cli import app
from benchbatch.output.plots import compare as compare_plots
from benchbatch.output.plots import memory as memory_plots
from benchbatch.output.plots import phases as phases_plots
from benchbatch.output.plots import project as project_plots
from benchbatch.output.plots import serve as serve_plots
from benchbatch.output.plots import spread

SLO_TTFT, SLO_TPOT = 2.0, 0.2


@pytest.fixture
def captured(monkeypatch):
    """The figures the plot modules save, kept open to be read."""
    figures = {}
    for module in (serve_plots, memory_plots, phases_plots, compare_plots, project_plots):
        name = module.__name__.rsplit(".", 1)[1]
        monkeypatch.setattr(module, "save", lambda fig, path, n=name: figures.setdefault(
            path.name, fig))  # fmt: skip
    return figures


def boxes(fig, texts):
    """Each text's own box (an annotation's extent would take in its arrow), or an
    artist's (a legend)."""
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), Text.get_window_extent(t, renderer)) if isinstance(t, Text)
            else (type(t).__name__, t.get_window_extent(renderer)) for t in texts]  # fmt: skip


def visible_texts(ax):
    """The axes' own texts, its labels, title and the tick labels in view."""
    texts = [t for t in ax.texts if t.get_text() and t.get_visible()]
    titles = (ax.title, ax._left_title, ax._right_title)
    texts += [t for t in (ax.xaxis.label, ax.yaxis.label, *titles) if t.get_text()]
    for axis, (low, high) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        lo, hi = min(low, high), max(low, high)
        for tick in axis.get_major_ticks():
            if tick.label1.get_visible() and tick.label1.get_text() and lo <= tick.get_loc() <= hi:
                texts.append(tick.label1)
    return texts


def assert_no_overlap(fig, texts):
    found = boxes(fig, texts)
    for (a, box_a), (b, box_b) in itertools.combinations(found, 2):
        assert not box_a.overlaps(box_b), f"{a!r} overlaps {b!r}"


def assert_inside(fig, ax, texts):
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    for text, box in boxes(fig, texts):
        assert frame.x0 - 0.5 <= box.x0 and box.x1 <= frame.x1 + 0.5, text
        assert frame.y0 - 0.5 <= box.y0 and box.y1 <= frame.y1 + 0.5, text


def assert_holds_its_data(ax):
    """The panel's y-range holds every finite value its lines draw."""
    low, high = ax.get_ylim()
    for line in ax.get_lines():
        if line.get_transform() != ax.transData:  # a line in axes units (axvline)
            continue
        y = np.asarray(line.get_ydata(), dtype=float)
        y = y[np.isfinite(y)]
        if y.size:
            assert low <= y.min() and y.max() <= high, (ax.get_ylabel(), y.min(), y.max())


# --- serve.png and pareto.png, from a simulated serve-sweep ------------------------------------


@pytest.fixture(scope="module")
def serve_rows(tmp_path_factory):
    from typer.testing import CliRunner

    folder = tmp_path_factory.mktemp("serve")
    out = folder / "run"
    args = ["serve-sweep", "--engine", "sim", "--step-costs", str(write_step_costs(folder)),
            "--requests", "150", "--rates", "1,3,6,max", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return pd.read_csv(out / "serve.csv", dtype={"rate": str}).to_dict("records")


def test_serve_figure_has_the_request_rate_on_x_and_max_at_the_edge(serve_rows, captured,
                                                                     tmp_path):  # fmt: skip
    serve_plots.serve_figure(serve_rows, tmp_path / "serve.png", "t", SLO_TTFT, SLO_TPOT)
    fig = captured["serve.png"]
    fig.canvas.draw()
    axis = serve_plots.RateAxis([r["rate_rps"] for r in serve_rows])
    assert axis.edge > 6 and axis.has_max
    for ax in fig.axes:
        assert ax.get_xlabel().startswith("request rate (req/s")
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels[-1] == "max" and ax.get_xticks()[-1] == pytest.approx(axis.edge)
        assert ax.get_xlim()[1] > axis.edge  # the max points are in view
        for line in ax.get_lines():
            if line.get_label().startswith(tuple(serve_plots.COLORS)):
                policy = line.get_label().split()[0]
                nudge = serve_plots.NUDGE[policy] * axis.step
                xs = np.asarray(line.get_xdata()) - nudge
                assert list(np.round(xs, 9)) == [1.0, 3.0, 6.0, round(axis.edge, 9)]
        assert_holds_its_data(ax)
        assert_inside(fig, ax, [t for t in ax.texts if t.get_text()])
        assert_no_overlap(fig, visible_texts(ax))


def test_serve_figure_shows_every_series_and_labels_the_slo(serve_rows, captured, tmp_path):
    serve_plots.serve_figure(serve_rows, tmp_path / "serve.png", "t", SLO_TTFT, SLO_TPOT)
    fig = captured["serve.png"]
    fig.canvas.draw()
    ttft, tpot = fig.axes[1], fig.axes[4]
    for ax, value, text in ((ttft, SLO_TTFT, "SLO: p99 TTFT 2 s"),
                            (tpot, SLO_TPOT * 1e3, "SLO: p99 TPOT 200 ms")):  # fmt: skip
        slo = [ln for ln in ax.get_lines() if ln.get_label() == "SLO limit"]
        assert len(slo) == 1 and list(slo[0].get_ydata()) == [value, value]
        assert text in [t.get_text() for t in ax.texts]
        low, high = ax.get_ylim()
        assert low < value < high
    # One marker per policy, and no two policies' lines drawn on the same points.
    series = [ln for ln in fig.axes[0].get_lines() if "(" in ln.get_label()]
    assert {ln.get_marker() for ln in series} == {"s", "o", "^"}
    for a, b in itertools.combinations(series, 2):
        assert not np.array_equal(a.get_xdata(), b.get_xdata())
    legend = fig.legends[0]
    texts = [t.get_text() for t in legend.get_texts()]
    for policy in ("static", "continuous", "chunked"):
        assert f"{policy} (simulated)" in texts
    assert "SLO limit" in texts and min(t.get_fontsize() for t in legend.get_texts()) >= 10


def test_pareto_points_say_their_rate_and_the_labels_never_collide(serve_rows, captured,
                                                                    tmp_path):  # fmt: skip
    serve_plots.pareto_figure(serve_rows, tmp_path / "pareto.png", "t")
    fig = captured["pareto.png"]
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text()]
    df = pd.DataFrame(serve_rows)
    x, y = "tokens_per_s_per_user", "output_throughput_tps"
    front = serve_plots.pareto_front(df, x, y)
    where = {(round(t.xy[0], 9), round(t.xy[1], 9)): t.get_text() for t in labels}
    for _, p in front.iterrows():  # every point of the front carries its rate
        assert where[(round(p[x], 9), round(p[y], 9))] == serve_plots.rate_text(p["rate_rps"])
    assert {t.get_text() for t in labels} == {"1", "3", "6", "max"}
    assert_no_overlap(fig, labels + [ax.get_legend()])
    assert_inside(fig, ax, labels)
    # chunked is drawn large and hollow under continuous: neither hides the other
    kinds = {c.get_label(): c for c in ax.collections}
    chunked, continuous = kinds["chunked (simulated)"], kinds["continuous (simulated)"]
    assert chunked.get_zorder() < continuous.get_zorder()
    assert chunked.get_sizes()[0] > continuous.get_sizes()[0]
    assert len(chunked.get_facecolors()) == 0 or chunked.get_facecolors()[0][3] == 0


def test_rate_axis_places_max_one_step_past_the_largest_rate():
    axis = serve_plots.RateAxis([2.0, 4.0, 6.0, math.inf])
    assert axis.step == 2.0 and axis.x(math.inf) == 9.0 and axis.x(4.0) == 4.0
    assert not serve_plots.RateAxis([1.0, 3.0]).has_max
    assert serve_plots.rate_text(math.inf) == "max" and serve_plots.rate_text(0.25) == "0.25"


# --- memory.png, from an occupancy run over the memory policies --------------------------------


def test_memory_running_panels_each_fit_their_own_peak(runner, captured, tmp_path):
    out = tmp_path / "occ"
    args = ["occupancy", "--requests", "30", "--kv-memory", "0.2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    fig = captured["memory.png"]
    fig.canvas.draw()
    rows = pd.read_csv(out / "memory.csv").set_index("policy")
    running = [ax for ax in fig.axes if ax.get_ylabel() == "sequences"]
    assert len(running) == len(rows)
    tops = {}
    order = [p for p in memory_plots.COLORS if p in rows.index]  # the figure's rows
    for ax, policy in zip(running, order, strict=True):
        assert f"peak {rows.loc[policy, 'peak_running']:,}," in ax.get_title(loc="left")
        top = ax.get_ylim()[1]
        assert top == pytest.approx(1.1 * max(rows.loc[policy, "peak_running"], 1))
        data = max(np.nanmax(c.get_paths()[0].vertices[:, 1]) for c in ax.collections)
        assert data <= top and data >= 0.9 * rows.loc[policy, "peak_running"]
        tops[policy] = top
        assert_no_overlap(fig, visible_texts(ax))
    peaks = rows["peak_running"]
    assert peaks.nunique() > 1 and len(set(tops.values())) == peaks.nunique()


# --- phases.png ------------------------------------------------------------------------------


def phase_row(label, phase, tflops, us, status="ok"):
    return {"label": label, "phase": phase, "tflops": tflops, "us_per_token": us,
            "status": status, "step_ms": 10.0, "step_ms_p10": 9.0, "step_ms_p90": 12.0,
            "bound": "compute" if phase == "prefill" else "memory", "noisy": False}  # fmt: skip


def test_phases_figure_writes_plain_numbers_with_units_and_is_no_roofline(captured, tmp_path):
    rows = [phase_row("prefill 512", "prefill", 0.123, 239.0),
            phase_row("prefill 2048", "prefill", 0.138, 259.0),
            phase_row("decode b=1", "decode", 0.00696, 9230.0),
            phase_row("decode b=32", "decode", 0.0474, 1360.0)]  # fmt: skip
    phases_plots.phases_figure(rows, tmp_path / "phases.png", "t")
    fig = captured["phases.png"]
    fig.canvas.draw()
    flops, cost = fig.axes[0], fig.axes[1]
    assert not flops.get_title().lower().startswith("roofline")
    assert flops.get_title().startswith("achieved GFLOP/s of each step")
    for ax in (flops, cost):
        ticks = [t.get_text() for t in visible_texts(ax) if t in ax.get_yticklabels()]
        assert len(ticks) >= 2
        for text in ticks + [t.get_text() for t in ax.texts]:
            assert "e+" not in text and "e-" not in text and "$" not in text and "^" not in text
        assert_no_overlap(fig, visible_texts(ax))
        assert_holds_its_data(ax)
    assert [t.get_text() for t in flops.texts] == ["123", "138", "6.96", "47.4"]
    assert [t.get_text() for t in cost.texts] == ["239 µs", "259 µs", "9.23 ms", "1.36 ms"]
    assert spread.plain(9230.0) == "9,230" and spread.seconds_text(2.39e-4) == "239 µs"


# --- the compare figures ---------------------------------------------------------------------


def compare_rows():
    rows = []
    for run, scale in (("fp32", 1.0), ("bf16", 0.8)):
        for label, phase, tflops, us in (("prefill 8", "prefill", 1.07e-3, 143.0),
                                         ("prefill 16", "prefill", 1.97e-3, 78.1),
                                         ("decode b=1", "decode", 1.58e-4, 1167.0)):  # fmt: skip
            rows.append({"run": run, "label": label, "phase": phase, "tflops": tflops * scale,
                         "us_per_token": us / scale, "step_ms": 10.0, "step_ms_p10": 9.6,
                         "step_ms_p90": 10.5, "status": "ok"})  # fmt: skip
    return pd.DataFrame(rows)


def caps_of(ax):
    """Each error bar's cap as its own box on the canvas (one Line2D draws all the caps of
    an errorbar call: its extent would span them all)."""
    from matplotlib.transforms import Bbox

    found = []
    for line in ax.get_lines():
        if not isinstance(line, Line2D) or line.get_marker() != "_":
            continue
        half = line.get_markersize() * ax.figure.dpi / 72 / 2
        width = line.get_markeredgewidth() * ax.figure.dpi / 72
        data = np.column_stack([np.asarray(d, dtype=float) for d in line.get_data()])
        points = line.get_transform().transform(data)
        for px, py in points:
            if np.isfinite(px) and np.isfinite(py):
                found.append(Bbox([[px - half, py - width], [px + half, py + width]]))
    return found


def test_compare_bar_labels_sit_above_their_error_bars_caps(captured, tmp_path):
    compare_plots.compare_phases_figure(compare_rows(), ["fp32", "bf16"],
                                        tmp_path / "compare-phases.png", "t")  # fmt: skip
    fig = captured["compare-phases.png"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        values = [t for t in ax.texts if t.get_text()]
        assert len(values) == 6
        caps = caps_of(ax)
        assert caps
        for text in values:
            box = Text.get_window_extent(text, renderer)
            for cap in caps:
                assert not box.overlaps(cap), text.get_text()
        assert_inside(fig, ax, values)
        assert_no_overlap(fig, visible_texts(ax))
        for tick in ax.get_yticklabels():
            assert "^" not in tick.get_text()
    assert {t.get_text() for t in fig.axes[1].texts} >= {"1,167", "1,459"}


def test_compare_probe_labels_clear_of_caps(captured, tmp_path):
    rows = []
    for run, n in (("a", 1.0), ("b", 0.5)):
        rows += [{"run": run, "kind": "matmul", "label": "matmul 64", "tflops": 3.3e-5 * n,
                  "gbps": np.nan, "step_ms": 1.0, "step_ms_p10": 0.97, "step_ms_p90": 1.04,
                  "status": "ok"},
                 {"run": run, "kind": "copy", "label": f"copy {int(4 / n)} MiB", "tflops": np.nan,
                  "gbps": 1.05, "step_ms": 1.0, "step_ms_p10": 0.97, "step_ms_p90": 1.04,
                  "status": "ok"}]  # fmt: skip
    compare_plots.compare_probe_figure(pd.DataFrame(rows), ["a", "b"],
                                       tmp_path / "compare-probe.png", "t")  # fmt: skip
    fig = captured["compare-probe.png"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        values = [t for t in ax.texts if t.get_text() and t.get_text() != "not run"]
        for text in values:
            box = Text.get_window_extent(text, renderer)
            assert not any(box.overlaps(c) for c in caps_of(ax))
        assert_inside(fig, ax, [t for t in ax.texts if t.get_text()])
        assert_no_overlap(fig, visible_texts(ax))
    assert [t.get_text() for t in fig.axes[1].texts].count("not run") == 2


def test_compare_occupancy_says_not_run_inside_its_panel(captured, tmp_path):
    occupancy = pd.DataFrame([
        {"run": "a", "policy": "static", "occupancy": 0.315, "total_steps": 239, "status": "ok"},
        {"run": "a", "policy": "continuous", "occupancy": 0.6, "total_steps": 120, "status": "ok"},
        {"run": "b", "policy": "static", "occupancy": 0.315, "total_steps": 239, "status": "ok"},
    ])  # fmt: skip
    engine = pd.DataFrame([{"run": "a", "policy": "static", "wall_s": 12.5, "status": "ok"}])
    compare_plots.compare_occupancy_figure(occupancy, engine, ["a", "b"],
                                           tmp_path / "compare-occupancy.png", "t")  # fmt: skip
    fig = captured["compare-occupancy.png"]
    fig.canvas.draw()
    said = 0
    for ax in fig.axes:
        texts = [t for t in ax.texts if t.get_text()]
        said += sum(t.get_text() == "not run" for t in texts)
        assert_inside(fig, ax, texts)
        assert_no_overlap(fig, visible_texts(ax))
    assert said == 2 + 1  # b's continuous in both simulated panels, b's engine
    legend = fig.legends[0]
    for ax in fig.axes:  # the runs' legend is below the panels, over no label
        assert not legend.get_window_extent().overlaps(ax.get_window_extent())


def test_compare_serve_one_panel_per_metric_and_policy_with_the_slo(serve_rows, captured,
                                                                     tmp_path):  # fmt: skip
    one = pd.DataFrame(serve_rows)
    df = pd.concat([one.assign(run="a"), one.assign(run="b", ttft_p99_s=one["ttft_p99_s"] * 2)])
    slos = {"a": (SLO_TTFT, SLO_TPOT), "b": (SLO_TTFT, SLO_TPOT)}
    compare_plots.compare_serve_figure(df, ["a", "b"], tmp_path / "compare-serve.png", "t", slos)
    fig = captured["compare-serve.png"]
    fig.canvas.draw()
    assert len(fig.axes) == 2 * 3
    for ax in fig.axes:
        assert ax.get_xlabel().startswith("request rate")
        runs = {ln.get_label() for ln in ax.get_lines() if ln.get_label().endswith(")")}
        assert runs == {"a (simulated)", "b (simulated)"}  # one line per run: no spaghetti
        slo = [ln for ln in ax.get_lines() if ln.get_label().startswith("SLO")]
        value = SLO_TTFT if "TTFT" in ax.get_ylabel() else SLO_TPOT * 1e3
        assert len(slo) == 1 and list(slo[0].get_ydata()) == [value, value]
        low, high = ax.get_ylim()
        assert low < value < high
        assert_holds_its_data(ax)
        assert_no_overlap(fig, visible_texts(ax))
    assert [a.get_title() for a in fig.axes[:3]] == ["static", "continuous", "chunked"]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "a (simulated)" in texts and "SLO p99 TTFT 2 s" in texts


# --- project.png -------------------------------------------------------------------------------


def test_project_draws_its_projection_and_lists_the_plot(runner, captured, tmp_path):
    out = tmp_path / "proj"
    result = runner.invoke(app, ["project", "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    # the figure is captured here (not written): the real save lists it, tested below
    fig = captured["project.png"]
    fig.canvas.draw()
    rows = pd.read_csv(out / "project.csv")
    time_ax, speed_ax = fig.axes
    cases = list(dict.fromkeys(zip(rows["batch"], rows["context"], strict=True)))
    tps = sorted(rows["tp"].unique())
    # each bar stack's total is the projected step time of its (tp, batch, context)
    totals = {}
    for patch in time_ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2, 6)
        totals[x] = totals.get(x, 0.0) + patch.get_height()
    width = 0.8 / len(cases)
    for i, (batch, context) in enumerate(cases):
        for j, tp in enumerate(tps):
            x = round(j + (i - (len(cases) - 1) / 2) * width, 6)
            mine = rows[
                (rows["tp"] == tp) & (rows["batch"] == batch) & (rows["context"] == context)
            ]
            assert totals[x] == pytest.approx(float(mine["step_ms"].iloc[0]), rel=1e-9)
    labels = [t.get_text() for t in time_ax.texts]
    assert labels.count(project_plots.NOT_FIT) == int((~rows["fits"]).sum())
    for line in speed_ax.get_lines():
        if line.get_label().startswith("batch"):
            batch = int(line.get_label().split()[1].rstrip(","))
            mine = rows[(rows["batch"] == batch) & rows["fits"]]
            assert list(line.get_ydata()) == pytest.approx(list(mine["speedup"]))
    for ax in (time_ax, speed_ax):
        assert_no_overlap(fig, visible_texts(ax))
        assert_inside(fig, ax, [t for t in ax.texts if t.get_text()])
    assert "project.csv" in meta["written_files"]


def test_project_png_is_written_and_listed(runner, tmp_path):
    out = tmp_path / "proj"
    assert runner.invoke(app, ["project", "--out", str(out)]).exit_code == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert "project.png" in meta["written_files"] and (out / "project.png").stat().st_size > 0


def test_a_pareto_front_of_one_point_is_drawn(serve_rows, captured, tmp_path):
    """One point dominating the rest is the whole front: its legend entry had nothing drawn
    (a line of one point); it is a ring around that point."""
    rows = [dict(r) for r in serve_rows]
    x, y = "tokens_per_s_per_user", "output_throughput_tps"
    top = max(rows, key=lambda r: r[x])
    top[y] = max(r[y] for r in rows) * 2  # the best on both axes
    serve_plots.pareto_figure(rows, tmp_path / "pareto.png", "t")
    ax = captured["pareto.png"].axes[0]
    (front,) = [line for line in ax.lines if line.get_label().startswith("Pareto front")]
    assert list(front.get_xdata()) == [top[x]] and front.get_marker() == "o"


def test_prediction_axes_without_a_power_of_ten_are_labelled(captured, tmp_path):
    """A panel spanning 0.18-0.84 s held no power of ten and so no tick label at all: its
    minor ticks are labelled there; a panel with a decade keeps them blank."""
    from benchbatch.output.plots import prediction as plots

    def rows(metric, pairs):
        return [{"point": f"p{i}", "metric": metric, "simulated": s, "measured": m,
                 "within": True, "target_low": 0.9, "target_high": 1.1}
                for i, (s, m) in enumerate(pairs)]  # fmt: skip

    narrow = rows("e2e_p50_s", [(0.3, 0.32), (0.4, 0.41)])
    wide = rows("ttft_p50_s", [(0.01, 0.011), (2.0, 2.2)])
    fig = plots.prediction_figure(narrow + wide, None, "t")
    fig.canvas.draw()
    texts = {ax.get_title(): [t.get_text() for t in ax.xaxis.get_ticklabels(minor=True)
                              if t.get_text()] for ax in fig.axes}  # fmt: skip
    assert texts["E2E p50"] and texts["TTFT p50"] == []
