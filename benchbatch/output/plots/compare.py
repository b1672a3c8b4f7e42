"""Comparison figures: the same plot from several result folders, one colour per run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from benchbatch.core.units import flop_unit
from benchbatch.output.plots import plt, save
from benchbatch.output.plots.spread import (
    plain,
    plain_log_axis,
    rate_bounds,
    time_bounds,
    time_scaled_bounds,
    yerr,
)

CONTEXT_STYLES = ("-", "--", ":", "-.")


def _colors(runs: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {run: cmap(i % 10) for i, run in enumerate(runs)}


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df.columns else df


def _grouped_bars(
    ax, df: pd.DataFrame, key: str, value: str, runs: list[str], log: bool, bounds=None
) -> None:
    """One group of bars per `key` (in first-seen order), one bar per run. A run without a
    measured value there says why at the bar's place: its row's status (oom, skipped), or
    "not run" when it has no such row; counts are labelled as integers. Each value is
    written above its bar and above its error bar's cap, never through it."""
    keys = list(dict.fromkeys(df[key]))
    colors, width = _colors(runs), 0.8 / max(len(runs), 1)
    x = np.arange(len(keys))
    ok = _ok(df)
    tops = []
    for i, run in enumerate(runs):
        mine = ok[ok["run"] == run].drop_duplicates(key).set_index(key)[value]
        heights = [float(mine.get(k, np.nan)) for k in keys]
        where = x + (i - (len(runs) - 1) / 2) * width
        bars = ax.bar(where, heights, width, label=run)
        for bar in bars:
            bar.set_color(colors[run])
        above = list(heights)
        if bounds is not None:
            rows = ok[ok["run"] == run].drop_duplicates(key).set_index(key)
            spans = [bounds(rows.loc[k].to_dict(), h) if k in rows.index else None
                     for k, h in zip(keys, heights, strict=True)]  # fmt: skip
            if any(spans):
                ax.errorbar(where, heights, yerr=yerr(heights, spans), fmt="none",
                            ecolor="black", capsize=2, elinewidth=0.8)  # fmt: skip
                above = [max(h, s[1]) if s else h for h, s in zip(heights, spans, strict=True)]
        for at, h, top in zip(where, heights, above, strict=True):
            if not np.isnan(h):
                ax.annotate(_value_label(h), (at, top), xytext=(0, 3), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7,
                            rotation=90 if len(runs) > 2 else 0)  # fmt: skip
                tops.append(top)
        statuses = df[df["run"] == run].drop_duplicates(key).set_index(key)
        for k, at, h in zip(keys, where, heights, strict=True):
            if np.isnan(h):
                ax.text(at, 0.02, _why(statuses, k), rotation=90,
                        ha="center", va="bottom", fontsize=7,
                        transform=ax.get_xaxis_transform())  # fmt: skip
    ax.set_xticks(x, keys, rotation=20)
    # Every group's place on the axis, the bars of runs that have no row there too (a bar
    # of NaN height adds nothing to the autoscaled limits, so "not run" fell off the edge).
    ax.set_xlim(-0.5, len(keys) - 0.5)
    if log:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)  # 1,000, not 10^3
    _headroom(ax, tops, log)
    ax.grid(True, axis="y", alpha=0.3)


def _headroom(ax, tops: list[float], log: bool) -> None:
    """Room above the highest bar or cap for its label."""
    finite = [t for t in tops if np.isfinite(t) and (t > 0 or not log)]
    if not finite:
        return
    high = max(finite)
    if log:
        low = ax.get_ylim()[0]
        ax.set_ylim(low, high * (high / low) ** 0.18 if high > low else high * 2)
    else:
        ax.set_ylim(0 if min(finite) >= 0 else None, high * 1.2 if high > 0 else 1)


def _run_legend(fig, ax, runs: list[str]) -> None:
    """The runs' colours below the panels (constrained layout), clear of every bar label."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(runs), 4), fontsize=9,
               frameon=False)  # fmt: skip


def _rate_span(row: dict, value: float):
    return None if np.isnan(value) else rate_bounds(row, value)


def _why(rows: pd.DataFrame, key) -> str:
    """Why a run has no bar here: its row's status, or not run (no such row)."""
    if key not in rows.index:
        return "not run"
    status = str(rows["status"].get(key)) if "status" in rows.columns else "ok"
    return "not measured" if status == "ok" else status


def _value_label(h: float) -> str:
    if np.isnan(h):
        return ""
    return f"{int(h):,}" if float(h).is_integer() else plain(h)


