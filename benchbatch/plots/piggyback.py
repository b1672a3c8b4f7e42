"""The piggyback figure: a decode step with prefill tokens riding along, the price of chunking
a long prompt, and tile effects."""

from __future__ import annotations

from pathlib import Path

from matplotlib import ticker

from benchbatch.plots import plt, save


def piggyback_figure(
    rows: list[dict], chunk_rows: list[dict], summary: dict, path: Path, title: str
) -> None:
    """Left: the mixed step against the decode-only step (and the threshold band) and against
    decode and prefill run apart. Middle: a long prompt prefilled in chunks, over one prefill.
    Right: one prefill step per length (e.g. 256 against 257)."""
    fig, (mixed, chunked, tiles) = plt.subplots(
        1, 3, figsize=(15, 4.4), gridspec_kw={"width_ratios": [2, 1.3, 0.8]}
    )
    _mixed_panel(mixed, rows, summary)
    _chunk_panel(chunked, [r for r in chunk_rows if r["kind"] == "chunked"])
    _tile_panel(tiles, [r for r in chunk_rows if r["kind"] == "tile"])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def _mixed_panel(ax, rows: list[dict], s: dict) -> None:
    p = [r["prefill_tokens"] for r in rows]
    base = s["decode_only_ms"]
    ax.plot(
        p, [r["step_ms"] for r in rows], "o-", color="tab:blue", label="mixed step (one forward)"
    )
    ax.plot(
        p,
        [r["separate_ms"] for r in rows],
        "s--",
        color="tab:gray",
        label="decode step + prefill alone",
    )
    ax.axhline(base, color="black", lw=0.8, label=f"decode-only ({s['decode_batch']} seqs)")
    ax.axhspan(
        base,
        base * (1 + s["threshold"]),
        color="tab:green",
        alpha=0.15,
        label=f"within {s['threshold']:.0%}",
    )
    if s["free_prefill_tokens"]:
        ax.axvline(s["free_prefill_tokens"], color="tab:green", ls=":", lw=1)
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlim(left=0)
    ax.set_xticks(p, [str(x) for x in p])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("prefill tokens riding on the decode step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(
        f"{s['free_prefill_tokens']} prefill tokens ride nearly free "
        f"({s['free_prefill_per_decode_token']:.3g} per decode token; paper: ~128)",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


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
            f"{r['extra_pct']:+.0f}%",
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
        ax.text(i, r["total_ms"], f"{r['total_ms']:.3g} ms", ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("prefill tokens in the step")
    ax.set_ylabel("step time (ms)")
    ax.set_title("tile effects (paper: 257 is 32% slower than 256)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
