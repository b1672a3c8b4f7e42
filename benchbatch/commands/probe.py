"""`benchbatch probe`: the device's measured ceilings beside its datasheet peaks."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from benchbatch import peaks, results, roofline
from benchbatch.commands import common as c
from benchbatch.commands.render import fmt, rows_table
from benchbatch.config import DTYPE_BYTES
from benchbatch.device import device_name, free_memory_bytes
from benchbatch.errors import UserError
from benchbatch.plots.roofline import roofline_figure
from benchbatch.probes import ceilings as probes

COLUMNS = {
    "label": "probe",
    "step_ms": "ms",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "arithmetic_intensity": "FLOP/B",
    "cv": "CV",
    "status": "status",
}


def probe(
    sizes: Annotated[
        str | None,
        typer.Option(
            help="Square matmul sizes n, comma-separated. Default: 1024,2048 on a CPU, "
            "2048,4096,8192 on CUDA."
        ),
    ] = None,
    buffer_mb: Annotated[
        int | None,
        typer.Option(
            help="MiB of each copy/read buffer; keep it far above the last-level cache. "
            "Default: 256 on a CPU, 1024 on CUDA."
        ),
    ] = None,
    device: c.DeviceOpt = "auto",
    dtype: c.DtypeOpt = None,
    repeats: c.RepeatsOpt = 5,
    min_time: c.MinTimeOpt = 0.2,
    out: c.OutOpt = None,
    force: c.ForceOpt = False,
    json_out: c.JsonOpt = False,
) -> None:
    """The device's ceilings, measured: matmul TFLOP/s and memory GB/s (copy and read).

    The roofline of every other command is drawn on these numbers; the datasheet's are
    shown beside them, and dashed on roofline.png.
    """
    opts = c.timing_options(repeats, min_time)
    target = c.resolve_target(device, dtype)
    plan = _plan(target, sizes, buffer_mb)
    folder = results.run_dir(out, "probe", force)
    options = dict(
        sizes=sorted({p.size for p in plan if p.kind == "matmul"}),
        buffer_bytes=plan[-1].size,
        repeats=repeats,
        min_time=min_time,
    )
    run = c.start_run(folder, "probe", target, None, options)
    peak = peaks.lookup(device_name(target.device))
    with c.recording(run, target), c.progress(json_out) as bar, c.throttle_watch(target) as watch:
        task = bar.add_task("probe", total=len(plan))
        for row in probes.run(plan, target.device, target.dtype_name, opts):
            run.add("probe", {**row, "throttled": watch.throttled() and row["status"] == "ok"})
            bar.advance(task)
        rows = run.rows("probe")
        run.meta["untrusted"] = c.untrusted(rows, lambda r: r["label"])
        ceilings = _ceilings(rows)
        run.meta["summary"] = summary(ceilings, peak)
        roofline_figure(
            [r for r in rows if r["kind"] != "copy"],
            ceilings,
            folder / "roofline.png",
            datasheet_peak=peak,
            title=f"measured ceilings: {device_name(target.device)}, {target.dtype_name}",
        )
    _report(rows, run, json_out)


def _plan(target, sizes: str | None, buffer_mb: int | None) -> list[probes.Probe]:
    dev = target.device
    default = probes.default_plan(dev)
    matmuls = (
        c.parse_int_list(sizes, "--sizes")
        if sizes is not None
        else [p.size for p in default if p.kind == "matmul"]
    )
    if buffer_mb is not None and buffer_mb <= 0:
        raise UserError("--buffer-mb", "must be a positive number of MiB")
    buffer = buffer_mb * probes.MiB if buffer_mb is not None else default[-1].size
    _check_memory(target, matmuls, buffer)
    return probes.plan(matmuls, buffer)


def _check_memory(target, matmuls: list[int], buffer: int) -> None:
    """Refuse sizes no memory holds: an n x n matmul keeps three matrices, a copy two buffers."""
    free = free_memory_bytes(target.device)
    elem = DTYPE_BYTES[target.dtype_name]
    if 3 * matmuls[-1] ** 2 * elem > free:
        raise UserError(
            "--sizes",
            f"a {matmuls[-1]:,} x {matmuls[-1]:,} matmul needs "
            f"{3 * matmuls[-1] ** 2 * elem / 2**30:,.1f} GiB, more than the "
            f"{free / 2**30:,.1f} GiB free",
        )
    if 2 * buffer > free:
        raise UserError(
            "--buffer-mb",
            f"two buffers of {buffer / probes.MiB:,.0f} MiB exceed the "
            f"{free / probes.MiB:,.0f} MiB free",
        )


def _ceilings(rows: list[dict]) -> roofline.Ceilings:
    try:
        return roofline.ceilings_from_rows(rows)
    except ValueError as e:
        raise UserError("--sizes", f"no ceiling could be measured: {e}") from None


def summary(ceilings: roofline.Ceilings, peak: peaks.Peak | None) -> dict:
    """Measured ceilings, and the datasheet's in the same dtype (None when unknown)."""
    sheet = roofline.from_datasheet(peak, ceilings.dtype)
    return {
        "measured": ceilings.to_dict(),
        "datasheet": sheet.to_dict() if sheet else None,
        "datasheet_name": peak.name if peak else "unknown",
    }


def _report(rows: list[dict], run, json_out: bool) -> None:
    s = run.meta["summary"]
    if json_out:
        c.print_json({"folder": str(run.folder), "summary": s, "rows": rows})
        return
    c.out_console.print(rows_table(rows, COLUMNS, title="probes (median of repeats)"))
    c.out_console.print(ceilings_table(s))
    c.out_console.print(datasheet_table(s["measured"]["dtype"]))
    c.warn_untrusted(run.meta["untrusted"])
    c.out_console.print(f"results: {run.folder}")


def ceilings_table(s: dict) -> Table:
    m, d = s["measured"], s["datasheet"]
    table = Table(title=f"ceilings, {m['dtype']}: measured vs datasheet", title_justify="left")
    for header in ("ceiling", "measured", "from", f"datasheet ({s['datasheet_name']})", "ratio"):
        table.add_column(header, justify="left" if header in ("ceiling", "from") else "right")
    for name, key, source in (
        ("matmul TFLOP/s", "peak_tflops", m["tflops_source"]),
        ("memory GB/s", "peak_gbps", m["gbps_source"]),
        ("ridge FLOP/B", "ridge", ""),
    ):
        sheet = d[key] if d else None
        ratio = f"{m[key] / sheet:.0%}" if sheet else "-"
        table.add_row(name, fmt(m[key]), source, fmt(sheet) if d else "unknown", ratio)
    return table


def datasheet_table(dtype: str) -> Table:
    """Every GPU benchbatch knows: dense TFLOP/s per dtype, GB/s, ridge in this dtype."""
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
