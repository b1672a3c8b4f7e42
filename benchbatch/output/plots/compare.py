"""Comparison figures: the same plot from several result folders, one colour per run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from benchbatch.core.units import flop_unit
from benchbatch.output.plots import plt, save, tight
from benchbatch.output.plots.spread import rate_bounds, time_bounds, time_scaled_bounds, yerr

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
    "not run" when it has no such row; counts are labelled as integers."""
    keys = list(dict.fromkeys(df[key]))
    colors, width = _colors(runs), 0.8 / max(len(runs), 1)
    x = np.arange(len(keys))
    ok = _ok(df)
    for i, run in enumerate(runs):
        mine = ok[ok["run"] == run].drop_duplicates(key).set_index(key)[value]
        heights = [mine.get(k, np.nan) for k in keys]
        where = x + (i - (len(runs) - 1) / 2) * width
        bars = ax.bar(where, heights, width, label=run)
        for bar in bars:
            bar.set_color(colors[run])
        ax.bar_label(bars, labels=[_value_label(h) for h in heights], fontsize=7)
        if bounds is not None:
            rows = ok[ok["run"] == run].drop_duplicates(key).set_index(key)
            spans = [bounds(rows.loc[k].to_dict(), h) if k in rows.index else None
                     for k, h in zip(keys, heights, strict=True)]  # fmt: skip
            if any(spans):
                ax.errorbar(where, heights, yerr=yerr(heights, spans), fmt="none",
                            ecolor="black", capsize=2, elinewidth=0.8)  # fmt: skip
        statuses = df[df["run"] == run].drop_duplicates(key).set_index(key)
        for k, at, h in zip(keys, where, heights, strict=True):
            if np.isnan(h):
                ax.text(at, 0.02, _why(statuses, k), rotation=90,
                        ha="center", va="bottom", fontsize=7,
                        transform=ax.get_xaxis_transform())  # fmt: skip
    ax.set_xticks(x, keys, rotation=20)
    if log:
        ax.set_yscale("log")
    ax.grid(True, axis="y", alpha=0.3)


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
    return f"{int(h):,}" if float(h).is_integer() else f"{h:.3g}"


def compare_phases_figure(df: pd.DataFrame, runs: list[str], path: Path, title: str) -> None:
    """Achieved FLOP/s (GFLOP/s where no run reaches a TFLOP/s) and cost per token of each
    step, one bar per run."""
    unit = flop_unit(_ok(df)["tflops"])
    scaled = df.assign(rate=df["tflops"] * unit.per_tflops)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    _grouped_bars(ax1, scaled, "label", "rate", runs, log=True, bounds=_rate_span)
    ax1.set_ylabel(f"achieved {unit.name} (log scale)")
    ax1.set_title(f"{unit.name} per step", fontsize=10)
    _grouped_bars(ax2, df, "label", "us_per_token", runs, log=True, bounds=time_scaled_bounds)
    ax2.set_ylabel("cost per token: step time / tokens made (us, log scale)")
    ax2.set_title("cost per token", fontsize=10)
    ax1.legend(fontsize=8)
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
    ax1.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def compare_occupancy_figure(
    occupancy: pd.DataFrame, engine: pd.DataFrame | None, runs: list[str], path: Path, title: str
) -> None:
    """Slot occupancy and total steps per policy (simulated), and the real engine's wall
    time per policy where runs have it; one bar per run."""
    panels = 3 if engine is not None and not engine.empty else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
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
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    tight(fig)
    save(fig, path)


SERVE_STYLES = {"static": "--", "continuous": "-", "chunked": ":"}
SERVE_MARKERS = {"sim": ".", "real": "o"}


def compare_serve_figure(df: pd.DataFrame, runs: list[str], path: Path, title: str) -> None:
    """p99 TTFT and p99 TPOT against output-token throughput: one colour per run, one line
    style per policy, simulated (small dots) and real-engine (circles) points."""
    colors = _colors(runs)
    fig, (ttft, tpot) = plt.subplots(1, 2, figsize=(13, 4.8))
    for (run, policy, source), g in df.groupby(["run", "policy", "source"], sort=False):
        if source not in SERVE_MARKERS or run not in colors:
            continue
        g = g.sort_values("rate_rps")
        kw = dict(
            color=colors[run],
            ls=SERVE_STYLES.get(policy, "-"),
            label=f"{run}: {policy} ({source})",
            marker=SERVE_MARKERS[source],
            lw=1.6 if source == "real" else 1,
        )
        ttft.plot(g["output_throughput_tps"], g["ttft_p99_s"], **kw)
        tpot.plot(g["output_throughput_tps"], g["tpot_p99_s"] * 1e3, **kw)
    ttft.set_yscale("log")
    ttft.set_ylabel("p99 TTFT (s, log)")
    tpot.set_ylabel("p99 TPOT (ms)")
    tpot.set_ylim(bottom=0)
    for ax in (ttft, tpot):
        ax.set_xlabel("output tokens/s (throughput)")
        ax.grid(True, which="both", alpha=0.3)
    ttft.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    tight(fig)
    save(fig, path)
