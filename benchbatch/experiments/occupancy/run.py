"""`benchbatch occupancy`: static against continuous batching, simulated and on the model;
and the memory policies (reserved against paged KV blocks) on one KV budget."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from benchbatch.core.fits import check_fits, check_prompt_ids, length_options
from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import record
from benchbatch.core.units import figure
from benchbatch.experiments.fields import ignored_by_trace
from benchbatch.experiments.occupancy import real
from benchbatch.experiments.occupancy.options import OccupancyOptions
from benchbatch.output.recorder import Recorder

MAX_MEMORY_REQUESTS = 10_000  # the memory policies run step by step: about 20 s at this size
# ... and their work grows with the steps and tokens too (one 10M-token output is 10M steps a
# policy): memory_work's estimate, about 1.3M for MAX_MEMORY_REQUESTS of the default workload
# (a step costs about 3 tokens' work; 1.2M took 44 s on a loaded 2-core machine).
MAX_MEMORY_WORK = 1_500_000


@dataclass
class Inputs:
    """What open_run checked and measure_run runs on: the requests as served, the fitted
    step cost (--step-costs) and the memory policies' budget."""

    requests: object
    cost: object = None
    memory: object = None
    stop: frozenset = frozenset()  # --stop-at-eos: the checkpoint's end-of-sequence ids
    given: dict | None = None  # --step-costs read (core/saved_calibration.given)


# The simulation needs no torch: what runs the model (common, the session) is imported where
# it runs.


