"""`benchbatch sweep`: batch size against decode throughput and step latency."""

from __future__ import annotations

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.experiments.sweep.options import SweepOptions
from benchbatch.runtime import distributed


def open_run(opts: SweepOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions):
    from benchbatch.experiments import common as c

    requests = workload.draw(run.seed)  # checks a --trace before any folder is made

    def check(cfg) -> None:
        """The batches' contexts, and the workload whose sequences memory_ceiling.csv
        counts: a prompt past the model's context is none it can hold."""
        from benchbatch.core.fits import check_prompt_fits, length_options

        opts.check(cfg)  # a longer output is clipped (memory_ceiling), not refused
        check_prompt_fits(cfg.max_context, requests, length_options(workload, requests)[0])

    return c.open_model_run("sweep", model, run, opts, workload, check=check)


def measure_run(
    rec, opts: SweepOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """sweep.csv and memory_ceiling.csv; metadata keeps what the view shows (the free
    memory, the largest batch of each context, the summaries)."""
    from benchbatch.experiments import ceilings as roofs
    from benchbatch.experiments import common as c
    from benchbatch.experiments.sweep import probe
    from benchbatch.runtime import device as devices

    requests = workload.draw(run.seed)  # the same requests open_run checked (seeded)
    # Read before the model exists: max_batch subtracts the weights itself. Under
    # torchrun every rank holds a shard: the least free memory of any rank bounds it.
    free_bytes = distributed.least(devices.free_memory_bytes(rec.target.device))
    paged = opts.block_size if opts.kv_layout == "paged" else None
    ceiling = probe.ceilings(rec.cfg, rec.target.dtype_name, opts.context, free_bytes,
                             rec.target.tp, paged)  # fmt: skip
    memory_ceiling(rec, requests, workload, opts, free_bytes)
    roof = roofs.use_ceilings(rec, run)
    ridge, ridge_source = _ridge(rec.target, roof, run.roofline)
    rec.meta.update(
        batches=list(opts.batches(rec.target)),  # as planned: options.batch is None by default
        free_memory_bytes_before_model=free_bytes,
        predicted_max_batch={str(k): v for k, v in ceiling.items()},
        ridge_flop_per_byte=ridge,
        ridge_source=ridge_source,
    )
    net, _ = c.build_model(rec, model, run)
    _estimate(rec, net, opts, ceiling, run)
    try:
        rows, summary = measure(rec, net, opts, ceiling, ridge, run, no_ridge=ridge_source)
    except KeyboardInterrupt:
        from benchbatch.signals import signals_held

        with signals_held():  # a second Ctrl-C waits: arithmetic on the rows on disk
            _interrupted_summary(rec, net.cfg, opts, ceiling, ridge, ridge_source)
        raise
    c.say_allreduce_over_step(rec, rows, lambda r: f"batch {r['batch']} at context {r['context']}")
    if roof is not None:
        rec.meta["ridge_flop_per_byte"], _ = _ridge(rec.target, rec.ceilings, run.roofline)
    rec.meta["knees"] = {str(s["context"]): _knees(s) for s in summary}
    rec.meta["summary"] = summary
    rec.meta["untrusted"] = rec.untrusted("sweep", _row_name)
    if roof and any(r["status"] == "ok" for r in rows):
        roofs.roofline_plot(rec, rows, "sweep", c.title(rec, "roofline", rows))


def _interrupted_summary(rec, cfg, opts: SweepOptions, ceiling: dict, ridge,
                         no_ridge: str) -> None:  # fmt: skip
    """A sweep cut short (Ctrl-C): the summary and knees of the contexts whose every
    planned batch has its row (metadata's, result.json's), the others left out, said in
    metadata's summary_of (it kept none: the measured contexts' claims were lost)."""
    from benchbatch.experiments.sweep import probe

    rows = rec.rows("sweep")
    planned = probe.plan(opts.context, opts.batches(rec.target))
    whole = [c for c in opts.context
             if sum(r["context"] == c for r in rows) == sum(s.context == c for s in planned)]
    if rec.ceilings is not None:
        ridge = rec.ceilings.ridge
    mine = [r for r in rows if r["context"] in whole]
    summary = probe.summarize(mine, cfg, rec.target.dtype_name,
                              {c: ceiling[c] for c in whole}, ridge, opts.knee_threshold,
                              rec.target.tp, no_ridge)  # fmt: skip
    rec.meta["summary"] = summary
    rec.meta["knees"] = {str(s["context"]): _knees(s) for s in summary}
    rec.meta["summary_of"] = {"contexts": whole, "interrupted": True,
                              "left_out": [c for c in opts.context if c not in whole]}
    rec.note(f"{len(rows):,} of the {len(planned):,} planned steps have their rows: a "
             "context's batches are timed together, in groups written as each ends, so the "
             "group in progress at the interrupt has none; the summary keeps the contexts "
             f"measured whole ({', '.join(map(str, whole)) or 'none'})")


def _estimate(rec, net, opts: SweepOptions, ceiling: dict, run: RunOptions) -> None:
    """The run's duration first (batches over the memory ceiling are skipped: free), and a
    shorter one when it is long: two batches (the claim compares them) are kept."""
    from benchbatch.experiments import common as c
    from benchbatch.experiments.sweep import probe

    batches = opts.batches(rec.target)
    lists = {"batch": batches, "context": opts.context}
    keep = {"batch": min(2, len(batches))}

    def plan_of(ls: dict) -> list:
        steps = probe.plan(ls["context"], ls["batch"])
        return [s for s in steps if opts.try_oom or s.batch <= ceiling[s.context]]

    c.estimate_run(rec, net, run, lists, keep, plan_of)


def measure(rec, net, opts: SweepOptions, ceiling: dict, ridge, run: RunOptions, timing=None,
            no_ridge: str = "unknown device"):  # fmt: skip
    """sweep.csv as each step is measured, its summary per context and sweep.png (sweep and
    reproduce, whose `timing` measures a noisy group again). Batches over the memory
    ceiling are skipped unless --try-oom; `no_ridge` says why `ridge` is None."""
    from benchbatch.core import energy
    from benchbatch.experiments import ceilings as roofs
    from benchbatch.experiments import common as c
    from benchbatch.experiments.sweep import probe
    from benchbatch.output.plots.sweep import sweep_figure

    dtype = rec.target.dtype_name
    plan = probe.plan(opts.context, opts.batches(rec.target))
    steps = probe.rows(net, dtype, plan, timing or run.timing(), ceiling, opts.try_oom,
                       run.cuda_graphs, opts.kv_layout, opts.block_size)  # fmt: skip
    price = getattr(opts, "price_per_hour", None)  # --price-per-hour: the cost columns
    steps = ({**r, **energy.step_cost_columns(r, price)} for r in steps)
    rows = rec.record("sweep", steps, total=len(plan), expected_s=c.expected_s(rec, len(plan)))
    rec.meta["energy"] = energy.summary(rows)  # the counter, or "not available" and why
    if rec.ceilings is not None:  # as the rows were placed: raised if a row beat the probe
        ridge = rec.ceilings.ridge
    summary = probe.summarize(rows, net.cfg, dtype, ceiling, ridge, opts.knee_threshold,
                              rec.target.tp, no_ridge)  # fmt: skip
    if any(r["status"] == "ok" for r in rows):  # nothing to draw when all were skipped
        title = c.title(rec, "decode batch sweep", rows)
        sweep_figure(rows, summary, rec.folder / "sweep.png", title)
        roofs.allreduce_plot(rec, rows, "each decode step's all-reduces")
    return rows, summary


def memory_ceiling(rec, requests, workload: WorkloadOptions, opts, free_bytes: int) -> None:
    """memory_ceiling.csv and its metadata: reserved against paged sequences for the
    workload's lengths on the free memory (and on --gpu's datasheet memory)."""
    from benchbatch.core import kvceiling
    from benchbatch.experiments.occupancy import memory as mprobe

    where = "free GPU memory" if rec.target.device.type == "cuda" else "available RAM"
    memories = [(f"this device ({where})", free_bytes)]
    if opts.gpu is not None:
        peak = opts.datasheet()
        memories.append((f"{peak.name} ({peak.memory_gib:g} GiB datasheet)",
                         kvceiling.datasheet_bytes(peak.memory_gib)))  # fmt: skip
    reserve = mprobe.reserve_output(requests, workload.max_output, workload.trace)
    found = kvceiling.for_workload(rec.cfg, rec.target.dtype_name, requests, reserve,
                                   opts.block_size, memories, rec.target.tp)  # fmt: skip
    if kvceiling.clipped_lengths(rec.cfg, requests, reserve):
        rec.note(f"memory ceiling: the workload's prompts plus outputs (each reserving "
                 f"{reserve:,} output tokens) pass the model's context, "
                 f"{rec.cfg.max_context:,} tokens; no "
                 "sequence grows past it (a server caps its output there), so each is "
                 "counted at most that long")  # fmt: skip
    rows = [c.row() for c in found]
    rec.put("memory_ceiling", rows)
    rec.meta["memory_ceiling"] = rows


def _ridge(target, measured, roofline: bool = True) -> tuple[float | None, str]:
    """The ridge point: measured on this device when probed, else a known GPU's datasheet;
    a CPU or an unknown GPU without a probe gets no prediction, nor does --no-roofline
    (said as the reason, not as an unknown device)."""
    from benchbatch.core import peaks
    from benchbatch.runtime import device as devices

    if measured is not None:
        return measured.ridge, (
            f"measured ({measured.tflops_source}, {measured.gbps_source}) {measured.dtype}"
        )
    name = devices.device_name(target.device)
    peak = peaks.lookup(name) if target.device.type == "cuda" else None
    if peak is None:
        if not roofline:
            return None, "--no-roofline: no ceilings measured"
        return None, f"unknown device ({name})"
    return peak.ridge(target.dtype_name), f"datasheet {peak.name} {target.dtype_name}"


def _knees(s: dict) -> dict:
    keys = ("measured_knee", "knee_threshold", "predicted_knee", "predicted_knee_note")
    return {k: s[k] for k in keys} | {"matmul_knee": s["matmul_knee"]}


def _row_name(r: dict) -> str:
    return f"ctx {r['context']} batch {r['batch']}"
