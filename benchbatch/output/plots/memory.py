"""The memory figure: KV memory reserved and used over time, running sequences over time,
and the fragmentation of each policy, all on one budget (memory_timeline.csv, memory.csv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from benchbatch.core.units import figure
from benchbatch.output.plots import plt, save, tight

COLORS = {
    "static-reserve": "tab:red",
    "continuous-reserve": "tab:blue",
    "continuous-paged": "tab:green",
}
MAX_POINTS = 4_000  # longer timelines are drawn as bin means (the CSV keeps every step)
GIB = 2**30


def memory_figure(timeline: list[dict] | pd.DataFrame, rows: list[dict], path: Path, title: str):
    """One row per policy, each over its own steps: KV memory reserved (line) and used
    (filled) against the budget, then running sequences; on the right each policy's mean
    memory, used and reserved but never written (the fragmentation), and its preemptions."""
    df = timeline if isinstance(timeline, pd.DataFrame) else pd.DataFrame(timeline)
    by = {r["policy"]: r for r in rows}
    policies = [p for p in COLORS if p in by]
    scale, unit = _unit(rows)
    fig = plt.figure(figsize=(13, 2.4 * len(policies) + 0.8))
    grid = fig.add_gridspec(len(policies), 3, width_ratios=(1.6, 1.6, 1))
    budget = rows[0]["kv_budget_blocks"] * rows[0]["block_size"] * scale if rows else 0
    for i, policy in enumerate(policies):
        mine, r, color = df[df["policy"] == policy], by[policy], COLORS[policy]
        kv, running = fig.add_subplot(grid[i, 0]), fig.add_subplot(grid[i, 1])
        step = mine["step"].to_numpy()
        _line(kv, step, mine["kv_used_tokens"] * scale, color, "used", fill=True)
        _line(kv, step, mine["kv_reserved_tokens"] * scale, color, "reserved")
        kv.axhline(budget, color="black", ls=":", lw=1, label="budget")
        kv.set_ylim(0, budget * 1.1 or 1)
        kv.set_ylabel(f"KV ({unit})")
        kv.set_title(f"{policy}: KV memory reserved and used", fontsize=9, loc="left")
        _line(running, step, mine["running"], color, "running", fill=True)
        running.set_ylim(0, running_top(mine["running"], r))  # its own data's range
        running.yaxis.set_major_locator(MaxNLocator(integer=True))  # sequences: whole
        running.set_ylabel("sequences")
        running.set_title(
            f"running sequences: peak {r['peak_running']:,}, mean {figure(r['mean_running'])}",
            fontsize=9,
            loc="left",
        )
        for ax in (kv, running):
            ax.grid(True, alpha=0.3)
            ax.set_xlim(0, max(len(step), 1))
        kv.legend(fontsize=7, loc="upper right")
    for ax in fig.axes[-2:]:
        ax.set_xlabel("step")
    _fragmentation(fig.add_subplot(grid[:, 2]), [by[p] for p in policies], scale, unit)
    fig.suptitle(title, fontsize=10)
    tight(fig)
    save(fig, path)


def running_top(running, row: dict) -> float:
    """The top of one policy's running-sequences axis: a tenth above its own peak (each
    policy its own range: a shared one leaves the policies that run few sequences flat)."""
    values = np.asarray(running, dtype=float)
    peak = max(float(values.max()) if values.size else 0.0, float(row.get("peak_running", 0)))
    return max(peak, 1.0) * 1.1


def _unit(rows: list[dict]) -> tuple[float, str]:
    """GiB when the rows know a token's bytes, else tokens."""
    if rows and rows[0].get("kv_budget_gib") is not None:
        tokens = rows[0]["kv_budget_blocks"] * rows[0]["block_size"]
        return rows[0]["kv_budget_gib"] / tokens, "GiB"
    return 1.0, "tokens"


def _line(ax, step: np.ndarray, values, color: str, label: str, fill: bool = False) -> None:
    values = np.asarray(values, dtype=float)
    if step.size > MAX_POINTS:  # bin means: a line per step would be solid ink
        edges = np.linspace(0, step.size, MAX_POINTS + 1).astype(int)
        values = np.add.reduceat(values, edges[:-1]) / np.diff(edges)
        step = step[edges[:-1]]
    if fill:
        ax.fill_between(step, values, step="post", color=color, alpha=0.35, lw=0, label=label)
    else:
        ax.step(step, values, where="post", color=color, lw=1.0, label=label)


def _fragmentation(ax, rows: list[dict], scale: float, unit: str) -> None:
    names = [r["policy"] for r in rows]
    used = np.array([r["kv_used_mean_tokens"] * scale for r in rows])
    reserved = np.array([r["kv_reserved_mean_tokens"] * scale for r in rows])
    x = np.arange(len(rows))
    colors = [COLORS[n] for n in names]
    ax.bar(x, used, color=colors, label="used")
    ax.bar(x, reserved - used, bottom=used, color=colors, alpha=0.3, hatch="//",
           label="reserved, unused")  # fmt: skip
    for i, r in enumerate(rows):
        text = f"{r['fragmentation']:.0%} unused\n{r['preemptions']:,} preempted"
        ax.annotate(text, (i, reserved[i]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [n.replace("-", "\n") for n in names], fontsize=8)
    ax.set_ylabel(f"mean KV memory over the run ({unit})")
    ax.set_ylim(0, max(reserved.max() if len(rows) else 1, 1e-9) * 1.2)
    ax.set_title("fragmentation: reserved but never written", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
