"""Comparison figures: the same plot from several result folders, one colour per run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from benchbatch.plots import plt, save, tight

CONTEXT_STYLES = ("-", "--", ":", "-.")


def _colors(runs: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {run: cmap(i % 10) for i, run in enumerate(runs)}


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df.columns else df


def _grouped_bars(ax, df: pd.DataFrame, key: str, value: str, runs: list[str], log: bool) -> None:
    """One group of bars per `key` (in first-seen order), one bar per run."""
    keys = list(dict.fromkeys(df[key]))
    colors, width = _colors(runs), 0.8 / max(len(runs), 1)
    x = np.arange(len(keys))
    for i, run in enumerate(runs):
        mine = df[df["run"] == run].drop_duplicates(key).set_index(key)[value]
        heights = [mine.get(k, np.nan) for k in keys]
        bars = ax.bar(x + (i - (len(runs) - 1) / 2) * width, heights, width, label=run)
        for bar in bars:
            bar.set_color(colors[run])
        labels = ["" if np.isnan(h) else f"{h:.3g}" for h in heights]
        ax.bar_label(bars, labels=labels, fontsize=7)
    ax.set_xticks(x, keys, rotation=20)
    if log:
        ax.set_yscale("log")
    ax.grid(True, axis="y", alpha=0.3)


def compare_phases_figure(df: pd.DataFrame, runs: list[str], path: Path, title: str) -> None:
    """Achieved TFLOP/s and time per token of each step, one bar per run."""
    ok = _ok(df)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
    _grouped_bars(ax1, ok, "label", "tflops", runs, log=True)
    ax1.set_ylabel("achieved TFLOP/s (log scale)")
    ax1.set_title("TFLOP/s per step", fontsize=10)
    _grouped_bars(ax2, ok, "label", "us_per_token", runs, log=True)
    ax2.set_ylabel("time per token (us, log scale)")
    ax2.set_title("time per token", fontsize=10)
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
    lat.set_ylabel("decode step time (ms)")
    lat.set_ylim(bottom=0)
    tput.set_title("throughput vs batch", fontsize=10)
    lat.set_title("step latency vs batch", fontsize=10)
    tput.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def compare_probe_figure(df: pd.DataFrame, runs: list[str], path: Path, title: str) -> None:
    """Measured ceilings: matmul TFLOP/s and memory GB/s of each probe, one bar per run."""
    ok = _ok(df)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.4))
    _grouped_bars(ax1, ok[ok["kind"] == "matmul"], "label", "tflops", runs, log=False)
    ax1.set_ylabel("matmul TFLOP/s")
    ax1.set_title("compute ceiling", fontsize=10)
    _grouped_bars(ax2, ok[ok["kind"] != "matmul"], "label", "gbps", runs, log=False)
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
    fig.tight_layout()
    save(fig, path)
