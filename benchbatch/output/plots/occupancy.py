"""The occupancy figures: the article's active slots over steps (static red above, continuous
blue below, one step axis), and the real engine's time against steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from benchbatch.core.simulate import timeline_runs
from benchbatch.core.timeline import RunLengths
from benchbatch.core.units import figure
from benchbatch.output.plots import plt, save, tight

COLORS = {"static": "tab:red", "continuous": "tab:blue"}
DODGE = {"static": -0.15, "continuous": 0.15}  # sequences: the two policies side by side
MARKERS = {"static": "s", "continuous": "o"}
MAX_POINTS = 20_000  # longer timelines are drawn as bin means (the CSV keeps every change)


def occupancy_figure(
    timeline: pd.DataFrame | list[dict], rows: list[dict], path: Path, title: str
) -> None:
    """Active slots per step, one panel per policy, sharing the step axis so the shorter
    continuous run shows how many steps it saves; occupancy and steps in each title.

    timeline: simulate.timeline_table() (run-length form, columns step, steps and
    active_slots) or timeline_rows() (one row per step); both draw the same figure."""
    runs = _runs(timeline)
    by = {r["policy"]: r for r in rows}
    policies = [p for p in COLORS if p in by]
    fig, axes = plt.subplots(len(policies), 1, figsize=(11, 2.6 * len(policies)), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, policy in zip(axes, policies, strict=True):
        r = by[policy]
        _active_panel(ax, runs.get(policy, RunLengths.empty()), r["slots"], COLORS[policy])
        ax.set_title(
            f"{policy} batching: {r['total_steps']:,} steps, slot occupancy {r['occupancy']:.1%}",
            fontsize=10,
            loc="left",
        )
    axes[-1].set_xlabel("step")
    axes[-1].set_xlim(0, max(by[p]["total_steps"] for p in policies))
    fig.suptitle(title, fontsize=10)
    tight(fig)
    save(fig, path)


def _runs(timeline: pd.DataFrame | list[dict]) -> dict[str, RunLengths]:
    df = timeline if isinstance(timeline, pd.DataFrame) else pd.DataFrame(timeline)
    if not len(df):
        return {}
    if "steps" in df.columns:
        return timeline_runs(df)
    return {
        policy: RunLengths.from_per_step(rows["active_slots"].to_numpy())
        for policy, rows in df.groupby("policy", sort=False)
    }


def _active_panel(ax, runs: RunLengths, slots: int, color: str) -> None:
    steps, values, binned = _downsample(runs)
    ax.fill_between(steps, values, step="post", color=color, alpha=0.35, lw=0)
    ax.step(steps, values, where="post", color=color, lw=0.6)
    ax.axhline(slots, color="black", ls="--", lw=0.8)
    ax.set_ylim(0, slots * 1.08)
    ax.set_ylabel(f"active slots (of {slots})" + (",\nbin mean" if binned else ""))
    ax.grid(True, alpha=0.3)


def _downsample(runs: RunLengths) -> tuple[np.ndarray, np.ndarray, bool]:
    """Step starts and values to draw with step="post": each run's first step and count
    (the same picture as every step), or bin means when there are too many steps to draw
    one by one (exact: summed over runs, not over expanded steps)."""
    n = runs.total_steps
    if n <= MAX_POINTS:
        last = runs.active[-1] if n else 0
        return np.append(runs.step, n), np.append(runs.active, last), False
    edges = np.linspace(0, n, MAX_POINTS // 4 + 1).astype(int)
    means = runs.sums(edges) / np.diff(edges)
    return edges, np.append(means, means[-1]), True


def engine_figure(steps: list[dict], rows: list[dict], path: Path, title: str) -> None:
    """Left: elapsed wall time over steps, measured (solid) and simulated steps x median step
    (dashed). Right: each step's time against the sequences it decoded (padding included),
    steps with prefills marked: where it is flat, time is proportional to steps and the
    simulation's speedup holds in wall time."""
    df = pd.DataFrame(steps)
    fig, (elapsed, cost) = plt.subplots(1, 2, figsize=(12, 4.4))
    by = {r["policy"]: r for r in rows}
    for policy, color in COLORS.items():
        mine = df[df["policy"] == policy] if len(df) else df
        if not len(mine):
            continue
        seconds = mine["step_ms"].cumsum() / 1e3
        label = f"{policy}: {figure(seconds.iloc[-1])} s"
        elapsed.plot(mine["step"], seconds, color=color, label=label)
        if policy in by:
            median_s = by[policy]["median_step_ms"] / 1e3
            sim = by[policy]["sim_steps"]
            elapsed.plot([0, sim], [0, sim * median_s], ls="--", color=color, lw=1)
        # Side by side, not on top of each other: the policies share every batch size.
        decoded = mine["decode_tokens"] + mine["padded"] + DODGE[policy]
        prefill = mine["prefill_tokens"] > 0
        style = dict(facecolors="none", edgecolors=color) if policy == "static" else {}
        fill = {} if style else dict(color=color)
        cost.scatter(decoded[~prefill], mine["step_ms"][~prefill], s=10, alpha=0.6,
                     marker=MARKERS[policy], **style, **fill)  # fmt: skip
        cost.scatter(decoded[prefill], mine["step_ms"][prefill], s=22, marker="x", color=color)
        cost.scatter([], [], s=14, marker=MARKERS[policy], **style, **fill,
                     label=f"{policy}: decode steps")  # fmt: skip
        cost.scatter([], [], s=22, marker="x", color=color, label=f"{policy}: with prefills")
    elapsed.set_xlabel("step")
    elapsed.set_ylabel("elapsed wall time (s)")
    elapsed.set_title("measured (solid); simulated steps x median step (dashed)", fontsize=9)
    elapsed.legend(fontsize=8)
    cost.set_xlabel("sequences decoded in the step (static: padding included)")
    cost.xaxis.set_major_locator(MaxNLocator(integer=True))
    cost.set_ylabel("step time (ms)")
    cost.set_title("what a step costs", fontsize=9)
    cost.legend(fontsize=8)
    for ax in (elapsed, cost):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    tight(fig)
    save(fig, path)
