"""`benchbatch reproduce`: the article's measurements in one command, one folder, one report.

A list of parts (PARTS) run in turn on one run, one model and one set of ceilings: probe
(the device's measured ceilings), phases (table B), sweep (table A), occupancy (experiment
C, simulated; on the model too with --engine real), the memory policies and the serving
curve, each through the public functions the probe, phases, sweep, occupancy and
serve-sweep experiments run themselves; every row is placed against the one set of
ceilings the probe measured; every CSV and plot lands in one folder with one
metadata.json, a roofline of every step, and report.md / report.html setting each number
beside the article's with a verdict per claim.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchbatch.core.fits import check_fits
from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.probe_options import ProbeOptions
from benchbatch.errors import UserError
from benchbatch.experiments import common as c
from benchbatch.experiments.phases.options import PhasesOptions
from benchbatch.experiments.reproduce.options import CPU_REAL, ReproduceOptions
from benchbatch.experiments.reproduce.reporting import build_report
from benchbatch.experiments.sweep.options import SweepOptions
from benchbatch.output import report
from benchbatch.output.recorder import Recorder
from benchbatch.runtime import session

KNEE_THRESHOLD = 0.25  # sweep's default: a step 25% slower than the smallest batch's
# The real engine's workload on a CPU (options.CPU_REAL): the article's 32 slots, 128
# requests, outputs up to 400 tokens: 1,853 steps in all (2.3x fewer for continuous
# batching, simulated), about 1 min 45 s with cpu-small on 2 cores, and 628 steps of
# calibration after. On CUDA it runs the simulated workload.


@dataclass(frozen=True)
class Job:
    """Every part of a reproduction, as the options objects the commands take, checked."""

    phases: PhasesOptions
    sweep: SweepOptions
    workload: WorkloadOptions
    real: WorkloadOptions | None  # the real engine's workload (--engine real), else None
    probe: ProbeOptions
    cpu_sized: bool
    real_sizes: tuple[str, ...] = ()  # the real workload's fields a --real-* option (or the
    # CPU's sizes, which those options change) set, not the simulated workload's


# A real workload's field, and the option that sets it where it is not the simulated one's.
REAL_OPTIONS = {"requests": "real_requests", "slots": "real_slots",
                "max_output": "real_max_output"}  # fmt: skip


def open_run(
    opts: ReproduceOptions,
    phases: PhasesOptions,
    sweep: SweepOptions,
    workload: WorkloadOptions,
    probe: ProbeOptions,
    model: ModelOptions,
    run: RunOptions,
) -> Recorder:
    target = session.target_of(run)
    job = job_of(opts, phases, sweep, workload, probe, target)
    check = lambda cfg: _check(job, cfg, target)  # noqa: E731
    parts = (opts, phases, job.sweep, workload, probe)
    cache = None
    if job.real is not None:
        cache = lambda cfg: c.engine_cache(job.real.slots, job.real.draw(run.seed))  # noqa: E731
    rec = c.open_model_run("reproduce", model, run, *parts, check=check, cache=cache)
    rec.meta.update(cpu_sized=job.cpu_sized, parts={})
    return rec


def measure_run(
    rec,
    opts: ReproduceOptions,
    phases: PhasesOptions,
    sweep: SweepOptions,
    workload: WorkloadOptions,
    probe: ProbeOptions,
    model: ModelOptions,
    run: RunOptions,
) -> None:
    from benchbatch.runtime import device as devices

    job = job_of(opts, phases, sweep, workload, probe, rec.target)
    # A noisy step (or group of steps timed together) is measured once more before its
    # numbers are kept: the verdicts rest on them.
    timing = dataclasses.replace(run.timing(), retry_noisy=1)
    # The sweep's memory ceiling subtracts the weights itself: read free memory first.
    free_bytes = devices.free_memory_bytes(rec.target.device)
    shared = Shared(job, model, run, timing, free_bytes)
    for part in PARTS:
        if part.when(job):
            _run_part(rec, part, shared)


def job_of(opts, phases, sweep, workload, probe, target) -> Job:
    cuda = target.device.type == "cuda"
    # The sweep's steps in the cache layout the phases' are timed in (--kv-layout,
    # --block-size: reproduce takes them once, for every timed step)
    sweep = dataclasses.replace(sweep, batch=sweep.batches(target), context=phases.context,
                                knee_threshold=KNEE_THRESHOLD, kv_layout=phases.kv_layout,
                                block_size=phases.block_size)  # fmt: skip
    sizes = real_sizes(dataclasses.asdict(opts), cuda)
    try:
        real = None if sizes is None else dataclasses.replace(workload, **sizes)
    except UserError as e:
        raise _as_real(e, sizes) from None
    return Job(phases, sweep, workload, real, probe, cpu_sized=not cuda,
               real_sizes=tuple(sizes or ()))  # fmt: skip


def _as_real(e: UserError, sizes) -> UserError:
    """An error of the real run's workload, named by the --real-* option of its field."""
    if e.option in (sizes or ()) and e.option in REAL_OPTIONS:
        return UserError(REAL_OPTIONS[e.option], e.message)
    return e


