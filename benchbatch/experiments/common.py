"""What the commands share beyond their options: opening a run that times a model.

Every input is checked before the run folder exists; once it does, metadata.json says what
the run is, and notes (the device's dtype, the default model) are printed, since no user
error can follow any more. Under torchrun every rank checks, and an error on any rank
stops them all (distributed.together); rank 0 makes the folder and writes, the metadata
records every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from benchbatch.core.fits import cache_len
from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.core.optkit import record
from benchbatch.core.units import duration, figure
from benchbatch.errors import UserError
from benchbatch.output.recorder import Recorder
from benchbatch.runtime import distributed, session


def open_model_run(
    command: str,
    model: ModelOptions,
    run: RunOptions,
    *options,
    check: Callable | None = None,
    before: Callable | None = None,
    cache: Callable | None = None,
    given: dict | None = None,
) -> Recorder:
    """A run that times the model: device, shape and options checked, the folder made and
    metadata.json written (before the model is built), then before(cfg) (a header) and the
    notes printed. cache(cfg) -> (slots, tokens per slot, option): a real engine's KV cache,
    checked to fit beside the model. given: a --step-costs calibration, refused here if it
    is another device's."""
    target = session.target_of(run)
    if given is not None and given.get("conditions"):
        from benchbatch.core.saved_calibration import refuse_device
        from benchbatch.runtime.device import device_name

        refuse_device(given["conditions"], device_name(target.device))
    rec = distributed.together(lambda: _open(command, model, run, target, options, check, cache))
    join(rec)
    if before is not None:
        before(rec.cfg)
    rec.note(target.notice)
    rec.note(session.preset_note(model, target))
    use_threads(rec, run)
    return rec


def over_cores(threads) -> str | None:
    """--threads past the physical cores the process may use: the threads take turns, and
    each step waits for the last of them (the audit's 1,000 on 2 cores: a 16-token prefill
    ~300x its time)."""
    if threads.chosen != "--threads" or threads.threads <= threads.cores:
        return None
    cores = f"{threads.cores} physical core{'s' if threads.cores > 1 else ''}"
    return (
        f"--threads {threads.threads} is more than the {cores} this process may use: the "
        f"threads take turns on them and each step waits for the last, so its times measure "
        f"the crowding, not the device (at most {threads.cores} measures it)"
    )


def use_threads(rec: Recorder, run: RunOptions) -> None:
    """The run's compute threads (--threads, else one per free physical core: one on a
    small or busy machine) and its pinned compute thread, said in a note and in metadata's
    "threads"; a warning when other processes compete for the cores, at the start or by the
    end (their load rose). The process gets its threads and CPUs back when the run ends."""
    from benchbatch.core import machine
    from benchbatch.runtime import backend, device

    world = rec.target.world
    alone = world is None or not world.distributed  # ranks of one machine: none pinned
    threads = device.apply_threads(rec.target.device, run.threads, pin=alone)
    rec.meta["threads"] = threads.to_dict()
    cpu_env = (rec.meta.get("environment") or {}).get("cpu")
    if isinstance(cpu_env, dict):  # read as the run opened, before its threads were set
        cpu_env["torch_threads"] = threads.threads
    rec.write_meta()
    cpu = rec.target.device.type == "cpu"
    if cpu:
        pinned = threads.pinned
        where = f", pinned to CPU {','.join(map(str, pinned))}" if pinned else ", not pinned"
        rec.meta["threads"]["clock"] = clock = backend.host_clock(threads.threads, alone)
        rec.write_meta()
        rec.note(threads.reason + where + CLOCK_NOTE[clock])
        rec.warning(machine.busy_warning(threads.load_average, threads.cores, threads.threads,
                                         cpu_clock=clock == "cpu"))  # fmt: skip
        rec.warning(over_cores(threads))

    def at_end() -> None:
        threads.restore()
        if cpu:
            say_core_share(rec)
        load = machine.load_average()
        after = load[0] if load else None
        if not cpu or after is None or threads.load_class == "busy":
            return  # said at the start already
        own = threads.threads
        if machine.load_class(after, threads.cores, own) == "busy":
            rows = (
                "timed steps count the compute thread's own CPU time, but the real engine's "
                "are wall-clock and may be slower and noisier"
                if rec.meta["threads"].get("clock") == "cpu"
                else "later rows may be slower and noisier"
            )
            rec.warning(
                f"the load average rose from {threads.load_average} to {after:.1f} during the "
                f"run (on {threads.cores} physical cores, {own} of it this run's): another "
                f"process competed for the cores, so {rows}; rerun with other work closed "
                "(--threads 1 measures best on a shared machine)"
            )

    rec._stack.callback(at_end)  # leaving the run's `with` block