def open_run(
    opts: OccupancyOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> Recorder:
    """Every input checked (the workload, the step costs, with the real engine the model's
    context and the KV cache beside it), then the run folder."""
    from benchbatch.experiments.occupancy.probe import check_memory

    opts.check(workload, model)
    requests = _served(workload.draw(run.seed), workload, model, opts.stop_at_eos)
    given = _step_cost(opts)
    inputs = Inputs(requests, None if given is None else given["model"], given=given)
    check_memory(len(requests), "trace" if workload.trace is not None else "requests")
    if opts.engine == "real":
        from benchbatch.experiments import common as c
        from benchbatch.runtime import session

        def check(cfg) -> None:
            _check_real(cfg, requests, workload)
            target = session.target_of(run)
            inputs.memory = _memory_setup(opts, workload, requests, cfg, target, True)
            if opts.stop_at_eos:  # ids the model can generate, read before any folder
                inputs.stop = _stop_tokens(model, cfg.vocab)
            if opts.kv_memory is not None:  # the memory policies' paged pool, on the device
                m = inputs.memory
                session.check_pool_fits(cfg, target, m.blocks, m.block_size, "kv_memory")

        cache = lambda cfg: c.engine_cache(workload.slots, requests)  # noqa: E731
        rec = c.open_model_run("occupancy", model, run, opts, workload, check=check, cache=cache,
                               given=given)  # fmt: skip
    else:
        shape = model.shape("article")
        inputs.memory = _memory_setup(opts, workload, requests, shape, run.dtype or "fp16")
        rec = Recorder.open("occupancy", run, None, None, record(opts, workload, run))
    rec.inputs = inputs
    rec.note(ignored_by_trace(workload))
    return rec


def measure_run(
    rec, opts: OccupancyOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """The simulation (every seed), the memory policies, and with --engine real both
    policies (and with --kv-memory the memory policies) on the model."""
    inputs = rec.inputs
    requests = inputs.requests
    sims, rec.meta["summary"] = simulate_part(rec, requests, workload, opts.seeds, run.seed)
    if inputs.given is not None and opts.engine != "real":  # the real run's prediction says it
        _given_costs(rec, requests, workload.slots, inputs.given, run)
    memory = memory_part(rec, requests, inputs.memory, inputs.cost)
    if opts.engine == "real":
        stop = inputs.stop
        layout = {"kv_layout": opts.kv_layout, "block_size": opts.block_size}
        net = real.run_real(rec, model, run, requests, workload.slots, sims, stop, layout)
        if opts.kv_memory is not None and memory:
            real.memory_engine(rec, net, requests, inputs.memory, memory, run.seed)


def _given_costs(rec, requests, slots: int, given: dict, run: RunOptions) -> None:
    """--step-costs that price the memory policies' time, kept and said as every command
    that reuses a calibration says it (step_cost.json, metadata's step_cost, its
    conditions, a batch past its largest): they were used unsaid."""
    from benchbatch.experiments.ablation.run import cost_model
    from benchbatch.experiments.occupancy.real import calibration_budgets

    cost_model(rec, None, calibration_budgets(requests, slots), requests, given, run)


def _step_cost(opts: OccupancyOptions):
    """The step-cost model fitted to --step-costs (checked before any folder is made)."""
    if not opts.step_costs:
        return None
    from benchbatch.core import saved_calibration

    return saved_calibration.given(opts.step_costs)


def _memory_setup(opts, workload: WorkloadOptions, requests, cfg, target, free: bool = False):
    """The memory policies' shared budget: --kv-memory, else with a model what the device
    has free beside the weights (read before the model is built), else the slot count's
    worth. target: the run's Target, or (simulated) a dtype name."""
    from benchbatch.core import kvceiling
    from benchbatch.experiments.occupancy import memory as mprobe

    dtype = target if isinstance(target, str) else target.dtype_name
    tp = 1 if isinstance(target, str) else target.tp  # each rank's memory, beside its shard
    kv_bytes, source = None, ""
    if opts.kv_memory is not None:
        kv_bytes, source = int(opts.kv_memory * mprobe.GIB), f"--kv-memory {opts.kv_memory:g} GiB"
    elif free:
        from benchbatch.runtime import device as devices

        kv_bytes = kvceiling.kv_room(cfg, dtype, devices.free_memory_bytes(target.device), tp)
        source = "what the device has free beside the weights (a tenth held back)"
    reserve = mprobe.reserve_output(requests, workload.max_output, workload.trace)
    bpt = mprobe.bytes_per_token(cfg, dtype, tp)
    setup = mprobe.setup(requests, workload.slots, opts.block_size, reserve, bpt, kv_bytes,
                         source)  # fmt: skip
    return dataclasses.replace(setup, source=f"{setup.source}; {cfg.name} in {dtype}")


def _served(requests, workload: WorkloadOptions, model: ModelOptions, stop_at_eos: bool):
    """The requests as the real engine serves them: real prompts (--prompts), and with
    --stop-at-eos every output capped at --max-output instead of forced to its drawn length."""
    cap = workload.max_output if stop_at_eos else None
    if workload.prompts is not None:
        from benchbatch.core.prompts import prompt_token_ids
        from benchbatch.core.workload import with_prompts

        return with_prompts(requests, prompt_token_ids(workload.prompts, model.model), cap)
    if cap is not None:
        return [dataclasses.replace(r, output_tokens=cap) for r in requests]
    return requests


def _stop_tokens(model: ModelOptions, vocab: int) -> frozenset[int]:
    from benchbatch.core.checkpoint_config import eos_token_ids

    return eos_token_ids(model.model, vocab)


def _check_real(cfg, requests, workload: WorkloadOptions) -> None:
    """A prompt alone longer than the model's context is the fault of the option that made
    it (--prompts, --trace, --long-prompt-len, --prompt-len), a prompt plus its output the
    output's."""
    check_prompt_ids(cfg.vocab, requests)
    prompt, output = length_options(workload, requests)
    check_fits(cfg.max_context, requests, prompt=prompt, output=output)


# --- simulation --------------------------------------------------------------------------------


def simulate_part(rec, first, workload: WorkloadOptions, seeds: int, seed: int):
    """occupancy.csv (every seed), occupancy_seeds.csv (spread), timeline.csv (run-length
    form) and the figure (first seed), for occupancy and reproduce. Returns the first seed's
    simulations and the article's claim as they measure it."""
    from benchbatch.core.simulate import TIMELINE_FORM
    from benchbatch.experiments.occupancy import probe
    from benchbatch.output.plots.occupancy import occupancy_figure

    sims = probe.simulate(first, workload.slots)
    rows = probe.occupancy(sims, None if workload.trace else seed)
    for s in range(seed + 1, seed + seeds):
        rows += probe.occupancy(probe.simulate(workload.draw(s), workload.slots), s)
    rec.put("occupancy", rows)
    if seeds > 1:
        rec.put("occupancy_seeds", probe.seed_spread(rows))
    from benchbatch.core.simulate import timeline_table

    timeline = timeline_table(sims)
    rec.put("timeline", timeline)
    rec.meta["timeline_form"] = TIMELINE_FORM
    title = probe.title(first, workload.slots)
    occupancy_figure(timeline, rows[:2], rec.folder / "occupancy.png", title)
    return sims, probe.summary(rows[:2])


def memory_part(rec, requests, setup, cost) -> dict | None:
    """memory.csv, memory_timeline.csv and memory.png: the memory policies on one budget
    (occupancy). Returns their simulations (None when the workload is too large)."""
    from benchbatch.experiments.occupancy import memory as mprobe
    from benchbatch.output.plots.memory import memory_figure

    if len(requests) > MAX_MEMORY_REQUESTS:
        rec.note(
            f"memory policies skipped: they simulate step by step, up to "
            f"{MAX_MEMORY_REQUESTS:,} requests (this workload has {len(requests):,})"
        )
        return None
    work = memory_work(requests, setup)
    if work > MAX_MEMORY_WORK:
        from benchbatch.core.workload import Workload

        longest = int(Workload.of(requests).output_tokens.max())
        trace = rec.meta.get("options", {}).get("trace")
        lower = "shorter outputs in --trace" if trace else "a smaller --max-output or --requests"
        rec.note(
            f"memory policies skipped: they simulate step by step, up to {MAX_MEMORY_WORK:,} "
            f"steps' work (this workload: about {work:,}, its longest output {longest:,} "
            f"tokens); {lower} to run them"
        )
        return None
    sims = mprobe.simulate(requests, setup, cost)
    rows = mprobe.rows(sims, setup, requests)
    rec.put("memory", rows)
    timeline = mprobe.timeline(sims, setup)
    rec.put("memory_timeline", timeline)
    rec.meta["memory"] = {"budget": _budget(setup), **mprobe.claim(rows)}
    title = f"{len(requests):,} requests on one KV budget: {_budget(setup)}"
    memory_figure(timeline, rows, rec.folder / "memory.png", title)
    return sims


def memory_work(requests, setup) -> int:
    """The memory policies' work, bounded before they run: their steps plus their tokens (a
    step costs about three tokens). With S reserved slots (the budget's), the last arrival
    at step A and the longest output L: static-reserve runs groups of S, each as long as its
    longest (with arrivals at most A + L + twice the groups of S taken in order);
    continuous batching refills slots, so at most A + total / S + L (list scheduling)."""
    import numpy as np

    from benchbatch.core.workload import Workload

    w = Workload.of(requests)
    outputs = w.output_tokens.astype(np.int64)
    slots = max(1, min(setup.slots, len(outputs)))  # a huge budget still runs all at once
    wait, longest = int(w.arrival_step.max(initial=0)), int(outputs.max(initial=0))
    pad = -len(outputs) % slots
    padded = np.concatenate([outputs, np.zeros(pad, np.int64)])
    groups = int(padded.reshape(-1, slots).max(axis=1).sum())
    static = groups if wait == 0 else wait + longest + 2 * groups
    total = int(outputs.sum())
    continuous = wait + -(-total // slots) + longest
    return static + 2 * continuous + total


def _budget(s) -> str:
    size = f"{figure(s.budget_bytes / 2**30)} GiB, " if s.budget_bytes is not None else ""
    return f"{size}{s.blocks:,} blocks of {s.block_size} tokens ({s.source})"
