"""`benchbatch piggyback`: prefill tokens riding on a decode step, and the price of chunks."""

from __future__ import annotations

from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.experiments.piggyback.options import PiggybackOptions
from benchbatch.output.recorder import NOT_TRUSTED


def open_run(opts: PiggybackOptions, model: ModelOptions, run: RunOptions):
    from benchbatch.experiments import common as c

    return c.open_model_run("piggyback", model, run, opts, check=opts.check)


def measure_run(rec, opts: PiggybackOptions, model: ModelOptions, run: RunOptions) -> None:
    """steps.csv as each forward is timed, then piggyback.csv and chunks.csv from them, the
    summaries in metadata and piggyback.png."""
    from benchbatch.experiments import ceilings as roofs
    from benchbatch.experiments import common as c
    from benchbatch.experiments.piggyback import probe
    from benchbatch.output.plots.piggyback import piggyback_figure

    rec.note(opts.whole_chunks())
    roofs.use_ceilings(rec, run)
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
        roofs.roofline_plot(rec, raw, "piggyback", c.title(rec, "roofline", raw))


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
