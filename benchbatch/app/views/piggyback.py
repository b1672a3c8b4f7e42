"""piggyback in the terminal: prefill riding on decode, each decode batch's summary, the
chunked prompt and the tile effects."""

from __future__ import annotations

import math

from benchbatch.core.units import figure
from benchbatch.output import render

COLUMNS = {
    "decode_batch": "decode b",
    "context": "ctx",
    "prefill_tokens": "prefill tokens",
    "step_ms": "mixed ms",
    "over_decode": "x decode-only",
    "prefill_alone_ms": "prefill alone ms",
    "saved_ms": "saved ms",
    "extra_us_per_prefill_token": "us/extra token",
}
CHUNK_COLUMNS = {
    "chunk_tokens": "chunk",
    "chunks": "chunks",
    "total_ms": "total ms",
    "over_one_prefill": "x one prefill",
    "extra_pct": "extra %",  # chunks.csv keeps the fraction (extra)
}
TILE_COLUMNS = {
    "chunk_tokens": "tokens",
    "total_ms": "step ms",
    "ms_per_token": "ms/token",
    "over_previous": "x previous",
}


def document(rec) -> dict:
    return {
        "summary": rec.meta.get("summary"),  # None: interrupted before it
        "piggyback": rec.rows("piggyback"),
        "chunks": rec.rows("chunks"),
    }


def show(rec) -> None:
    rows, chunk_rows, summaries = rec.rows("piggyback"), rec.rows("chunks"), rec.meta["summary"]
    render.table(rows, COLUMNS, "prefill chunks riding on a decode step (one forward)")
    for s in summaries:
        render.out_console.print(_summary_line(s))
    chunked = [r for r in chunk_rows if r["kind"] == "chunked"]
    tiles = [r for r in chunk_rows if r["kind"] == "tile"]
    if chunked:
        chunked = [{**r, "extra_pct": 100 * r["extra"]} for r in chunked]
        render.table(
            chunked,
            CHUNK_COLUMNS,
            f"a {chunked[0]['prompt_tokens']:,}-token prompt prefilled in chunks (each re-reads "
            "the weights and the earlier chunks' KV)",
        )
    if tiles:
        render.table(tiles, TILE_COLUMNS, "tile effects: one prefill step of each length")
    render.warn_untrusted(rec.meta["untrusted"], render.run_threads(rec.meta))
    if rec.meta.get("ceilings_source"):
        render.line(f"ceilings (mfu, mbu, bound): {rec.meta['ceilings_source']}")
    render.results_line(rec)


def _summary_line(s: dict) -> str:
    head = (
        f"decode b={s['decode_batch']} at context {s['context']:,} "
        f"({figure(s['decode_only_ms'])} ms): {s['free_prefill_tokens']} prefill tokens ride "
        f"within {s['threshold']:.0%} ({figure(s['free_prefill_per_decode_token'])} per decode "
        "token); "
    )
    if not math.isfinite(s["prefill_tokens_per_decode_step"]):  # the largest rode for nothing
        return head + (
            f"{s['largest_prefill_tokens']} riding made the step no slower, so what a decode "
            "step is worth in prefill tokens is not measurable here (larger --piggyback-tokens "
            "would show it)."
        )
    return head + (
        f"at the average cost of a prefill token when {s['largest_prefill_tokens']} ride, the "
        f"decode step costs as much as {s['prefill_tokens_per_decode_step']:.0f} prefill "
        f"tokens: {figure(s['prefill_tokens_per_decode_token'])} per decode token (the "
        f"paper's linear layers: about {s['paper_prefill_per_decode_token']})."
    )