# How a CPU run's timed steps are clocked (runtime/backend.py, HostTimer), said beside its
# threads.
CLOCK_NOTE = {
    "cpu": "; steps timed on its CPU clock (the load does not stretch them; wall_ms beside)",
    "wall": "; steps timed on the wall clock",
}
# Timed rows whose compute thread held its core less than this share of their wall time
# (median) are said to have waited for it: the machine was shared while they were timed.
SHARED_CORE = 0.9


def say_core_share(rec: Recorder) -> None:
    """How much of their wall time the timed steps' thread held its core (the median of
    the core_share of every row this run measured), in metadata's threads.core_share; a
    note when other processes took it often enough to matter (below SHARED_CORE). A probe
    reused from the ceilings cache (metadata's "ceilings_from") is another run's: its
    rows' core_share is not this run's."""
    import statistics

    reused = {"probe"} if rec.meta.get("ceilings_from") else set()
    shares = [
        r["core_share"]
        for name, rows in list(rec.tables.items())
        if isinstance(rows, list)  # timed rows; a DataFrame (a simulation's requests) has none
        and name not in reused
        for r in rows
        if isinstance(r.get("core_share"), float) and r["core_share"] == r["core_share"]
        and not str(r.get("source", "")).startswith("sim")  # a simulation's copy of a real row's
    ]
    if not shares:
        return
    median = statistics.median(shares)
    rec.meta["threads"]["core_share"] = median
    rec.write_meta()
    if median < SHARED_CORE:
        rec.note(
            f"other processes held the compute thread's core while it was timed: it ran "
            f"{median:.0%} of the wall time (median of {len(shares)} rows); step_ms counts "
            "its own CPU time, so the steps are the device's, and wall_ms how long they took "
            "on the machine as it was"
        )


def _open(command: str, model: ModelOptions, run: RunOptions, target, options, check, cache):
    from benchbatch.core import sharding

    cfg = session.shape(model, target)
    if check is not None:
        check(cfg)
    sharding.check(cfg, target.tp)
    session.check_fits(cfg, target, model.source(), cache(cfg) if cache is not None else None)
    session.check_checkpoint(model, cfg, target)  # the weights' headers, before any folder
    given = load_ceilings(run, target)
    applied = dataclasses.replace(run, cuda_graphs=run.graphs(target), tp=target.tp)
    return Recorder.open(command, applied, target, cfg, record(*options, model, applied), given)


def join(rec: Recorder) -> None:
    """Under torchrun: every rank takes rank 0's folder, and metadata.json records the
    world (size, backend, tp, each rank's host and device)."""
    world = rec.target.world if rec.target is not None else None
    if world is None or not world.distributed:
        return
    rec.folder = distributed.gather(rec.folder)[0]
    rec.meta["distributed"] = distributed.metadata(rec.target.device)
    rec.write_meta()


def engine_cache(slots: int, requests) -> tuple[int, int, str]:
    """The real engine's KV cache, for open_model_run's cache: every slot holds the longest
    prompt plus the longest output."""

    return slots, cache_len(requests), "slots"


def build_model(rec: Recorder, model: ModelOptions, run: RunOptions, target=None):
    """The model and its config (ModelOptions.build), its weight layout in metadata.json and,
    with --compile, its steps through torch.compile: metadata's "compile" holds the mode,
    what was applied (eager after a failure, said in one line) and the compile seconds."""
    target = target or rec.target
    net, cfg = session.build_model(model, target, run.seed)
    rec.meta["sdpa_backends"] = _sdpa_backends(net)
    if run.compile:
        from benchbatch.runtime import compiled

        def fell_back(line: str) -> None:
            rec.warning(line)
            rec.write_meta()

        # The state's info dict itself: metadata.json gets its latest compile seconds.
        rec.meta["compile"] = compiled.compile_model(net, run.graphs(target), fell_back).info
    rec.meta["weight_layout"] = net.layout.name  # compiled: a strided one (compile_model)
    return net, cfg


