"""The ablation's figures: time between tokens over the run (the stall of a whole prefill
against the bounded steps of chunks), TTFT and TBT distributions per scheme, and the SLO
search's grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import ticker

from benchbatch.core.units import significant
from benchbatch.output.plots import plt, save, tight

COLORS = {"mixed-only": "tab:red", "chunks-only": "tab:orange", "both": "tab:blue"}
LABELS = {
    "mixed-only": "mixed batching, no chunks",
    "chunks-only": "chunks, no mixed batching",
    "both": "both (Sarathi-Serve)",
}
STYLES = {"sim": "--", "real": "-"}


def tbt_figure(gaps: list[dict], rows: list[dict], path: Path, title: str) -> None:
    """One panel per scheme: every gap between two tokens at the time the later one came
    (real when measured, simulated otherwise, the other faint), P99 as a line. Without
    chunks, each long prompt's prefill is a column of tall gaps: the decodes it stalled."""
    df = pd.DataFrame(gaps)
    schemes = [s for s in COLORS if len(df) and (df["scheme"] == s).any()]
    if not schemes:  # every request one token long: no gap to draw
        fig, ax = plt.subplots(figsize=(11, 2.5))
        ax.text(0.5, 0.5, "no gaps between tokens: every request has a single output token",
                ha="center", va="center", transform=ax.transAxes)  # fmt: skip
        ax.set_axis_off()
        fig.suptitle(title, fontsize=9)
        save(fig, path)
        return
    fig, axes = plt.subplots(len(schemes), 1, figsize=(11, 2.5 * len(schemes)), sharey=True)
    axes = np.atleast_1d(axes)
    by = {(r["scheme"], r["source"]): r for r in rows}
    for ax, scheme in zip(axes, schemes, strict=True):
        mine = df[df["scheme"] == scheme]
        sources = [s for s in ("sim", "real") if (mine["source"] == s).any()]
        main = sources[-1]
        for source in sources:
            pts = mine[mine["source"] == source]
            faint = source != main
            ax.scatter(
                pts["time_s"],
                pts["tbt_s"] * 1e3,
                s=4 if faint else 6,
                alpha=0.25 if faint else 0.6,
                color="gray" if faint else COLORS[scheme],
                label=f"{source}" + (" (faint)" if faint else ""),
            )
        r = by[(scheme, main)]
        ax.axhline(r["tbt_p99_s"] * 1e3, color="black", ls=":", lw=1, label="P99")
        ax.set_title(
            f"{LABELS[scheme]} ({main}): P99 TBT {r['tbt_p99_s'] * 1e3:.0f} ms, "
            f"largest {r['tbt_max_s'] * 1e3:.0f} ms" if r["tbt_max_s"] == r["tbt_max_s"] else
            f"{LABELS[scheme]} ({main}): no gap between tokens",
            fontsize=10,
            loc="left",
        )
        ax.set_ylabel("time between\ntokens (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time (s)")
    fig.suptitle(title, fontsize=9)
    tight(fig)
    save(fig, path)


def latency_figure(
    requests: list[dict], gaps: list[dict], rows: list[dict], path: Path, title: str
) -> None:
    """Left: TTFT over requests; middle: TBT over all gaps (cumulative distributions, real
    solid, simulated dashed); right: P50 TTFT and P99 TBT side by side as in the paper."""
    req, gap = pd.DataFrame(requests), pd.DataFrame(gaps)
    fig, (ttft, tbt, bars) = plt.subplots(1, 3, figsize=(15, 4.4))
    for scheme, color in COLORS.items():
        for source, ls in STYLES.items():
            mine = req[(req["scheme"] == scheme) & (req["source"] == source)] if len(req) else req
            if len(mine):
                _ecdf(ttft, mine["ttft_s"], color, ls, f"{scheme} ({source})")
            g = gap[(gap["scheme"] == scheme) & (gap["source"] == source)] if len(gap) else gap
            if len(g):
                _ecdf(tbt, g["tbt_s"] * 1e3, color, ls, f"{scheme} ({source})")
    ttft.set_xlabel("time to first token (s)")
    ttft.set_ylabel("fraction of requests")
    tbt.set_xlabel("time between tokens (ms)")
    tbt.set_ylabel("fraction of gaps")
    tbt.axhline(0.99, color="black", ls=":", lw=0.8)
    tbt.set_xscale("log")
    tbt.xaxis.set_major_formatter(ticker.ScalarFormatter())
    tbt.xaxis.set_minor_formatter(ticker.NullFormatter())
    for ax in (ttft, tbt):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no gap at all: nothing to name
            ax.legend(fontsize=7)
    _bars(bars, rows)
    fig.suptitle(title, fontsize=9)
    tight(fig)
    save(fig, path)


