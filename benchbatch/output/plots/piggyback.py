"""The piggyback figure: a decode step with prefill tokens riding along, the price of chunking
a long prompt, and tile effects."""

from __future__ import annotations

from pathlib import Path

from matplotlib import ticker
from matplotlib.lines import Line2D

from benchbatch.core.units import figure
from benchbatch.output.plots import plt, save, tight
from benchbatch.output.plots.spread import BARS_LABEL, NOISY_LABEL, ring, time_bounds, yerr
from benchbatch.output.plots.spread import noisy as is_noisy


def piggyback_figure(
    rows: list[dict], chunk_rows: list[dict], summaries: list[dict], path: Path, title: str
) -> None:
    """Left: the mixed step against the decode-only step (and the threshold band) and against
    decode and prefill run apart, one curve per decode batch and context. Middle: a long
    prompt prefilled in chunks, over one prefill. Right: one prefill step per length."""
    fig, (mixed, chunked, tiles) = plt.subplots(
        1, 3, figsize=(15, 4.4), gridspec_kw={"width_ratios": [2, 1.3, 0.8]}
    )
    _mixed_panel(mixed, rows, summaries)
    _chunk_panel(chunked, [r for r in chunk_rows if r["kind"] == "chunked"])
    _tile_panel(tiles, [r for r in chunk_rows if r["kind"] == "tile"])
    fig.suptitle(title, fontsize=10)
    tight(fig)
    save(fig, path)


def _mixed_panel(ax, rows: list[dict], summaries: list[dict]) -> None:
    if not summaries:
        ax.text(0.5, 0.5, "nothing measured", ha="center", va="center", transform=ax.transAxes)
        return
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for s, color in zip(summaries, colors * len(summaries), strict=False):
        _curve(ax, rows, s, color, several=len(summaries) > 1)
    ticks = sorted({r["prefill_tokens"] for r in rows})
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlim(left=0)
    ax.set_xticks(ticks, [str(x) for x in ticks])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("prefill tokens riding on the decode step")
    ax.set_ylabel("step time (ms)")
    free = ", ".join(
        f"{s['free_prefill_tokens']} at b={s['decode_batch']} "
        f"({figure(s['free_prefill_per_decode_token'])}/decode token)"
        for s in summaries
    )
    ax.set_title(f"prefill tokens riding nearly free: {free}; paper: ~128 per decode token",
                 fontsize=8)  # fmt: skip
    ax.grid(True, alpha=0.3)
    extra = []
    if any(time_bounds(r) for r in rows):
        extra.append(Line2D([], [], color="black", lw=1, label=BARS_LABEL))
    if any(is_noisy(r) for r in rows):
        extra.append(Line2D([], [], marker="o", ls="", ms=10, mfc="none", mec="tab:red",
                            label=NOISY_LABEL))  # fmt: skip
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + extra, fontsize=7)


def _curve(ax, rows: list[dict], s: dict, color, several: bool) -> None:
    mine = [
        r for r in rows if (r["decode_batch"], r["context"]) == (s["decode_batch"], s["context"])
    ]
    p = [r["prefill_tokens"] for r in mine]
    tag = f"b={s['decode_batch']}, ctx {s['context']}" if several else f"{s['decode_batch']} seqs"
    times = [r["step_ms"] for r in mine]
    ax.plot(p, times, "o-", color=color, label=f"mixed step ({tag})")
    bounds = [time_bounds(r) for r in mine]
    if any(bounds):
        ax.errorbar(p, times, yerr=yerr(times, bounds), fmt="none", ecolor=color, capsize=3,
                    elinewidth=1)  # fmt: skip
    noisy = [(x, t) for x, t, r in zip(p, times, mine, strict=True) if is_noisy(r)]
    ring(ax, [x for x, _ in noisy], [t for _, t in noisy], label=None)
    ax.plot(p, [r["separate_ms"] for r in mine], "s--", color=color, alpha=0.5,
            label=f"decode + prefill alone ({tag})")  # fmt: skip
    base = s["decode_only_ms"]
    ax.axhline(base, color=color, lw=0.8)
    ax.axhspan(base, base * (1 + s["threshold"]), color=color, alpha=0.12,
               label=f"within {s['threshold']:.0%} of decode-only ({tag})")  # fmt: skip
    if s["free_prefill_tokens"]:
        ax.axvline(s["free_prefill_tokens"], color=color, ls=":", lw=1)


def _chunk_panel(ax, rows: list[dict]) -> None:
    if not rows:
        ax.set_visible(False)
        return
    labels = [str(r["chunk_tokens"]) for r in rows]
    ax.bar(labels, [r["over_one_prefill"] for r in rows], color="tab:purple", alpha=0.7)
    ax.axhline(1.0, color="black", lw=0.8)
    for i, r in enumerate(rows):
        ax.text(
            i,
            r["over_one_prefill"],
            f"{r['extra']:+.0%}",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("chunk size (tokens)")
    ax.set_ylabel("prefill time / one prefill")
    ax.set_title(f"a {rows[0]['prompt_tokens']:,}-token prompt in chunks", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)


def _tile_panel(ax, rows: list[dict]) -> None:
    if not rows:
        ax.set_visible(False)
        return
    labels = [str(r["chunk_tokens"]) for r in rows]
    ax.bar(labels, [r["total_ms"] for r in rows], color="tab:olive", alpha=0.7)
    for i, r in enumerate(rows):
        ax.text(i, r["total_ms"], f"{figure(r['total_ms'])} ms", ha="center", va="bottom",
                fontsize=8)
    ax.set_xlabel("prefill tokens in the step")
    ax.set_ylabel("step time (ms)")
    ax.set_title("tile effects (paper: 257 is 32% slower than 256)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