def real_sizes(options: dict, cuda: bool) -> dict | None:
    """What the real engine's workload changes in the simulated one (None without --engine
    real): on a CPU, CPU_REAL; the hidden --real-* options over either. options: the
    ReproduceOptions' fields (or the run's recorded options)."""
    if options["engine"] != "real":
        return None
    sizes = {} if cuda else dict(CPU_REAL)
    given = dict(requests=options["real_requests"], slots=options["real_slots"],
                 max_output=options["real_max_output"])  # fmt: skip
    return sizes | {k: v for k, v in given.items() if v is not None}


def _check(job: Job, cfg, target) -> None:
    from benchbatch.runtime import ceilings as probes

    probes.plan_for(target, job.probe)  # its sizes and buffers must fit, as in `probe`
    job.phases.check(cfg)
    # the simulated workload's lengths must fit the model too: the memory part reserves
    # them against its KV cache
    check_fits(cfg.max_context, job.workload.draw(), prompt="prompt_len")
    if job.real is not None:
        try:
            check_fits(cfg.max_context, job.real.draw())
        except UserError as e:  # named by the option that set the real run's outputs
            raise _as_real(e, job.real_sizes) from None


# --- the parts -------------------------------------------------------------------------------


@dataclass
class Shared:
    """What the parts share beyond the run (rec, and its one set of ceilings, rec.ceilings):
    the job, the options, the timing, the device's free memory before the model was built,
    the built model, and occupancy's requests (drawn once, for the memory part too)."""

    job: Job
    model: ModelOptions
    run: RunOptions
    timing: object
    free_bytes: int
    net: object = None
    cfg: object = None  # the built model's config
    requests: list | None = None


@dataclass(frozen=True)
class Part:
    """One part of the reproduction: name (its seconds in metadata's parts, and said when
    done; None for a step between parts, untimed), fn(rec, shared), and when(job) it runs."""

    name: str | None
    fn: Callable[[Recorder, Shared], None]
    when: Callable[[Job], bool] = lambda job: True


def _run_part(rec, part: Part, shared: Shared) -> None:
    """A part, timed into metadata and said when done (stderr; the bar is transient)."""
    start = time.perf_counter()
    part.fn(rec, shared)
    if part.name is None:
        return
    seconds = time.perf_counter() - start
    rec.meta["parts"][part.name] = round(seconds, 3)
    rec.write_meta()
    if not rec.quiet:
        rec.say(f"{part.name}: done in {seconds:.1f} s")


def probe_part(rec, s: Shared) -> None:
    """probe.csv: the device's ceilings, the run's one set from here on."""
    from benchbatch.experiments.probe import run as probe
    from benchbatch.runtime import ceilings as probes

    rows = probe.measure(rec, probes.plan_for(rec.target, s.job.probe), s.run, s.timing)
    rec.use_ceilings(probes.ceilings(rows, "probe_sizes"))
    rec.meta["probe"] = probe.summary(rec.ceilings, _peak(rec.target))


def model_part(rec, s: Shared) -> None:
    """The one model every later part times (weights random)."""
    s.net, s.cfg = c.build_model(rec, s.model, s.run, rec.target)


def phases_part(rec, s: Shared) -> None:
    """Table B: phases.csv and phases.png."""
    from benchbatch.experiments.phases import probe as phases_probe
    from benchbatch.experiments.phases import run as phases

    rows = phases.measure(rec, s.net, s.job.phases, s.run, s.timing)
    rec.meta["phases"] = phases_probe.summary(rows)


def sweep_part(rec, s: Shared) -> None:
    """Table A: sweep.csv and sweep.png, the roofline knee on this device's measured ridge
    (not a datasheet's)."""
    from benchbatch.experiments.sweep import probe as sweep_probe
    from benchbatch.experiments.sweep import run as sweep

    opts = s.job.sweep
    ceiling = sweep_probe.ceilings(s.cfg, rec.target.dtype_name, opts.context, s.free_bytes)
    ridge = rec.ceilings.ridge
    _, rec.meta["sweep"] = sweep.measure(rec, s.net, opts, ceiling, ridge, s.run, s.timing)
    rec.meta["ridge_source"] = "measured (probe)"


def ceilings_part(rec, s: Shared) -> None:
    """The ceilings every row was placed against (the probe's, raised where a step beat it)
    in metadata, and roofline.png: every probe, phases and sweep point under them."""
    from benchbatch.experiments.probe import run as probe
    from benchbatch.output.plots.roofline import roofline_figure

    rec.meta["probe"] = probe.summary(rec.ceilings, _peak(rec.target))
    points = [{**r, "source": "probe"} for r in rec.rows("probe") if r["kind"] != "copy"]
    points += [{**r, "source": "phases"} for r in rec.rows("phases")]
    points += [{**r, "label": f"b={r['batch']}", "source": "sweep"} for r in rec.rows("sweep")]
    roofline_figure(points, rec.ceilings, rec.folder / "roofline.png", _peak(rec.target),
                    c.title(rec, "roofline", points))  # fmt: skip