def compare_phases_figure(df: pd.DataFrame, runs: list[str], path: Path, title: str) -> None:
    """Achieved FLOP/s (GFLOP/s where no run reaches a TFLOP/s) and cost per token of each
    step (output/compare.phases_steps' `step`: its label, and its context where the runs
    decoded at several), one bar per run."""
    if "step" not in df.columns:  # rows as the folders hold them: named here
        from benchbatch.output.compare import phases_steps

        df = phases_steps(df)
    unit = flop_unit(_ok(df)["tflops"])
    scaled = df.assign(rate=df["tflops"] * unit.per_tflops)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    _grouped_bars(ax1, scaled, "step", "rate", runs, log=True, bounds=_rate_span)
    ax1.set_ylabel(f"achieved {unit.name} (log scale)")
    ax1.set_title(f"{unit.name} per step", fontsize=10)
    _grouped_bars(ax2, df, "step", "us_per_token", runs, log=True, bounds=time_scaled_bounds)
    ax2.set_ylabel("cost per token: step time / tokens made (us, log scale)")
    ax2.set_title("cost per token", fontsize=10)
    _run_legend(fig, ax1, runs)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def compare_sweep_figure(df: pd.DataFrame, runs: list[str], path: Path, title: str) -> None:
    """Decode throughput and step time against batch: one colour per run, one line style
    per context."""
    ok = _ok(df)
    colors = _colors(runs)
    contexts = sorted(ok["context"].unique())
    fig, (tput, lat) = plt.subplots(1, 2, figsize=(12, 4.6))
    for run in runs:
        for j, context in enumerate(contexts):
            mine = ok[(ok["run"] == run) & (ok["context"] == context)].sort_values("batch")
            if mine.empty:
                continue
            label = run if len(contexts) == 1 else f"{run}, context {int(context):,}"
            style = CONTEXT_STYLES[j % len(CONTEXT_STYLES)]
            kw = dict(color=colors[run], ls=style, marker="o", label=label)
            tput.plot(mine["batch"], mine["tokens_per_s"], **kw)
            lat.plot(mine["batch"], mine["step_ms"], **kw)
            _error_bars(tput, lat, mine, colors[run])
    batches = sorted(int(b) for b in ok["batch"].unique())
    for ax in (tput, lat):
        ax.set_xscale("log")
        if batches:
            ax.xaxis.set_major_locator(FixedLocator(batches))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("batch (sequences per decode step)")
        ax.grid(True, which="both", alpha=0.3)
    tput.set_yscale("log")
    tput.set_ylabel("decode throughput (tokens/s, log)")
    lat.set_ylabel("decode step time (ms): each user's wait per token")
    lat.set_ylim(bottom=0)
    tput.set_title("throughput vs batch", fontsize=10)
    lat.set_title("step latency vs batch", fontsize=10)
    tput.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def _error_bars(tput, lat, rows: pd.DataFrame, color) -> None:
    """The repeats' 10th-90th percentile, on runs whose CSV keeps them."""
    records = rows.to_dict("records")
    rates, times = list(rows["tokens_per_s"]), list(rows["step_ms"])
    batches = list(rows["batch"])
    for ax, values, bounds in (
        (tput, rates, [rate_bounds(r, v) for r, v in zip(records, rates, strict=True)]),
        (lat, times, [time_bounds(r) for r in records]),
    ):
        if any(bounds):
            ax.errorbar(batches, values, yerr=yerr(values, bounds), fmt="none", ecolor=color,
                        capsize=3, elinewidth=1, alpha=0.8)  # fmt: skip


def compare_probe_figure(df: pd.DataFrame, runs: list[str], path: Path, title: str) -> None:
    """Measured ceilings: matmul FLOP/s and memory GB/s of each probe, one bar per run."""
    unit = flop_unit(_ok(df)[df["kind"] == "matmul"]["tflops"] if "kind" in df else [])
    scaled = df.assign(rate=df["tflops"] * unit.per_tflops)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    matmuls = scaled[scaled["kind"] == "matmul"]
    _grouped_bars(ax1, matmuls, "label", "rate", runs, log=False, bounds=_rate_span)
    ax1.set_ylabel(f"matmul {unit.name}")
    ax1.set_title("compute ceiling", fontsize=10)
    memory = df[df["kind"] != "matmul"]
    _grouped_bars(ax2, memory, "label", "gbps", runs, log=False, bounds=_rate_span)
    ax2.set_ylabel("GB/s")
    ax2.set_title("memory ceiling", fontsize=10)
    _run_legend(fig, ax1, runs)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def compare_occupancy_figure(
    occupancy: pd.DataFrame, engine: pd.DataFrame | None, runs: list[str], path: Path, title: str
) -> None:
    """Slot occupancy and total steps per policy (simulated), and the real engine's wall
    time per policy where runs have it; one bar per run."""
    panels = 3 if engine is not None and not engine.empty else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.4), layout="constrained")
    occ = occupancy.assign(occupancy_pct=100 * occupancy["occupancy"])
    _grouped_bars(axes[0], occ, "policy", "occupancy_pct", runs, log=False)
    axes[0].set_ylabel("slot occupancy (%)")
    axes[0].set_title("occupancy (simulated)", fontsize=10)
    _grouped_bars(axes[1], occupancy, "policy", "total_steps", runs, log=False)
    axes[1].set_ylabel("total steps")
    axes[1].set_title("steps to finish (simulated)", fontsize=10)
    if panels == 3:
        _grouped_bars(axes[2], engine, "policy", "wall_s", runs, log=False)
        axes[2].set_ylabel("wall time (s)")
        axes[2].set_title("real engine", fontsize=10)
    _run_legend(fig, axes[0], runs)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


