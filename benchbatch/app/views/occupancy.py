"""occupancy in the terminal: the simulated policies (and their spread over seeds), the
memory policies on one KV budget, and with --engine real the model's runs beside them."""

from __future__ import annotations

from benchbatch.core.units import figure
from benchbatch.output import render

SIM_COLUMNS = {
    "policy": "policy",
    "total_steps": "steps",
    "useful_slot_steps": "useful slot-steps",
    "idle_slot_steps": "idle slot-steps",
    "occupancy_pct": "occupancy %",
    "speedup_vs_static": "speedup",
}
SEED_COLUMNS = {
    "policy": "policy",
    "seeds": "seeds",
    "steps": "steps mean (min-max)",
    "occupancy": "occupancy % mean (min-max)",
    "speedup": "speedup mean (min-max)",
}
ENGINE_COLUMNS = {
    "policy": "policy",
    "total_steps": "steps",
    "wall_s": "wall s",
    "tokens_per_s": "tok/s",
    "occupancy_pct": "occupancy %",
    "sim_s": "steps x med s",
    "measured_over_sim": "wall/that",
    "overhead_pct": "overhead %",
}
ENGINE_TITLE = (
    "real engine (steps x med s: the simulated steps at this run's median step{})"
)
PREDICTION_BELOW = "; the calibrated prediction is below"
MEMORY_COLUMNS = {  # running sequences, slot occupancy, mean KV memory, preemptions, steps
    "policy": "policy",
    "peak_running": "peak",
    "mean_running": "mean",
    "slot_occupancy_pct": "slots%",
    "reserved": "resv",
    "used": "used",
    "fragmentation_pct": "frag%",
    "preemptions": "preempt",
    "total_steps": "steps",
}
LATENCY_COLUMNS = {
    "policy": "policy",
    "e2e_mean_s": "latency mean",
    "e2e_p50_s": "p50",
    "e2e_p99_s": "p99",
    "ttft_mean_s": "TTFT mean",
    "ttft_p50_s": "p50",
    "ttft_p99_s": "p99",
}


def document(rec) -> dict:
    doc = {"summary": rec.meta.get("summary", {}), "rows": rec.rows("occupancy")}
    spread, memory, engine = rec.rows("occupancy_seeds"), rec.rows("memory"), rec.rows("engine")
    if spread:
        doc["seeds"] = spread
    if memory:
        doc |= {"memory": memory, "memory_summary": rec.meta.get("memory", {})}
    if engine:
        doc |= {"engine": engine, "engine_summary": rec.meta.get("engine_summary", {})}
    if rec.rows("memory_engine"):
        doc["memory_engine"] = rec.rows("memory_engine")
    return doc


def show(rec) -> None:
    rows, spread, engine = rec.rows("occupancy"), rec.rows("occupancy_seeds"), rec.rows("engine")
    summary, memory = rec.meta.get("summary", {}), rec.rows("memory")
    first = rows[:2]
    render.table([{**r, "occupancy_pct": 100 * r["occupancy"]} for r in first], SIM_COLUMNS,
                 "simulated")  # fmt: skip
    render.out_console.print(
        f"continuous batching: {summary['speedup']:.2f}x fewer steps "
        f"(static {summary['static_occupancy']:.1%}, "
        f"continuous {summary['continuous_occupancy']:.1%} occupancy)"
    )
    if spread:
        render.table([_spread_display(r) for r in spread], SEED_COLUMNS, "over seeds")
        render.out_console.print(_spread_line(spread))
    if memory:  # of the first seed's requests where there are several
        seed = (rec.meta.get("options") or {}).get("seed")
        how = f"simulated, seed {seed}" if spread and seed is not None else "simulated"
        _memory_report(memory, rec.meta.get("memory", {}), how)
    if rec.meta.get("step_cost") and not engine:  # --step-costs: what priced the time
        from benchbatch.core.calibration_text import step_cost_line

        render.out_console.print(step_cost_line(rec.meta["step_cost"]), highlight=False)
    if rec.rows("memory_engine"):
        _memory_report(rec.rows("memory_engine"), None, "real engine, paged cache of the budget")
    if engine:
        shown = [_engine_display(r) for r in engine]
        predicted = bool((rec.meta.get("prediction") or {}).get("verdict"))
        render.table(shown, ENGINE_COLUMNS,
                     ENGINE_TITLE.format(PREDICTION_BELOW if predicted else ""))  # fmt: skip
        render.table(shown, LATENCY_COLUMNS,
                     "real engine: request latency and time to first token (s)")  # fmt: skip
        line = _engine_line(rec.meta.get("engine_summary", {}), predicted)
        if line:
            render.out_console.print(line)
        _collectives_line(rec.meta.get("collectives"))
        if rec.meta.get("step_cost"):  # the fit the policies were simulated on
            from benchbatch.core.calibration_text import step_cost_line

            render.out_console.print(step_cost_line(rec.meta["step_cost"]), highlight=False)
        if (rec.meta.get("prediction") or {}).get("verdict"):
            render.out_console.print(rec.meta["prediction"]["verdict"], highlight=False)
    render.results_line(rec)


