"""The run's one set of ceilings (given with --ceilings, the latest probe of this device, or
measured now) and the figures drawn under them: the roofline, and under torchrun the
all-reduce sweep."""

from __future__ import annotations

from benchbatch.core.options import RunOptions
from benchbatch.experiments.common import title, use_threads
from benchbatch.output.recorder import Recorder
from benchbatch.runtime import distributed


def use_ceilings(rec: Recorder, run: RunOptions):
    """The run's one set of ceilings: given with --ceilings, else the latest probe of this
    device, dtype, torch, benchbatch, host, thread count and load level when recent and steady
    (ceilings_cache.py; written to probe.csv and said), else measured now into probe.csv
    and kept as the latest (unless --no-roofline or noisy). Every row recorded afterwards
    is placed against them; where they came from is metadata's "ceilings_source" (and
    ceilings.source), the roofline's title and the note."""
    ceilings = rec.given_ceilings
    source = f"from {run.ceilings} (--ceilings)" if ceilings is not None else None
    if ceilings is None and run.roofline:
        from benchbatch.core.roofline import ceilings_from_rows

        cached = None if run.reprobe else _cached_probe(rec)
        if cached is not None:
            rows = cached.rows
            rec.put("probe", rows)
            source = cached.source()
            rec.meta["ceilings_from"] = {"cache": str(cached.path), "run": cached.run,
                                         "measured_utc": cached.measured_utc,
                                         "age_s": round(cached.age_s),
                                         "key": cache_key(rec)}  # fmt: skip
            if not rec.quiet:
                rec.note(
                    f"ceilings: the latest probe of this device in {rec.target.dtype_name}, "
                    f"{cached.describe()} (--reprobe measures them again)"
                )
        else:
            rows = measure_probe(rec, run)
            source = rec.meta.get("ceilings_source")
        ceilings = ceilings_from_rows(rows)
        interconnect_ceiling(rec, run)
    if rec.given_ceilings is not None:
        rec.warning(given_conditions(rec, run.ceilings))
    rec.use_ceilings(ceilings)
    if ceilings is not None:
        rec.meta["ceilings_source"] = source
        rec.meta["ceilings"]["source"] = source
    return ceilings


def given_conditions(rec: Recorder, path) -> str | None:
    """What differs between a --ceilings probe.csv's conditions and this run's, where its
    run folder's metadata.json (beside it) or its rows say: the device, the compute threads,
    the clock its steps were timed on, rows timed once or noisy. A probe of 2 threads on the
    wall clock placed a 1-thread CPU-clock run at 72% MBU against 41% under its own. None
    when nothing differs that they say."""
    import csv
    import json
    from pathlib import Path

    from benchbatch.runtime import device

    path = Path(path)
    said = []
    try:
        meta = json.loads((path.parent / "metadata.json").read_text())
    except (OSError, ValueError):
        meta = {}
    env = meta.get("environment") if isinstance(meta, dict) else None
    mine = rec.meta.get("threads") or {}
    if isinstance(env, dict):
        theirs = env.get("device_name")
        if theirs and theirs != device.device_name(rec.target.device):
            said.append(f"on {theirs}, not {device.device_name(rec.target.device)}")
    threads = meta.get("threads") if isinstance(meta, dict) else None
    if isinstance(threads, dict) and mine.get("threads") is not None:
        if threads.get("threads") not in (None, mine.get("threads")):
            n = threads["threads"]
            said.append(f"with {n} thread{'' if n == 1 else 's'}, not {mine['threads']}")
    with open(path, newline="", errors="replace") as f:
        rows = [r for r in csv.DictReader(f) if r.get("status", "ok") == "ok"]
    clocks = {r.get("clock") for r in rows} - {None, ""}
    if mine.get("clock") and clocks and clocks != {mine["clock"]}:
        said.append(f"on the {'/'.join(sorted(clocks))} clock, not {mine['clock']}")
    from benchbatch.output.ceilings_cache import noisy_rows

    shaky = noisy_rows(rows)
    if shaky:
        said.append(f"its rows {', '.join(shaky)} noisy or timed once")
    if not said:
        return None
    return (f"--ceilings {path} was measured {'; '.join(said)}: its roofs are not this run's, "
            "so its mfu, mbu and bound may be off; probe under this run's conditions "
            "(benchbatch probe), or leave --ceilings out to use the cached or a new probe")