SERVE_SOURCES = {
    "sim": ("-", 4, 1.2, "simulated"),
    "real": ("--", 7, 2.0, "real engine"),
    # a running server: measured by benchbatch's client, or by a peer's (vLLM, GuideLLM)
    "endpoint": ("-.", 7, 2.0, "server, benchbatch's client"),
    "vllm-bench-serve": (":", 7, 2.0, "server, vLLM bench serve"),
    "guidellm": (":", 7, 2.0, "server, GuideLLM"),
}
# Points of a server measured from outside share one column, whoever's client measured it.
SERVER_COLUMN = "a running server"
SERVE_METRICS = (("ttft_p99_s", "p99 TTFT (s, log)", 1.0, 0), ("tpot_p99_s", "p99 TPOT (ms)",
                                                                  1e3, 1))  # fmt: skip


def compare_serve_figure(
    df: pd.DataFrame,
    runs: list[str],
    path: Path,
    title: str,
    slos: dict[str, tuple[float | None, float | None]] | None = None,
) -> None:
    """p99 TTFT (top) and p99 TPOT (bottom) against the request rate, one column per
    policy: in each panel one colour per run, simulated (thin, solid) and real-engine (thick,
    dashed) points, and each run's SLO limit dashed (one black line when the runs share it);
    `max` points at the right edge."""
    from benchbatch.output.plots.serve import MARKERS, RateAxis, x_axis

    colors = _colors(runs)
    shown = df[df["source"].isin(list(SERVE_SOURCES)) & df["run"].isin(runs)]
    shown = shown.assign(policy=shown["policy"].replace({"endpoint": SERVER_COLUMN,
                                                         "peer": SERVER_COLUMN}))  # fmt: skip
    policies = list(dict.fromkeys(shown["policy"])) or ["-"]
    axis = x_axis(shown) if len(shown) else RateAxis([1.0])  # concurrency sweeps: their caps
    fig, axes = plt.subplots(2, len(policies), figsize=(5.2 * len(policies), 7.6),
                             squeeze=False, layout="constrained")  # fmt: skip
    for j, policy in enumerate(policies):
        for (run, source), g in shown[shown["policy"] == policy].groupby(["run", "source"],
                                                                         sort=False):  # fmt: skip
            style, size, lw, name = SERVE_SOURCES[source]
            g = g.sort_values(axis.column)
            xs = [axis.x(r) for r in g[axis.column]]
            for key, _, scale, row in SERVE_METRICS:
                axes[row, j].plot(xs, g[key] * scale, ls=style, lw=lw, color=colors[run],
                                  marker=MARKERS.get(policy, "o"), markersize=size, alpha=0.85,
                                  label=f"{run} ({name})")  # fmt: skip
        axes[0, j].set_title(policy, fontsize=10)
        axes[0, j].set_yscale("log")
        axes[1, j].set_ylim(bottom=0)
        for _key, ylabel, _, row in SERVE_METRICS:
            axes[row, j].set_ylabel(ylabel)
            axes[row, j].set_xlabel(axis.label, fontsize=8)
            axes[row, j].grid(True, which="both", alpha=0.3)
        _serve_slos(axes[:, j], slos or {}, runs, colors)
        for ax in axes[:, j]:
            axis.apply(ax)
    handles, labels = {}, {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    labels = list(handles)
    fig.legend([handles[k] for k in labels], labels, loc="outside lower center",
               ncol=min(len(labels), 4), fontsize=9, frameon=False)  # fmt: skip
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def _serve_slos(column, slos: dict, runs: list[str], colors: dict) -> None:
    """Each run's SLO limits on its panels: one black line when every run has the same."""
    for key, _, scale, row in SERVE_METRICS:
        values = {run: slos[run][row] for run in runs if run in slos and slos[run][row]}
        shared = len(set(values.values())) == 1
        for run, value in values.items():
            color = "black" if shared else colors[run]
            who = "SLO" if shared else f"{run}: SLO"
            unit = "s" if key.startswith("ttft") else "ms"
            column[row].axhline(
                value * scale,
                color=color,
                ls=(0, (4, 2)),
                lw=1.1,
                label=f"{who} p99 {key[:4].upper()} {value * scale:g} {unit}",
            )
            low, high = column[row].get_ylim()  # the limit in view, however far from the data
            if value * scale * 1.1 > high:
                column[row].set_ylim(low, value * scale * (1.5 if row == 0 else 1.1))
            if shared:
                break
