"""The phases figure: achieved TFLOP/s and time per token of each step."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchbatch.plots import plt, save

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def phases_figure(rows: list[dict], path: Path, title: str) -> None:
    """Achieved TFLOP/s and time per token for each step: the prefill/decode gap."""
    df = pd.DataFrame(rows)
    df = df[df["status"] == "ok"]
    colors = [PHASE_COLORS[p] for p in df["phase"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, column, label in (
        (ax1, "tflops", "achieved TFLOP/s"),
        (ax2, "us_per_token", "time per token (us)"),
    ):
        bars = ax.bar(df["label"], df[column], color=colors)
        ax.set_yscale("log")
        ax.set_ylabel(label + " (log scale)")
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in df[column]], fontsize=8)
        ax.tick_params(axis="x", rotation=20)
    ax1.set_title("prefill is compute-bound, decode memory-bound")
    ax2.set_title("batching makes each decode token cheaper")
    fig.suptitle(title, fontsize=10)
    save(fig, path)
