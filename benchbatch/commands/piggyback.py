"""`benchbatch piggyback`: prefill tokens riding on a decode step, and the price of chunks."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box

from benchbatch import results
from benchbatch.commands import common as c
from benchbatch.commands.render import rows_table
from benchbatch.device import device_name
from benchbatch.engines.model import Transformer
from benchbatch.errors import UserError
from benchbatch.plots.piggyback import piggyback_figure
from benchbatch.probes import piggyback as probe

COLUMNS = {
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
    "extra_pct": "extra %",
}
TILE_COLUMNS = {
    "chunk_tokens": "tokens",
    "total_ms": "step ms",
    "ms_per_token": "ms/token",
    "over_previous": "x previous",
}


def piggyback(
    decode_batch: Annotated[
        int, typer.Option(help="Sequences decoding in the step the prefill rides on.")
    ] = 16,
    context: Annotated[
        int, typer.Option(help="Tokens already in each decoding sequence's KV cache.")
    ] = 512,
    prefill: Annotated[
        str,
        typer.Option(help="Prefill tokens added to the decode step, comma-separated (0 added)."),
    ] = "16,32,64,128,256,512",
    threshold: Annotated[
        float,
        typer.Option(
            help="A mixed step within this fraction of the decode-only step (0.1: 10%) counts "
            "as carrying its prefill tokens nearly free."
        ),
    ] = probe.DEFAULT_THRESHOLD,
    chunk_prompt: Annotated[
        int, typer.Option(help="Prompt tokens prefilled in chunks for the chunk-size sweep.")
    ] = 2048,
    chunks: Annotated[
        str,
        typer.Option(help="Chunk sizes, comma-separated (one prefill of the prompt is added)."),
    ] = "128,256,512,2048",
    tiles: Annotated[
        str,
        typer.Option(help="Prefill step lengths that show tile effects, comma-separated."),
    ] = "256,257",
    preset: c.PresetOpt = None,
    config: c.ConfigOpt = None,
    hidden: c.HiddenOpt = None,
    layers: c.LayersOpt = None,
    heads: c.HeadsOpt = None,
    kv_heads: c.KvHeadsOpt = None,
    intermediate: c.IntermediateOpt = None,
    vocab: c.VocabOpt = None,
    max_context: c.MaxContextOpt = None,
    seed: c.SeedOpt = 0,
    device: c.DeviceOpt = "auto",
    dtype: c.DtypeOpt = None,
    repeats: c.RepeatsOpt = 5,
    min_time: c.MinTimeOpt = 0.2,
    cuda_graphs: Annotated[
        bool,
        typer.Option(
            "--cuda-graphs/--no-cuda-graphs",
            help="Replay the decode-only and mixed steps from CUDA graphs (launch overhead "
            "must not hide the GPU work). Off by default: the engine runs eagerly.",
            rich_help_panel=c.RUN,
        ),
    ] = False,
    out: c.OutOpt = None,
    force: c.ForceOpt = False,
    json_out: c.JsonOpt = False,
) -> None:
    """How many prefill tokens ride nearly free on a decode step, and what chunking costs.

    A decode step reads every weight for one token per sequence; prefill tokens added to
    the same forward (Sarathi-Serve's piggybacking) use the idle arithmetic. The paper puts
    it at about 128 prefill tokens per decode token in linear layers. The chunk sweep times
    a long prompt prefilled in chunks (each re-reads the weights and the earlier chunks' KV)
    against one prefill; the tile rows compare e.g. 256 with 257 tokens (the paper: 32%
    slower). Default preset: article on CUDA, cpu-small on CPU.
    """
    if decode_batch < 1:
        raise UserError("--decode-batch", f"must be at least 1, got {decode_batch}")
    if context < 0:
        raise UserError("--context", f"must be zero or more tokens, got {context}")
    if threshold < 0:
        raise UserError("--threshold", f"must not be negative, got {threshold}")
    prefills = c.parse_int_list(prefill, "--prefill")
    chunk_sizes = c.parse_int_list(chunks, "--chunks")
    tile_sizes = c.parse_int_list(tiles, "--tiles")
    opts = c.timing_options(repeats, min_time)
    target = c.resolve_target(device, dtype)
    model_opts = dict(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
        max_context=max_context,
    )
    cfg, notes = _model_config(preset, config, target, model_opts)
    _check_lengths(cfg.max_context, context, prefills, chunk_prompt, tile_sizes)
    c.check_model_fits(cfg, target, c.model_option(preset, config, model_opts))
    folder = results.run_dir(out, "piggyback", force)
    for note in notes:  # every input is checked: a user error stays a single line
        c.err_console.print(f"[yellow]note:[/] {note}")
    options = dict(
        decode_batch=decode_batch,
        context=context,
        prefill=prefills,
        threshold=threshold,
        chunk_prompt=chunk_prompt,
        chunks=chunk_sizes,
        tiles=tile_sizes,
        repeats=repeats,
        min_time=min_time,
        cuda_graphs=cuda_graphs,
        seed=seed,
    )
    run = c.start_run(folder, "piggyback", target, cfg, options)
    with c.recording(run, target):
        model = Transformer(cfg, target.device, target.dtype, seed)
        plan = probe.piggyback_plan(decode_batch, context, prefills)
        total = len(plan) + len({min(x, chunk_prompt) for x in chunk_sizes} | {chunk_prompt})
        with c.progress(json_out) as bar, c.throttle_watch(target) as watch:
            task = bar.add_task("piggyback", total=total + len(tile_sizes))
            step = lambda: bar.advance(task)  # noqa: E731
            rows = probe.run_piggyback(model, plan, opts, cuda_graphs, step, watch)
            run.put("piggyback", rows)
            chunk_rows = probe.run_chunks(
                model, target.dtype_name, chunk_prompt, chunk_sizes, opts, step, watch
            )
            chunk_rows += probe.run_tiles(model, tile_sizes, opts, step, watch)
            run.put("chunks", chunk_rows)
        run.meta["summary"] = probe.piggyback_summary(rows, threshold)
        run.meta["untrusted"] = _untrusted(rows, chunk_rows)
        piggyback_figure(
            rows, chunk_rows, run.meta["summary"], folder / "piggyback.png", _title(cfg, target)
        )
    _report(run, json_out)


def _untrusted(rows: list[dict], chunk_rows: list[dict]) -> dict[str, list[str]]:
    """Noisy and throttled rows of both tables, by the names the terminal shows."""
    mine, chunks = c.untrusted(rows, _row_name), c.untrusted(chunk_rows, _chunk_name)
    return {flag: mine[flag] + chunks[flag] for flag in mine}


def _row_name(r: dict) -> str:
    b, p = r["decode_batch"], r["prefill_tokens"]
    return f"decode b={b} + prefill {p}" if p else f"decode-only b={b}"


def _chunk_name(r: dict) -> str:
    if r["kind"] == "tile":
        return f"tile {r['chunk_tokens']}"
    return f"{r['prompt_tokens']}-token prompt in chunks of {r['chunk_tokens']}"


def _model_config(preset, config, target, overrides: dict):
    """The model's shape, and a note when the device chose the preset."""
    default = "article" if target.device.type == "cuda" else "cpu-small"
    notes = []
    if preset is None and config is None:
        notes.append(
            f"using the {default} preset, the default on "
            f"{'CUDA' if default == 'article' else 'CPU'}; pass --preset or --config to change it"
        )
    return c.build_config(preset, config, default=default, **overrides), notes


def _check_lengths(max_context, context, prefills, chunk_prompt, tiles) -> None:
    if chunk_prompt < 1:
        raise UserError("--chunk-prompt", f"must be at least 1, got {chunk_prompt}")
    for option, n in (
        ("--context", context + 1),
        ("--prefill", prefills[-1]),
        ("--chunk-prompt", chunk_prompt),
        ("--tiles", tiles[-1]),
    ):
        if n > max_context:
            raise UserError(option, f"{n} tokens exceed --max-context {max_context}")


def _title(cfg, target) -> str:
    return (
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {target.dtype_name}, "
        f"{device_name(target.device)}"
    )


def _report(run, json_out: bool) -> None:
    rows, chunk_rows, s = run.rows("piggyback"), run.rows("chunks"), run.meta["summary"]
    if json_out:
        c.print_json(
            {"folder": str(run.folder), "summary": s, "piggyback": rows, "chunks": chunk_rows}
        )
        return
    b = s["decode_batch"]
    _table(
        rows,
        COLUMNS,
        f"a prefill chunk riding on a decode step of {b} sequences "
        f"(decode-only {s['decode_only_ms']:.3g} ms)",
    )
    c.out_console.print(
        f"{s['free_prefill_tokens']} prefill tokens ride within {s['threshold']:.0%} of the "
        f"decode-only step ({s['free_prefill_per_decode_token']:.3g} per decode token). At the "
        f"marginal cost of a prefill token ({s['largest_prefill_tokens']} riding), the decode "
        f"step costs as much as {s['prefill_tokens_per_decode_step']:.0f} prefill tokens: "
        f"{s['prefill_tokens_per_decode_token']:.3g} per decode token (the paper's linear "
        f"layers: about {s['paper_prefill_per_decode_token']})."
    )
    chunked = [r for r in chunk_rows if r["kind"] == "chunked"]
    tiles = [r for r in chunk_rows if r["kind"] == "tile"]
    _table(
        chunked,
        CHUNK_COLUMNS,
        f"a {chunked[0]['prompt_tokens']:,}-token prompt prefilled "
        "in chunks (each re-reads the weights and the earlier chunks' KV)",
    )
    if tiles:
        _table(tiles, TILE_COLUMNS, "tile effects: one prefill step of each length")
    c.warn_untrusted(run.meta["untrusted"])
    c.out_console.print(f"results: {run.folder}")


def _table(rows: list[dict], columns: dict[str, str], title: str) -> None:
    table = rows_table(rows, columns, title=title)
    table.box, table.pad_edge = box.SIMPLE_HEAD, False
    c.out_console.print(table)