def interconnect_ceiling(rec: Recorder, run: RunOptions) -> list[dict]:
    """Under torchrun: all-reduce bus bandwidth over message sizes between every rank, into
    probe.csv (the roof a step's all-reduces sit under). Nothing on one process."""
    world = rec.target.world
    if world is None or not world.distributed:
        return []
    from benchbatch.runtime import interconnect

    t = rec.target
    sizes = interconnect.plan(t.device)
    rows = interconnect.sweep(world, t.device, t.dtype_name, run.timing(), sizes, run.graphs(t))
    return rec.record("probe", rows, total=len(sizes), label="measuring the all-reduce")


def allreduce_plot(rec: Recorder, rows: list[dict], what: str) -> None:
    """allreduce.png: a tensor-parallel run's step all-reduces under the measured sweep."""
    if rec.target.tp == 1:
        return
    from benchbatch.output.plots.interconnect import allreduce_figure

    probe = [r for r in rec.rows("probe") if r.get("kind") == "allreduce"]
    allreduce_figure(probe, rows, rec.folder / "allreduce.png", title(rec, what))


def measure_probe(rec: Recorder, run: RunOptions, plan=None, timing=None) -> list[dict]:
    """probe.csv, measured now (the default plan of this device unless one is given), and
    kept as the latest probe of this device, dtype, thread count and load class, unless it
    is incomplete or a row of it is noisy (said: a later run measures again)."""
    from benchbatch.output import ceilings_cache
    from benchbatch.runtime import ceilings as probes

    if "threads" not in rec.meta:  # `probe` and `reproduce` open no model run
        use_threads(rec, run)
    t = rec.target
    plan = plan or probes.default_plan(t.device, t.dtype_name)
    timing = timing or run.timing()
    rows = rec.record("probe", probes.run(plan, t.device, t.dtype_name, timing),
                      total=len(plan), label="measuring the device's ceilings")  # fmt: skip
    rec.meta["ceilings_source"] = f"measured now, {ceilings_cache.noise_text(rows)}"
    noisy = ceilings_cache.noisy_rows(rows)
    complete = probes.complete(plan, rows)
    if noisy and not rec.quiet:
        rec.note(
            f"the probe's rows {', '.join(noisy)} are noisy: this run uses them, but they are "
            "not kept for later runs (the next one measures again)"
        )
    if any(r["status"] == "ok" for r in rows) and distributed.is_writer():  # one rank writes
        ceilings_cache.save(cache_key(rec), rows, rec.folder, complete=complete)
    return rows


def cache_key(rec: Recorder) -> str:
    """The cache's key of this run: device, dtype, torch, benchbatch's version and the
    probe's revision, the host's fingerprint, compute threads, load level (quiet, busy or
    saturated: a probe measured on a quiet machine is not a saturated one's) and a CPU's
    clock."""
    import platform

    from benchbatch import __version__
    from benchbatch.core import machine
    from benchbatch.core.saved_calibration import host_id
    from benchbatch.output import ceilings_cache
    from benchbatch.runtime import device
    from benchbatch.runtime.ceilings import PROBE_REVISION

    t = rec.target
    threads = rec.meta.get("threads") or {}
    name = device.device_name(t.device)
    load = threads.get("load_class", "unknown")
    load_1min, cores = threads.get("load_average"), threads.get("physical_cores")
    if isinstance(load_1min, (int, float)) and isinstance(cores, int):  # busy or saturated
        load = machine.load_level(load_1min, max(1, cores))
    version = machine.version("torch")
    return ceilings_cache.key(name, t.dtype_name, version, threads.get("threads"), load,
                              threads.get("clock"), f"{__version__} probe {PROBE_REVISION}",
                              host_id(platform.node()))  # fmt: skip


def _cached_probe(rec: Recorder):
    from benchbatch.core.roofline import ceilings_from_rows
    from benchbatch.output import ceilings_cache

    cached = ceilings_cache.load(cache_key(rec))
    try:
        return cached if cached is not None and ceilings_from_rows(cached.rows) else None
    except ValueError:  # rows without a measured roof: measure again
        return None


def roofline_plot(rec: Recorder, rows: list[dict], source: str, title: str) -> None:
    """roofline.png: the rows against the measured roof (and the datasheet's, if known)."""
    from benchbatch.core import peaks
    from benchbatch.output.plots.roofline import roofline_figure
    from benchbatch.runtime import device

    target = rec.target
    sheet = (
        peaks.lookup(device.device_name(target.device)) if target.device.type == "cuda" else None
    )
    tagged = [{**r, "source": source} for r in rows]
    where = rec.meta.get("ceilings_source")
    title = f"{title}\nceilings {where}" if where else title
    roofline_figure(tagged, rec.ceilings, rec.folder / "roofline.png", sheet, title)
