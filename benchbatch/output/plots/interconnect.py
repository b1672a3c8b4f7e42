"""The interconnect's roof: all-reduce bus bandwidth against message size, and where a
tensor-parallel step's own all-reduces sit under it."""

from __future__ import annotations

import math
from pathlib import Path

from benchbatch.output.plots import plt, save

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def allreduce_figure(
    probe_rows: list[dict], step_rows: list[dict], path: Path, title: str = "all-reduce"
) -> None:
    """Log-log message bytes against bus bandwidth (GB/s, nccl-tests' busbw): the measured
    sweep as a line, each step's all-reduces (their mean time) as a labelled point."""
    roof = sorted(
        (r["size"], r["gbps"]) for r in probe_rows if r.get("kind") == "allreduce" and _ok(r)
    )
    points = [r for r in step_rows if _ok(r) and _positive(r.get("allreduce_busbw_gbps"))]
    fig, ax = plt.subplots(figsize=(8, 5))
    if roof:
        ax.plot(*zip(*roof, strict=True), "-o", color="black", ms=3, lw=1.5,
                label="all-reduce alone (measured sweep)")  # fmt: skip
    for r in points:
        color = PHASE_COLORS.get(r.get("phase"), "tab:green")
        ax.plot(r["allreduce_bytes"], r["allreduce_busbw_gbps"], "o", color=color, ms=6)
        ax.annotate(r.get("label", ""), (r["allreduce_bytes"], r["allreduce_busbw_gbps"]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message bytes (one all-reduce)")
    ax.set_ylabel("bus bandwidth GB/s (algbw x 2(n-1)/n)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    if roof:
        ax.legend(fontsize=8, loc="upper left")
    save(fig, path)


def _ok(row: dict) -> bool:
    return row.get("status", "ok") == "ok"


def _positive(value) -> bool:
    try:
        return math.isfinite(float(value)) and float(value) > 0
    except (TypeError, ValueError):
        return False
