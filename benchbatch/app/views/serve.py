"""serve-sweep in the terminal: each source's latency and throughput tables, the real
engine over its simulation, and the largest rate each policy sustains within the SLO."""

from __future__ import annotations

from benchbatch.output import render

LATENCY_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "p99",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p99_ms": "p99",
    "itl_p99_ms": "ITL p99 ms",
    "e2e_p50_s": "E2E p50",
    "slo": "SLO",
}
LOAD_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "request_throughput_rps": "req/s",
    "output_throughput_tps": "tok/s",
    "goodput_rps": "goodput",
    "occupancy_pct": "occupancy %",
    "mean_batch": "batch",
    "duration_s": "duration s",
}
VERSUS_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "duration_s": "duration",
    "output_throughput_tps": "tok/s",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "TTFT p99",
    "tpot_p50_s": "TPOT p50",
    "tpot_p99_s": "TPOT p99",
}
SLO_COLUMNS = {
    "policy": "policy",
    "source": "source",
    "sustained_rate": "sustains (req/s)",
    "goodput_rps": "goodput there",
    "leaves_slo_at": "leaves the SLO at",
}


def document(rec) -> dict:
    return {
        "step_cost": rec.meta.get("step_cost"),
        "real": rec.meta.get("real"),
        "rows": rec.rows("serve"),
        "slo": rec.rows("slo"),
        "sim_vs_real": rec.rows("sim_vs_real"),
    }


def show(rec) -> None:
    from benchbatch.experiments.ablation.probe import cost_line

    rows, slo, versus = rec.rows("serve"), rec.rows("slo"), rec.rows("sim_vs_real")
    render.out_console.print(cost_line(rec.meta["step_cost"]))
    for source, name in (("sim", "simulated"), ("real", "real engine")):
        mine = [_shown(r) for r in rows if r["source"] == source]
        if mine:
            n = f"{mine[0]['requests']:,} requests a point"
            render.table(mine, LATENCY_COLUMNS, f"{name}, {n}: latency (s unless ms)")
            render.table(mine, LOAD_COLUMNS, f"{name}: throughput, and what the slots did")
    if versus:
        title = "real engine over its simulation (the same requests at the same times)"
        render.table(_versus(versus), VERSUS_COLUMNS, title)
    render.table(slo, SLO_COLUMNS, "the largest rate each policy sustains within the SLO")
    for line in verdict_lines(slo):
        render.out_console.print(line, highlight=False)
    _warn_uncertain(rows)
    render.results_line(rec.folder)


def _shown(r: dict) -> dict:
    ms = {f"{k}_ms": 1e3 * r[f"{k}_s"] for k in ("tpot_p50", "tpot_p99", "itl_p99")}
    return {
        **ms,
        **r,
        "occupancy_pct": 100 * r["slot_occupancy"],
        "slo": "yes" if r["within_slo"] else "no",
    }


def _versus(rows: list[dict]) -> list[dict]:
    """sim_vs_real's ratios, one row per real point."""
    out: dict = {}
    for r in rows:
        key = (r["policy"], r["rate"])
        out.setdefault(key, {"policy": r["policy"], "rate": r["rate"]})
        out[key][r["metric"]] = f"x{r['measured_over_simulated']:.2f}"
    return list(out.values())


def verdict_lines(slo: list[dict]) -> list[str]:
    """Per source: the rate each policy sustains, continuous over static."""
    names = {"sim": "simulated", "real": "real engine", "sim-matched": "simulated, real workload"}
    lines = []
    for source, name in names.items():
        by = {r["policy"]: r for r in slo if r["source"] == source}
        if not by:
            continue
        parts = [f"{p} {_sustains(r)}" for p, r in by.items()]
        lines.append(f"{name}: within the SLO up to " + ", ".join(parts))
    return lines


def _sustains(r: dict) -> str:
    if r["sustained_rate"] is None:
        return f"no rate (leaves at {r['leaves_slo_at']})"
    if r["leaves_slo_at"] is None:
        return f"every rate ({r['sustained_rate']} included)"
    return f"{r['sustained_rate']} req/s"


def _warn_uncertain(rows: list[dict]) -> None:
    from benchbatch.core.serving import P99_MIN_REQUESTS

    few = sorted({r["requests"] for r in rows if r["p99_uncertain"]})
    if few:
        render.warning(
            f"points of {', '.join(f'{n:,}' for n in few)} requests: a p99 over fewer than "
            f"{P99_MIN_REQUESTS} requests is about their largest value, so it is uncertain "
            "(MLPerf asks for far more); raise --real-requests or --requests to firm it up"
        )
