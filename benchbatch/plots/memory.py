"""The memory figure: KV memory reserved and used over time, running sequences over time,
and the fragmentation of each policy, all on one budget (memory_timeline.csv, memory.csv)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from benchbatch.plots import plt, save

COLORS = {
    "static-reserve": "tab:red",
    "continuous-reserve": "tab:blue",
    "continuous-paged": "tab:green",
}
MAX_POINTS = 4_000  # longer timelines are drawn as bin means (the CSV keeps every step)
GIB = 2**30


def memory_figure(timeline: list[dict] | pd.DataFrame, rows: list[dict], path: Path, title: str):
    """Left, over steps: KV memory reserved (solid) and used (dashed), then running sequences.
    Right: each policy's mean memory, used and reserved but unused (the fragmentation)."""
    df = timeline if isinstance(timeline, pd.DataFrame) else pd.DataFrame(timeline)
    by = {r["policy"]: r for r in rows}
    scale, unit = _unit(rows)
    fig = plt.figure(figsize=(13, 7))
    grid = fig.add_gridspec(2, 2, width_ratios=(2.6, 1))
    kv, running = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0])
    bars = fig.add_subplot(grid[:, 1])
    for policy, color in COLORS.items():
        mine = df[df["policy"] == policy] if len(df) else df
        if policy not in by or not len(mine):
            continue
        step = mine["step"].to_numpy()
        _line(kv, step, mine["kv_reserved_tokens"] * scale, color, "-", f"{policy}: reserved")
        _line(kv, step, mine["kv_used_tokens"] * scale, color, "--", f"{policy}: used")
        r = by[policy]
        label = f"{policy}: peak {r['peak_running']:,}, mean {r['mean_running']:.3g}"
        _line(running, step, mine["running"], color, "-", label)
    budget = rows[0]["kv_budget_blocks"] * rows[0]["block_size"] * scale if rows else None
    if budget:
        kv.axhline(budget, color="black", ls=":", lw=1, label="budget")
    kv.set_ylabel(f"KV memory ({unit})")
    kv.set_title("KV memory over time: reserved (solid) and used (dashed)", fontsize=9)
    running.set_ylabel("running sequences")
    running.set_xlabel("step")
    running.set_title("running sequences over time", fontsize=9)
    for ax in (kv, running):
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(True, alpha=0.3)
    _fragmentation(bars, [by[p] for p in COLORS if p in by], scale, unit)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def _unit(rows: list[dict]) -> tuple[float, str]:
    """GiB when the rows know a token's bytes, else tokens."""
    if rows and rows[0].get("kv_budget_gib") is not None:
        tokens = rows[0]["kv_budget_blocks"] * rows[0]["block_size"]
        return rows[0]["kv_budget_gib"] / tokens, "GiB"
    return 1.0, "tokens"


def _line(ax, step: np.ndarray, values, color: str, style: str, label: str) -> None:
    values = np.asarray(values, dtype=float)
    if step.size > MAX_POINTS:  # bin means: a line per step would be solid ink
        edges = np.linspace(0, step.size, MAX_POINTS + 1).astype(int)
        values = np.add.reduceat(values, edges[:-1]) / np.diff(edges)
        step = step[edges[:-1]]
    ax.step(step, values, where="post", color=color, ls=style, lw=0.9, label=label)


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