def _sdpa_backends(net) -> dict:
    """Each kind of attention call's SDPA backend at the article's sizes (runtime/sdpa.py);
    under tensor parallelism a rank's heads are what its calls see, so: its own config."""
    from benchbatch.runtime import sdpa

    w = net.embed.weight
    try:
        return sdpa.by_kind(getattr(net, "local_cfg", net.cfg), w.device, w.dtype)
    except RuntimeError as e:  # a torch whose selector refuses these shapes: say so
        return {"error": str(e).splitlines()[0][:200]}


def load_ceilings(run: RunOptions, target):
    """Ceilings from a probe.csv given with --ceilings, checked against this run's dtype."""
    if run.ceilings is None:
        return None
    from benchbatch.core.roofline import ceilings_from_csv

    ceilings = ceilings_from_csv(run.ceilings, option="--ceilings")
    if ceilings.dtype != target.dtype_name:
        raise UserError(
            "--ceilings",
            f"{run.ceilings} was measured in {ceilings.dtype}, this run is {target.dtype_name}",
        )
    return ceilings


LONG_RUN_S = 180  # an estimate over three minutes comes with a shorter run to try
SAID_FROM_S = 10  # shorter runs finish before an estimate would help anyone
SHORTER_BY = 0.75  # a shorter run offered takes at most this share of the estimate
LIST_FLAGS = {"prefill": "--prefill", "decode_batch": "--decode-batch", "batch": "--decode-batch",
              "context": "--context"}  # fmt: skip


def estimate_run(rec: Recorder, net, run: RunOptions, lists: dict, keep: dict, plan_of) -> None:
    """Time two small steps, price every planned step from them and say how long the run
    will take (stderr, and metadata `estimate`); over LONG_RUN_S, the shorter runs with
    their estimates: which of the command's lists to shorten, fewer layers, and on a CPU a
    smaller model. plan_of(lists) gives the steps a run of those lists times."""
    from benchbatch.runtime import estimate

    dtype = rec.target.dtype_name
    context = min(lists.get("context", (512,)))
    rates = estimate.measure_rates(net, dtype, context)
    timing = run.timing()

    def seconds(ls: dict, cfg=None) -> float:
        shape = cfg or net.cfg
        return estimate.run_s(plan_of(ls), lambda s: rates.step_s(shape, dtype, s), timing)

    total = seconds(lists)
    long = total > LONG_RUN_S
    cut = estimate.shorter(lists, keep, seconds, LONG_RUN_S) if long else None
    models = _smaller_models(rec, lambda cfg: seconds(lists, cfg)) if long else []
    rec.meta["estimate"] = {
        "estimated_s": total,
        "steps": len(plan_of(lists)),
        "decode_step_ms": rates.decode_ms,
        "decode_context": rates.context,
        "prefill_ms": rates.prefill_ms,
        "prefill_tokens": rates.prefill_tokens,
        "shorter": None if cut is None else {"lists": cut.lists, "estimated_s": cut.seconds},
        "smaller_models": [{"flags": f, "estimated_s": t} for f, t in models],
    }
    if rec.quiet or total < SAID_FROM_S:  # a short run: in metadata.json only
        return
    compiling = (", not counting --compile's first call of each shape (tens of seconds a "
                 "shape on a CPU)") if run.compile else ""  # fmt: skip
    rec.say(
        f"estimated duration: about {duration(total)} for {len(plan_of(lists))} steps "
        f"(a decode step of one sequence at context {rates.context:,} took "
        f"{figure(rates.decode_ms)} ms here, a {rates.prefill_tokens}-token prefill "
        f"{figure(rates.prefill_ms)} ms{compiling})"
    )
    if long:  # a shorter run offered only where it is one ("--layers 1 (about 3 min)")
        cut = cut if cut is not None and cut.seconds < SHORTER_BY * total else None
        models = [(flags, s) for flags, s in models if s < SHORTER_BY * total]
        rec.note(f"that is long; {_shorter_hint(cut, lists, models)}")