def _ecdf(ax, values, color: str, ls: str, label: str) -> None:
    v = np.sort(np.asarray(values, dtype=float))
    ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=color, ls=ls, label=label)


def _bars(ax, rows: list[dict]) -> None:
    """P50 TTFT and P99 TBT per scheme, each scaled to the largest of its kind, so the
    ordering compares with the paper's (0.53/0.68, 1.04/0.17, 0.76/0.14 s) at a glance."""
    df = pd.DataFrame(rows)
    sources = [s for s in ("sim", "real") if len(df) and (df["source"] == s).any()]
    main = df[df["source"] == sources[-1]].set_index("scheme") if sources else df
    schemes = [s for s in COLORS if s in main.index]
    x = np.arange(2)
    width = 0.8 / (2 * max(1, len(schemes)))
    for i, scheme in enumerate(schemes):
        r = main.loc[scheme]
        ours = [
            r["ttft_p50_s"] / main["ttft_p50_s"].max(),
            r["tbt_p99_s"] / main["tbt_p99_s"].max(),
        ]
        paper = [r["paper_ttft_p50_s"] / 1.04, r["paper_tbt_p99_s"] / 0.68]
        offset = (2 * i - len(schemes)) * width
        ax.bar(x + offset, ours, width, color=COLORS[scheme], label=f"{scheme} ({sources[-1]})")
        ax.bar(
            x + offset + width,
            paper,
            width,
            color=COLORS[scheme],
            alpha=0.35,
            hatch="//",
            label=f"{scheme} (paper)",
        )
    ax.set_xticks(x, ["P50 TTFT", "P99 TBT"])
    ax.set_ylabel("relative to the largest scheme")
    ax.set_title("ours (solid) against the paper (hatched)", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.grid(True, axis="y", alpha=0.3)


def slo_figure(rows: list[dict], ttft_s: float, tbt_s: float, path: Path, title: str) -> None:
    """The SLO search: goodput of every (max_num_seqs, token budget), grayed where P99 TTFT
    or P99 TBT misses its limit."""
    df = pd.DataFrame(rows)
    seqs = sorted(df["max_num_seqs"].unique())
    budgets = sorted(df["max_num_batched_tokens"].unique())
    grid = np.full((len(seqs), len(budgets)), np.nan)
    met = np.zeros_like(grid, dtype=bool)
    for _, r in df.iterrows():
        i, j = seqs.index(r["max_num_seqs"]), budgets.index(r["max_num_batched_tokens"])
        grid[i, j], met[i, j] = r["goodput_rps"], bool(r["meets_slo"])
    fig, ax = plt.subplots(figsize=(1.0 * len(budgets) + 3, 0.6 * len(seqs) + 2))
    image = ax.imshow(np.where(met, grid, np.nan), cmap="viridis", aspect="auto", origin="lower")
    for i in range(len(seqs)):
        for j in range(len(budgets)):
            if np.isfinite(grid[i, j]):
                ax.text(
                    j,
                    i,
                    significant(grid[i, j], 2) + ("" if met[i, j] else "\nmiss"),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if not met[i, j] else "white",
                )
    ax.set_xticks(range(len(budgets)), [str(b) for b in budgets])
    ax.set_yticks(range(len(seqs)), [str(s) for s in seqs])
    ax.set_xlabel("max_num_batched_tokens")
    ax.set_ylabel("max_num_seqs")
    ax.set_title(
        f"goodput (req/s), scheme both: P99 TTFT <= {ttft_s:g} s and P99 TBT <= {tbt_s:g} s",
        fontsize=9,
    )
    fig.colorbar(image, ax=ax, label="goodput (req/s) where the SLOs are met")
    fig.suptitle(title, fontsize=8)
    tight(fig)
    save(fig, path)
