"""The serving curve's figures: p50 and p99 TTFT and TPOT against throughput per policy, with
slot occupancy and mean batch (why the curve bends), and the Pareto front of tokens/s per
user against tokens/s per device; simulated and measured overlaid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from benchbatch.output.plots import plt, save, tight

COLORS = {"static": "tab:red", "continuous": "tab:blue", "chunked": "tab:green"}
# source -> (line style, marker, filled, label)
STYLES = {
    "sim": ("-", ".", True, "simulated"),
    "sim-matched": (":", "o", False, "simulated, the real run's requests"),
    "real": ("-", "o", True, "real engine"),
}
PANELS = (
    ("ttft_p50_s", "p50 TTFT (s)", True),
    ("ttft_p99_s", "p99 TTFT (s)", True),
    ("slot_occupancy", "slot occupancy", False),
    ("tpot_p50_s", "p50 TPOT (ms)", False),
    ("tpot_p99_s", "p99 TPOT (ms)", False),
    ("mean_batch", "mean batch (sequences per step)", False),
)
MS = {"tpot_p50_s", "tpot_p99_s"}


def _lines(ax, df: pd.DataFrame, x: str, y: str, scale: float = 1.0) -> None:
    """One line per (policy, source), points in rate order."""
    for (policy, source), g in df.groupby(["policy", "source"], sort=False):
        style, marker, filled, label = STYLES.get(source, STYLES["sim"])
        g = g.sort_values("rate_rps")
        color = COLORS.get(policy, "gray")
        ax.plot(
            g[x],
            g[y] * scale,
            ls=style,
            marker=marker,
            color=color,
            markerfacecolor=color if filled else "none",
            markersize=6 if source == "real" else 4,
            lw=2 if source == "real" else 1,
            alpha=0.9,
            label=f"{policy} ({label})",
        )


def serve_figure(rows: list[dict], path: Path, title: str, slo_ttft: float, slo_tpot: float):
    """Six panels against output-token throughput: p50 and p99 TTFT, slot occupancy (top);
    p50 and p99 TPOT, mean batch (bottom). The SLO limits are dotted on the p99 panels."""
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax, (key, name, log) in zip(axes.flat, PANELS, strict=True):
        _lines(ax, df, "output_throughput_tps", key, 1e3 if key in MS else 1.0)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.set_xlabel("output tokens/s (throughput)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 1].axhline(slo_ttft, color="black", ls="--", lw=1, label="SLO")
    axes[1, 1].axhline(slo_tpot * 1e3, color="black", ls="--", lw=1, label="SLO")
    axes[0, 2].set_ylim(0, 1.05)
    for ax in (axes[1, 0], axes[1, 1]):
        ax.set_ylim(bottom=0)
    handles, labels = axes[0, 1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.03))
    fig.suptitle(
        f"{title}\neach point a request rate (Poisson arrivals; the rightmost: everything "
        "queued). Latency climbs where a policy's throughput stops growing: its slots are full",
        fontsize=9,
    )
    tight(fig, rect=(0, 0.04, 1, 1))
    save(fig, path)


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The points no other point beats on both x and y (both larger is better), by x."""
    ordered = df.sort_values([x, y], ascending=[False, False])
    keep, best = [], -np.inf
    for i, row in ordered.iterrows():
        if row[y] > best:
            keep.append(i)
            best = row[y]
    return df.loc[keep].sort_values(x)


def pareto_figure(rows: list[dict], path: Path, title: str) -> None:
    """Tokens/s per user (output throughput over the requests in the system, Little's law)
    against tokens/s per device: every point, and the front over all policies per source."""
    df = pd.DataFrame(rows)
    x, y = "tokens_per_s_per_user", "output_throughput_tps"
    df = df[np.isfinite(df[x]) & np.isfinite(df[y])]
    fig, ax = plt.subplots(figsize=(8.5, 6))
    for (policy, source), g in df.groupby(["policy", "source"], sort=False):
        _, marker, filled, label = STYLES.get(source, STYLES["sim"])
        color = COLORS.get(policy, "gray")
        ax.scatter(
            g[x],
            g[y],
            marker=marker if marker != "." else "s",
            s=40 if source == "real" else 18,
            facecolors=color if filled else "none",
            edgecolors=color,
            alpha=0.8,
            label=f"{policy} ({label})",
        )
    for source in ("sim", "real"):
        mine = df[df["source"] == source]
        if len(mine):
            front = pareto_front(mine, x, y)
            style = STYLES[source][0]
            ax.plot(
                front[x],
                front[y],
                ls=style,
                color="black",
                lw=1.2 if source == "real" else 0.8,
                label=f"Pareto front ({STYLES[source][3]})",
            )
    ax.set_xlabel("tokens/s per user (output throughput / requests in the system)")
    ax.set_ylabel("tokens/s per device (output throughput)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=8)
    tight(fig)
    save(fig, path)