def expected_s(rec: Recorder, steps: int) -> float | None:
    """The run's estimated duration (estimate_run's) where it priced these `steps`: what the
    progress display counts down until the first step is done."""
    e = rec.meta.get("estimate") or {}
    if (rec.meta.get("options") or {}).get("compile"):  # compiling each shape is unpriced
        return None
    return e.get("estimated_s") if e.get("steps") == steps else None


def _smaller_models(rec: Recorder, seconds) -> list[tuple[str, float]]:
    """Fewer layers, and on a CPU cpu-small when the run's model is larger; none for a
    checkpoint (its shape is its own)."""
    from benchbatch.core import config
    from benchbatch.runtime import estimate

    if (rec.meta.get("options") or {}).get("model") is not None:
        return []
    small = None
    if rec.target.device.type == "cpu" and _larger_than_cpu_small(rec):
        small = config.preset("cpu-small")
    return estimate.smaller_models(rec.cfg, seconds, LONG_RUN_S, small)


def _shorter_hint(cut, lists: dict, models: list[tuple[str, float]]) -> str:
    parts = []
    if cut is not None:
        flags = " ".join(
            f"{LIST_FLAGS[k]} {','.join(map(str, v))}" for k, v in cut.lists.items()
            if v != lists[k]
        )  # fmt: skip
        parts.append(f"{flags} (about {duration(cut.seconds)})")
    parts += [f"{flags} (about {duration(s)})" for flags, s in models]
    if not parts:
        return "fewer --repeats or a shorter --min-time make it shorter"
    return "for a shorter run, the same command with " + ", or ".join(parts)


def _larger_than_cpu_small(rec: Recorder) -> bool:
    from benchbatch.core import accounting, config

    dtype = rec.target.dtype_name
    small = accounting.weight_bytes(config.preset("cpu-small"), dtype)
    return accounting.weight_bytes(rec.cfg, dtype) > small


def title(rec: Recorder, what: str = "", rows: list[dict] | None = None, noise: str = "") -> str:
    """The figures' title: the model, the dtype and the device, and how sure the timed rows
    are (how many were noisy), from the rows or as given."""
    from benchbatch.runtime.device import device_name

    cfg, t = rec.cfg, rec.target
    ranks = f", tensor-parallel over {t.tp} ranks" if t.tp > 1 else ""
    head = (
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {t.dtype_name}, "
        f"{device_name(t.device)}{ranks}"
    )
    if rows is not None:
        from benchbatch.output.plots.spread import noise_note

        noise = noise_note(rows)
    tail = f"\n{what}" + (f"; {noise}" if noise else "") if what or noise else ""
    return head + tail


def engine_noise(rows: list[dict]) -> str:
    """For the real engine's title: which policies' steps spread (noise.py's rule)."""
    from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN
    from benchbatch.experiments.occupancy import probe

    uneven = probe.noisy(rows)
    if uneven:
        return f"noisy: {', '.join(uneven)} (p90 step over {NOISY_P90_OVER_MEDIAN:g}x the median)"
    return "steady steps (p90 within 2x the median)"


def say_allreduce_over_step(rec: Recorder, rows: list[dict], name) -> None:
    """Under tensor parallelism: a warning (kept in metadata) naming the steps whose
    all-reduces, timed on their own, took longer than the whole step holding them
    (allreduce_over_step; an all-reduce share over 100% on a CPU whose ranks share cores):
    their share says how the separate timing went, not what the step spent on them.
    name: a row's name (its label, its batch)."""
    over = [r for r in rows if r.get("allreduce_over_step") is True]
    if not over:
        return
    worst = max(over, key=lambda r: r["allreduce_share"])
    shown = ", ".join(str(name(r)) for r in over[:3]) + (
        f" and {len(over) - 3} more" if len(over) > 3 else "")  # fmt: skip
    rec.warning(
        f"the all-reduces timed on their own took longer than the whole step at {len(over)} "
        f"of {len(rows)} steps ({shown}; up to {worst['allreduce_share']:.0%} of "
        f"{name(worst)}): timed apart they met other work (ranks sharing cores or the "
        "link), so those shares are not what the step spent on them; read them as unknown "
        "(allreduce_over_step in the CSV)"
    )
