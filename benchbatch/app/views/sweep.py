"""sweep in the terminal: the memory ceiling, the steps' table and each context's knee."""

from __future__ import annotations

from benchbatch.core import energy
from benchbatch.core.noise import summary_range
from benchbatch.core.units import figure
from benchbatch.output import render
from benchbatch.output.render import fmt

# Short headers: nine columns fit an 80-column terminal (the CSV has every column, the KV
# cache's bytes too).
COLUMNS = {
    "context": "ctx",
    "batch": "batch",
    "step_ms": "step ms",
    "spread_ms": "p10-p90",
    "tokens_per_s": "tok/s",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "arithmetic_intensity": "FLOP/B",
    "status": "status",
}


def document(rec) -> dict:
    return {
        "summary": rec.meta.get("summary", []),
        "rows": rec.rows("sweep"),
        "memory_ceiling": rec.meta.get("memory_ceiling"),
    }


def show(rec) -> None:
    _print_ceiling(rec)
    for line in ceiling_lines(rec.meta["memory_ceiling"]):
        render.out_console.print(line, highlight=False)
    rows, summary = rec.rows("sweep"), rec.meta.get("summary", [])
    tp = any(r.get("tp", 1) > 1 for r in rows)  # KV MiB and all-reduce share: one rank's
    shown = [
        {**r, "kv_cache_mib": r["kv_cache_bytes"] / 2**20,
         "allreduce_pct": 100 * r.get("allreduce_share", float("nan"))}
        for r in rows
    ]  # fmt: skip
    shown, columns = render.with_flop_unit(
        shown, {**COLUMNS, "allreduce_pct": "AR%"} if tp else COLUMNS
    )
    title = "decode step vs batch size (step ms: median of the repeats, each user's wait)"
    render.table(shown, columns, title + (" (per rank)" if tp else ""))
    for s in summary:
        for line in _summary_lines(s):
            render.out_console.print(line)
    for line in energy.summary_lines(rows, name=lambda r: f"ctx {r['context']} b={r['batch']}"):
        render.out_console.print(line, highlight=False)  # energy and cost, or "not available"
    render.warn_untrusted(rec.meta["untrusted"], render.run_threads(rec.meta))
    if rec.meta.get("ceilings_source"):
        render.line(f"ceilings (mfu, mbu, bound): {rec.meta['ceilings_source']}")
    render.results_line(rec)


def ceiling_lines(rows: list[dict]) -> list[str]:
    """One line per memory: sequences reserved at the maximum length against paged."""
    from benchbatch.core.kvceiling import reservation_text

    lines = []
    for r in rows:
        gain = f" (x{figure(r['paging_gain'])})" if r["paging_gain"] else ""
        lines.append(
            f"memory ceiling for the workload's lengths on {r['where']}, "
            f"{fmt(r['memory_bytes'] / 2**30)} GiB: {r['reserved_sequences']:,} sequences "
            f"reserving {reservation_text(r)} each, {r['paged_sequences']:,} paged "
            f"in blocks of {r['block_size']} at the {fmt(r['paged_mean_tokens'])} tokens they "
            f"reach on average{gain}."
        )
    return lines


def _print_ceiling(rec) -> None:
    """The largest batch of each context on the free memory read before the model."""
    target, free_bytes = rec.target, rec.meta["free_memory_bytes_before_model"]
    ceiling = {int(k): v for k, v in rec.meta["predicted_max_batch"].items()}
    where = "free GPU memory" if target.device.type == "cuda" else "available RAM"
    fits = ", ".join(f"context {k:,}: {v:,}" for k, v in ceiling.items())
    over = "tried anyway (--try-oom)" if rec.meta["options"]["try_oom"] else "skipped"
    held = "weights, KV cache and workspace"
    if target.tp > 1:
        where += (f" on each of {target.tp} ranks" if target.device.type == "cuda" else
                  f" for each of {target.tp} ranks (their share of the machine's)")  # fmt: skip
        held = "each rank's shard of the weights and KV cache, and workspace"
    render.out_console.print(
        f"memory ceiling from {fmt(free_bytes / 2**30)} GiB {where} ({held}, 10% held "
        f"back): largest batch {fits}; batches above it are {over}."
    )


def _summary_lines(s: dict) -> list[str]:
    head = f"context {s['context']:,}:"
    if "batch_from" not in s:
        counts = s.get("statuses") or {}
        ok = counts.get("ok", 0)
        why = {"skipped": "skipped over the memory ceiling: --try-oom tries them",
               "oom": "out of memory"}  # fmt: skip
        rest = "; ".join(f"{n:,} {why.get(k, k)}" for k, n in counts.items() if k != "ok" and n)
        said = {0: "no batch measured", 1: "one batch measured"}.get(ok, f"{ok} measured")
        return [f"{head} {said}{f' ({rest})' if rest else ''}: no claim to check (it "
                "compares two batches)."]
    threshold = f"{s['knee_threshold']:.0%}"
    knee = s["measured_knee"]
    measured = f"none (step never grew over {threshold})"
    if knee is not None:
        measured = f"batch {knee:,} (step x{s['measured_knee_step_ratio']:.2f})"
    lines = [
        f"{head} batch {s['batch_from']:,} -> {s['batch_to']:,}: throughput "
        f"x{s['throughput_ratio']:.1f}{summary_range(s, 'throughput_ratio')}, step latency "
        f"x{s['step_latency_ratio']:.2f}{summary_range(s, 'step_latency_ratio')}",
        f"  knee (step time > batch {s['batch_from']:,} + {threshold}): {measured}; "
        f"roofline: {s['predicted_knee_note']}",
    ]
    if s["matmul_knee"] is not None:
        lines[-1] += f"; weight matmuls alone reach the ridge at batch {s['matmul_knee']:,}"
    if s["best_batch"] != s["batch_to"]:
        lines.append(
            f"  highest throughput at batch {s['best_batch']:,} "
            f"({fmt(s['best_tokens_per_s'])} tok/s), not at the largest batch"
        )
    return lines