def _memory_report(rows: list[dict], meta: dict | None, how: str) -> None:
    gib = rows[0].get("kv_budget_gib") is not None
    unit = "GiB" if gib else "tokens"
    title = (f"memory policies ({how}): running sequences; slots%: of the slots the KV "
             f"budget reserves (longest prompt + maximum output each); mean KV memory "
             f"reserved, used ({unit})")  # fmt: skip
    render.table([_memory_display(r, gib) for r in rows], MEMORY_COLUMNS, title)
    if rows[0]["time_unit"] == "s":  # priced by a fitted step cost, or measured
        times = ", ".join(f"{r['policy']} {render.fmt(r['total_time'])} s" for r in rows)
        basis = "measured" if "wall_s" in rows[0] else "fitted step cost"
        render.out_console.print(f"time ({basis}): {times}", highlight=False)
    if meta:
        render.out_console.print(
            f"on one KV budget ({meta['budget']}): paged blocks ran "
            f"{figure(meta['paged_mean_running'])} sequences at once on average (peak "
            f"{meta['paged_peak_running']:,}) against {figure(meta['reserve_mean_running'])} "
            f"(peak {meta['reserve_peak_running']:,}) reserving prompt + maximum output; "
            f"{meta['reserve_fragmentation']:.0%} of the reserved memory was never written, "
            f"{meta['paged_fragmentation']:.1%} of the paged; {meta['preemptions']:,} "
            "preemptions",
            highlight=False,
        )


def _memory_display(r: dict, gib: bool) -> dict:
    unit = "_gib" if gib else "_tokens"
    occupancy = r.get("slot_occupancy")
    return {
        **r,
        "slot_occupancy_pct": 100 * occupancy if occupancy is not None else None,
        "reserved": r["kv_reserved_mean" + unit],
        "used": r["kv_used_mean" + unit],
        "fragmentation_pct": 100 * r["fragmentation"],
    }


def _spread_display(r: dict) -> dict:
    def span(key: str, scale: float = 1.0, digits: int = 0) -> str:
        lo, mean, hi = (scale * r[f"{key}_{s}"] for s in ("min", "mean", "max"))
        return f"{mean:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"

    return {
        "policy": r["policy"],
        "seeds": r["seeds"],
        "steps": span("total_steps"),
        "occupancy": span("occupancy", 100, 1),
        "speedup": span("speedup_vs_static", 1, 2),
    }


def _spread_line(spread: list[dict]) -> str:
    by = {r["policy"]: r for r in spread}
    s, cont = by["static"], by["continuous"]
    return (
        f"over {s['seeds']} seeds: continuous batching {cont['speedup_vs_static_mean']:.2f}x "
        f"fewer steps ({cont['speedup_vs_static_min']:.2f}-{cont['speedup_vs_static_max']:.2f}x); "
        f"static {s['occupancy_mean']:.1%} ({s['occupancy_min']:.1%}-{s['occupancy_max']:.1%}), "
        f"continuous {cont['occupancy_mean']:.1%} "
        f"({cont['occupancy_min']:.1%}-{cont['occupancy_max']:.1%}) occupancy"
    )


def _collectives_line(c: dict | None) -> None:
    if c and c.get("allreduce_ms") is not None:
        render.out_console.print(
            f"tensor-parallel over {c['tp']} ranks: a decode step of {c['batch']} sequences at "
            f"context {c['context']:,} took {figure(c['step_ms'])} ms, its all-reduces "
            f"{figure(c['allreduce_ms'])} ms on their own ({c['allreduce_share']:.0%}; "
            "collectives.csv)"
        )


def _engine_display(r: dict) -> dict:
    return {**r, "occupancy_pct": 100 * r["occupancy"], "overhead_pct": 100 * r["overhead"]}


def _engine_line(s: dict, predicted: bool = False) -> str | None:
    if not s:
        return None
    noise = ""
    if s.get("same_work"):  # the same steps at the same occupancy: only the device differed
        noise = ("; both runs did the same work (the same steps at the same occupancy): the "
                 "wall time's difference is the device's speed while each ran, not batching")
    below = " (not the calibrated prediction below)" if predicted else ""
    return (
        f"real engine: continuous batching {s['wall_speedup']:.2f}x faster in wall time "
        f"(simulated: {_fewer(s['sim_speedup'])}{noise}); wall time over the "
        f"simulated steps at this run's median step{below}: "
        f"static {s['static_measured_over_sim']:.2f}, continuous "
        f"{s['continuous_measured_over_sim']:.2f}; scheduling overhead "
        f"{s['continuous_overhead']:.1%} of a continuous step"
    )


def _fewer(ratio: float) -> str:
    """Static's steps over continuous's, in words ("the same steps" at 1)."""
    return "the same steps" if abs(ratio - 1) < 0.005 else f"{ratio:.2f}x fewer steps"