def occupancy_part(rec, s: Shared) -> None:
    """Experiment C, simulated: occupancy.csv, timeline.csv and occupancy.png."""
    from benchbatch.experiments.occupancy import run as occupancy

    workload, seed = s.job.workload, s.run.seed
    s.requests = workload.draw(seed)
    _, claim = occupancy.simulate_part(rec, s.requests, workload, 1, seed)
    described = describe_workload(s.requests, workload.slots)
    rec.meta["occupancy"] = {"workload": described, **claim}


def memory_part(rec, s: Shared) -> None:
    """Memory, not compute: the occupancy workload's ceiling reserved against paged on this
    device's free memory (and a known GPU's datasheet memory), memory_ceiling.csv; and the
    memory policies on the slot count's worth, memory.csv and memory.png."""
    from benchbatch.core import kvceiling
    from benchbatch.experiments.occupancy import memory as mprobe
    from benchbatch.experiments.occupancy import run as occupancy

    cfg, dtype, requests, workload = rec.cfg, rec.target.dtype_name, s.requests, s.job.workload
    block = s.job.phases.block_size  # --block-size: the paged layout's, here as in the steps
    where = "free GPU memory" if rec.target.device.type == "cuda" else "available RAM"
    memories = [(f"this device ({where})", s.free_bytes)]
    peak = _peak(rec.target) if rec.target.device.type == "cuda" else None
    if peak is not None and peak.memory_gib:
        memories.append((f"{peak.name} datasheet", kvceiling.datasheet_bytes(peak.memory_gib)))
    reserve = mprobe.reserve_output(requests, workload.max_output, workload.trace)
    tp = rec.target.tp
    found = kvceiling.for_workload(cfg, dtype, requests, reserve, block, memories, tp)
    rows = [f.row() for f in found]
    rec.put("memory_ceiling", rows)
    rec.meta["memory_ceiling"] = rows
    per_token = mprobe.bytes_per_token(cfg, dtype, tp)
    setup = mprobe.setup(requests, workload.slots, block, reserve, per_token, None, "")
    occupancy.memory_part(rec, requests, setup, None)


def real_part(rec, s: Shared) -> None:
    """Both policies on the model, on the real workload (smaller on a CPU): engine.csv,
    engine_steps.csv and engine.png, as `benchbatch occupancy --engine real` writes them."""
    from benchbatch.experiments.occupancy import probe, real
    from benchbatch.output.plots.occupancy import engine_figure

    workload = s.job.real
    requests = workload.draw(s.run.seed)
    sims = probe.simulate(requests, workload.slots)
    layout = {"kv_layout": s.job.phases.kv_layout, "block_size": s.job.phases.block_size}
    real.engine_runs(rec, s.net, requests, workload.slots, sims, s.run.seed, layout=layout)
    real.prediction_part(rec, s.net, requests, workload.slots, s.run, layout=layout)
    rows = rec.rows("engine")
    described = describe_workload(requests, workload.slots)
    rec.meta["engine"] = {"workload": described, **probe.engine_summary(rows)}
    title = c.title(rec, f"real engine, {described}", noise=c.engine_noise(rows))
    engine_figure(rec.rows("engine_steps"), rows, rec.folder / "engine.png", title)


def serve_part(rec, s: Shared) -> None:
    """The serving curve at three rates, priced by the steps phases and sweep measured."""
    from benchbatch.experiments.serve.reproduce_curve import reproduce_curve

    rec.meta["serve"] = reproduce_curve(rec, s.run.seed)


def release_part(rec, s: Shared) -> None:
    """The model let go, its memory back to the device."""
    from benchbatch.runtime import device as devices

    s.net = s.cfg = None
    devices.release_memory(rec.target.device)


def report_part(rec, s: Shared) -> None:
    """report.md and report.html; every claim's verdict in metadata."""
    from benchbatch.output import results

    built = build_report(rec)
    rec.meta["claims"] = [vars(cl) for cl in built.claims]
    results.atomic_write_text(rec.folder / "report.md", report.to_markdown(built))
    images = {x.image: (rec.folder / x.image).read_bytes() for x in built.sections if x.image}
    results.atomic_write_text(rec.folder / "report.html", report.to_html(built, images))


PARTS = (
    Part("probe", probe_part),
    Part(None, model_part),
    Part("phases", phases_part),
    Part("sweep", sweep_part),
    Part(None, ceilings_part),
    Part("occupancy", occupancy_part),
    Part("memory", memory_part),
    Part("occupancy, real engine", real_part, when=lambda job: job.real is not None),
    Part("serving curve", serve_part),
    Part(None, release_part),
    Part(None, report_part),
)


def _peak(target):
    from benchbatch.core import peaks
    from benchbatch.runtime.device import device_name

    return peaks.lookup(device_name(target.device))


def describe_workload(requests, slots: int) -> str:
    import statistics

    outputs = [r.output_tokens for r in requests]
    median = statistics.median(outputs)  # of an even count, the two middle ones' mean
    return (
        f"{len(requests):,} requests (output median {median:,g}, max "
        f"{max(outputs):,} tokens), {slots} slots, all queued"
    )
