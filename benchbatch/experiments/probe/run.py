"""`benchbatch probe`: the device's measured ceilings beside its datasheet peaks."""

from __future__ import annotations

from benchbatch.core.options import RunOptions
from benchbatch.core.optkit import record
from benchbatch.core.probe_options import ProbeOptions
from benchbatch.output.recorder import Recorder


def open_run(opts: ProbeOptions, run: RunOptions) -> Recorder:
    """The plan checked to fit the device (every rank), then the folder."""
    from benchbatch.experiments import common as c
    from benchbatch.runtime import ceilings as probes
    from benchbatch.runtime import distributed, session

    target = session.target_of(run)

    def opened():
        return probes.plan_for(target, opts), Recorder.open("probe", run, target, None,
                                                            record(opts, run))  # fmt: skip

    _, rec = distributed.together(opened)
    c.join(rec)
    rec.note(target.notice)
    return rec


def measure_run(rec, opts: ProbeOptions, run: RunOptions) -> None:
    """probe.csv (and the all-reduce's rows under torchrun), roofline.png, and in metadata
    the measured ceilings beside the datasheet's."""
    from benchbatch.core import peaks
    from benchbatch.experiments import ceilings as roofs
    from benchbatch.output.plots.roofline import roofline_figure
    from benchbatch.runtime import ceilings as probes
    from benchbatch.runtime.device import device_name

    target = rec.target
    plan = probes.plan_for(target, opts)  # as open_run checked it
    peak = peaks.lookup(device_name(target.device))
    rows = measure(rec, plan, run)
    links = roofs.interconnect_ceiling(rec, run)
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
    from benchbatch.experiments import ceilings as roofs

    return roofs.measure_probe(rec, run, plan, timing)


def summary(ceilings, peak) -> dict:
    """Measured ceilings, and the datasheet's in the same dtype (None when unknown)."""
    from benchbatch.core import roofline

    sheet = roofline.from_datasheet(peak, ceilings.dtype)
    return {
        "measured": ceilings.to_dict(),
        "datasheet": sheet.to_dict() if sheet else None,
        "datasheet_name": peak.name if peak else "unknown",
    }
