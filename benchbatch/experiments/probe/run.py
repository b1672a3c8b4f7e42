"""`benchbatch probe`: the device's measured ceilings beside its datasheet peaks."""

from __future__ import annotations

from rich.table import Table

from benchbatch.core.options import ProbeOptions, RunOptions, record, use
from benchbatch.experiments import common as c
from benchbatch.output import render
from benchbatch.output.recorder import Recorder
from benchbatch.output.render import fmt
from benchbatch.runtime import session

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
RUN_FIELDS = ("device", "dtype", "seed", "repeats", "min_time", "warmup", "threads", "out",
              "force", "json_out")  # fmt: skip


@command(ProbeOptions, use(RunOptions, only=RUN_FIELDS))
def probe(opts: ProbeOptions, run: RunOptions) -> None:
    """The device's ceilings, measured: matmul TFLOP/s and memory GB/s (copy and read).

    The roofline of every other command is drawn on these numbers; the datasheet's are
    shown beside them, and dashed on roofline.png. Under torchrun (`torchrun
    --nproc-per-node N -m benchbatch probe`) also the interconnect's: all-reduce bus
    bandwidth between the N ranks over message sizes (nccl-tests' busbw), in allreduce.png.
    """
    from benchbatch.core import peaks
    from benchbatch.output.plots.roofline import roofline_figure
    from benchbatch.runtime import ceilings as probes
    from benchbatch.runtime import distributed
    from benchbatch.runtime.device import device_name

    target = session.target_of(run)

    def opened():
        return probes.plan_for(target, opts), Recorder.open("probe", run, target, None,
                                                            record(opts, run))  # fmt: skip

    plan, rec = distributed.together(opened)
    c.join(rec)
    c.print_notes(target.notice)
    peak = peaks.lookup(device_name(target.device))
    with rec:
        rows = measure(rec, plan, run)
        links = c.interconnect_ceiling(rec, run)
        rec.meta["untrusted"] = rec.untrusted("probe", lambda r: r["label"])
        ceilings = probes.ceilings(rows)
        if links:
            _allreduce_figure(rec, links, target)
        rec.meta["summary"] = summary(ceilings, peak)
        roofline_figure(
            [r for r in rows if r["kind"] != "copy"],
            ceilings,
            rec.folder / "roofline.png",
            datasheet_peak=peak,
            title=f"measured ceilings: {device_name(target.device)}, {target.dtype_name}",
        )
    _report(rec.rows("probe"), rec, run.json_out)


def _allreduce_figure(rec, links: list[dict], target) -> None:
    from benchbatch.output.plots.interconnect import allreduce_figure
    from benchbatch.runtime.device import device_name

    world = target.world
    rec.meta["interconnect"] = {
        "ranks": world.size,
        "backend": world.backend,
        "best_busbw_gbps": max(r["gbps"] for r in links),
        "smallest_message_us": 1e3 * min(links, key=lambda r: r["size"])["step_ms"],
    }
    where = f"{world.size} ranks, {world.backend}, {device_name(target.device)}"
    allreduce_figure(links, [], rec.folder / "allreduce.png", f"all-reduce between {where}")


def measure(rec, plan, run: RunOptions, timing=None) -> list[dict]:
    """probe.csv: each probe as it is measured (probe and reproduce), kept as the latest
    probe of this device and dtype for the commands that follow."""
    return c.measure_probe(rec, run, plan, timing)


def summary(ceilings, peak) -> dict:
    """Measured ceilings, and the datasheet's in the same dtype (None when unknown)."""
    from benchbatch.core import roofline

    sheet = roofline.from_datasheet(peak, ceilings.dtype)
    return {
        "measured": ceilings.to_dict(),
        "datasheet": sheet.to_dict() if sheet else None,
        "datasheet_name": peak.name if peak else "unknown",
    }


def _report(rows: list[dict], run, json_out: bool) -> None:
    s = run.meta["summary"]
    if json_out:
        return c.report_json(run, summary=s, rows=rows)
    shown, columns = render.with_flop_unit([r for r in rows if r["kind"] != "allreduce"], COLUMNS)
    render.table(shown, columns, "probes (median of repeats)")
    links = [r for r in rows if r["kind"] == "allreduce"]
    if links:
        render.table(links, LINK_COLUMNS, "all-reduce between the ranks (bus bandwidth as "
                     "nccl-tests: algbw x 2(n-1)/n)")  # fmt: skip
    render.out_console.print(ceilings_table(s))
    render.out_console.print(datasheet_table(s["measured"]["dtype"]))
    render.warn_untrusted(run.meta["untrusted"])
    render.results_line(run.folder)


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
