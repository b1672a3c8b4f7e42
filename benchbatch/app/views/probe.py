"""probe in the terminal: the probes' table, the all-reduce's, and the ceilings measured
beside every datasheet benchbatch knows."""

from __future__ import annotations

from rich.table import Table

from benchbatch.output import render
from benchbatch.output.render import fmt

COLUMNS = {
    "label": "probe",
    "step_ms": "ms",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "arithmetic_intensity": "FLOP/B",
    "cv": "CV",
    "status": "status",
}
LINK_COLUMNS = {
    "label": "message",
    "ranks": "ranks",
    "step_ms": "ms",
    "algbw_gbps": "algbw GB/s",
    "gbps": "busbw GB/s",
    "cv": "CV",
}


def document(rec) -> dict:
    return {"summary": rec.meta.get("summary"), "rows": rec.rows("probe")}


def show(rec) -> None:
    rows, s = rec.rows("probe"), rec.meta["summary"]
    shown, columns = render.with_flop_unit([r for r in rows if r["kind"] != "allreduce"], COLUMNS)
    render.table(shown, columns, "probes (median of repeats)")
    links = [r for r in rows if r["kind"] == "allreduce"]
    if links:
        render.table(links, LINK_COLUMNS, "all-reduce between the ranks (bus bandwidth as "
                     "nccl-tests: algbw x 2(n-1)/n)")  # fmt: skip
    render.out_console.print(ceilings_table(s))
    render.out_console.print(datasheet_table(s["measured"]["dtype"]))
    render.warn_untrusted(rec.meta["untrusted"], render.run_threads(rec.meta))
    render.results_line(rec)


def ceilings_table(s: dict) -> Table:
    from benchbatch.core.units import flop_unit

    m, d = s["measured"], s["datasheet"]
    unit = flop_unit([m["peak_tflops"]])
    table = Table(title=f"ceilings, {m['dtype']}: measured vs datasheet", title_justify="left")
    for header in ("ceiling", "measured", "from", f"datasheet ({s['datasheet_name']})", "ratio"):
        table.add_column(header, justify="left" if header in ("ceiling", "from") else "right")
    for name, key, source, scale in (
        (f"matmul {unit.name}", "peak_tflops", m["tflops_source"], unit.per_tflops),
        ("memory GB/s", "peak_gbps", m["gbps_source"], 1),
        ("ridge FLOP/B", "ridge", "", 1),
    ):
        sheet = d[key] if d else None
        ratio = f"{m[key] / sheet:.0%}" if sheet else "-"
        shown = fmt(sheet * scale) if sheet else "unknown"
        table.add_row(name, fmt(m[key] * scale), source, shown, ratio)
    return table


def datasheet_table(dtype: str) -> Table:
    """Every GPU benchbatch knows: dense TFLOP/s per dtype, GB/s, ridge in this dtype."""
    from benchbatch.core import peaks

    table = Table(title="datasheet peaks (dense, no sparsity)", title_justify="left")
    table.add_column("GPU")
    for header in ("fp16", "bf16", "fp32", "GB/s", f"ridge {dtype}"):
        table.add_column(header, justify="right")
    seen = set()
    for _key, p in peaks.KNOWN:
        if p.name in seen:
            continue
        seen.add(p.name)
        rates = [fmt(p.tflops.get(k)) for k in ("fp16", "bf16", "fp32")]
        table.add_row(p.name, *rates, fmt(p.gbps), fmt(p.ridge(dtype)))
    return table
