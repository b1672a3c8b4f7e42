"""`benchbatch piggyback`: prefill tokens riding on a decode step, and the price of chunks."""

from __future__ import annotations

from benchbatch.core.options import ModelOptions, RunOptions, use
from benchbatch.experiments import common as c
from benchbatch.experiments.piggyback.options import PiggybackOptions
from benchbatch.output import render
from benchbatch.output.recorder import NOT_TRUSTED

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


@command(PiggybackOptions, ModelOptions, use(RunOptions, skip=("tp",)))
def piggyback(opts: PiggybackOptions, model: ModelOptions, run: RunOptions) -> None:
    """How many prefill tokens ride nearly free on a decode step, and what chunking costs.

    A decode step reads every weight for one token per sequence; prefill tokens added to
    the same forward (Sarathi-Serve's piggybacking) use the idle arithmetic. The paper puts
    it at about 128 prefill tokens per decode token in linear layers. The chunk sweep times
    a long prompt prefilled in chunks (each re-reads the weights and the earlier chunks' KV)
    against one prefill; the tile rows compare e.g. 256 with 257 tokens (the paper: 32%
    slower). Default model: article on CUDA, cpu-small on CPU.
    """
    from benchbatch.experiments.piggyback import probe
    from benchbatch.output.plots.piggyback import piggyback_figure

    rec = c.open_model_run("piggyback", model, run, opts, check=opts.check)
    with rec:
        c.use_ceilings(rec, run)
        net, cfg = c.build_model(rec, model, run)
        steps = probe.rows(net, opts, run.timing(), run.cuda_graphs)
        raw = rec.record("steps", steps, total=len(probe.plan(opts)), label="piggyback")
        rows = probe.piggyback_rows(raw)
        rec.put("piggyback", rows)
        chunks = probe.chunk_rows(raw, cfg, rec.target.dtype_name) + probe.tile_rows(raw)
        rec.put("chunks", chunks)
        rec.meta["summary"] = probe.summaries(rows, opts.threshold)
        rec.meta["untrusted"] = _untrusted(rows, chunks)
        piggyback_figure(rows, chunks, rec.meta["summary"], rec.folder / "piggyback.png",
                         c.title(rec, "prefill riding on decode", raw))  # fmt: skip
        if rec.ceilings and any(r["status"] == "ok" for r in raw):
            c.roofline_plot(rec, raw, "piggyback", c.title(rec, "roofline", raw))
    _report(rec, run.json_out)


def _untrusted(rows: list[dict], chunk_rows: list[dict]) -> dict[str, list[str]]:
    """Noisy and throttled rows of both tables, by the names the terminal shows."""
    named = [(_row_name(r), r) for r in rows] + [(_chunk_name(r), r) for r in chunk_rows]
    return {flag: [n for n, r in named if r.get(flag) is True] for flag in NOT_TRUSTED}


def _row_name(r: dict) -> str:
    b, p = r["decode_batch"], r["prefill_tokens"]
    return f"decode b={b} + prefill {p}" if p else f"decode-only b={b}"


def _chunk_name(r: dict) -> str:
    if r["kind"] == "tile":
        return f"tile {r['chunk_tokens']}"
    return f"{r['prompt_tokens']}-token prompt in chunks of {r['chunk_tokens']}"


def _report(rec, json_out: bool) -> None:
    rows, chunk_rows, summaries = rec.rows("piggyback"), rec.rows("chunks"), rec.meta["summary"]
    if json_out:
        return c.report_json(rec, summary=summaries, piggyback=rows, chunks=chunk_rows)
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
    render.warn_untrusted(rec.meta["untrusted"])
    render.results_line(rec.folder)


def _summary_line(s: dict) -> str:
    return (
        f"decode b={s['decode_batch']} at context {s['context']:,} "
        f"({s['decode_only_ms']:.3g} ms): {s['free_prefill_tokens']} prefill tokens ride within "
        f"{s['threshold']:.0%} ({s['free_prefill_per_decode_token']:.3g} per decode token); at "
        f"the marginal cost of a prefill token ({s['largest_prefill_tokens']} riding) the decode "
        f"step costs as much as {s['prefill_tokens_per_decode_step']:.0f} prefill tokens: "
        f"{s['prefill_tokens_per_decode_token']:.3g} per decode token (the paper's linear "
        f"layers: about {s['paper_prefill_per_decode_token']})."
    )
