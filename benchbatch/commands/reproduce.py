"""`benchbatch reproduce`: the article's measurements in one command, one folder, one report.

probe (the device's measured ceilings), phases (table B), sweep (table A) and occupancy
(experiment C, simulated; on the model too with --real) run in turn on one model; the
phases and sweep rows gain mfu, mbu and bound from the probe's ceilings; every CSV and plot
lands in one folder with one metadata.json, a roofline of every step, and report.md /
report.html setting each number beside the article's with a verdict per claim.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from benchbatch import device as devices
from benchbatch import peaks, report, results, roofline
from benchbatch.commands import common as c
from benchbatch.commands.phases import check_lengths
from benchbatch.commands.phases import summary as phases_summary
from benchbatch.commands.probe import summary as probe_summary
from benchbatch.commands.render import fmt
from benchbatch.config import ModelConfig
from benchbatch.engines.engine import Engine, check_fits
from benchbatch.engines.model import Transformer
from benchbatch.engines.simulate import timeline_rows
from benchbatch.engines.workload import Request
from benchbatch.errors import UserError
from benchbatch.plots.occupancy import engine_figure, occupancy_figure
from benchbatch.plots.phases import phases_figure
from benchbatch.plots.roofline import roofline_figure
from benchbatch.plots.sweep import sweep_figure
from benchbatch.probes import ceilings as ceiling_probes
from benchbatch.probes import occupancy as occupancy_probe
from benchbatch.probes import phases as phases_probe
from benchbatch.probes import sweep as sweep_probe
from benchbatch.timing import TimingOptions

KNEE_THRESHOLD = 0.25  # sweep's default: a step 25% slower than the smallest batch's
WORKLOAD = "Workload (experiment C)"


@dataclass(frozen=True)
class Sizes:
    """What one reproduction measures: the article's sizes on CUDA, a CPU-sized run else."""

    preset: str
    prefill: str
    decode_batch: str
    batch: str
    real_requests: int  # the real engine's workload (--real)
    real_slots: int
    real_max_output: int


SIZES = {
    "cuda": Sizes("article", "512,2048", "1,32", "1,8,32,128,256", 600, 32, 2000),
    # The article's prompts and all but its largest batch on a small model: under 30 s of
    # measurements on 2 idle cores (cpu-small: hidden 512, 4 layers). --real runs 128
    # requests on the article's 32 slots, outputs up to 400 tokens: 1,853 steps in all (2.3x
    # fewer for continuous batching, simulated), about a minute and a half.
    "cpu": Sizes("cpu-small", "512,2048", "1,32", "1,8,32,64,128", 128, 32, 400),
}


@dataclass(frozen=True)
class Job:
    """Every input of a reproduction, checked."""

    cfg: ModelConfig
    target: devices.Target
    prompts: list[int]
    decode_batches: list[int]
    batches: list[int]
    context: int
    opts: TimingOptions
    probe_plan: list[ceiling_probes.Probe]
    cuda_graphs: bool
    seed: int
    requests: int
    slots: int
    median: float
    sigma: float
    max_output: int
    prompt_len: int
    real: bool
    real_requests: int
    real_slots: int
    real_max_output: int
    cpu_sized: bool


def reproduce(
    prefill: Annotated[
        str | None,
        typer.Option(help="Prompt lengths to prefill (table B). Default: 512,2048."),
    ] = None,
    decode_batch: Annotated[
        str | None, typer.Option(help="Decode batch sizes of table B. Default: 1,32.")
    ] = None,
    batch: Annotated[
        str | None,
        typer.Option(
            help="Batch sizes of the sweep (table A). Default: 1,8,32,128,256; CPU 1,8,32,64,128."
        ),
    ] = None,
    context: Annotated[
        int, typer.Option(help="Tokens already in each sequence's KV cache when it decodes.")
    ] = 512,
    requests: Annotated[
        int, typer.Option(help="Requests of the simulated workload.", rich_help_panel=WORKLOAD)
    ] = 600,
    slots: Annotated[
        int,
        typer.Option(help="Slots (sequences at once) of the simulation.", rich_help_panel=WORKLOAD),
    ] = 32,
    median: Annotated[
        float, typer.Option(help="Median output length (tokens).", rich_help_panel=WORKLOAD)
    ] = 70,
    sigma: Annotated[
        float, typer.Option(help="Lognormal sigma of the output lengths.", rich_help_panel=WORKLOAD)
    ] = 0.9,
    max_output: Annotated[
        int, typer.Option(help="Output lengths are clipped to this.", rich_help_panel=WORKLOAD)
    ] = 2000,
    prompt_len: Annotated[
        int, typer.Option(help="Prompt tokens of every request.", rich_help_panel=WORKLOAD)
    ] = 64,
    real: Annotated[
        bool,
        typer.Option(
            "--real",
            help="Also run static and continuous batching on the model and time them (CUDA: "
            "the simulated workload; CPU: 128 requests, 32 slots, outputs up to 400 tokens).",
            rich_help_panel=WORKLOAD,
        ),
    ] = False,
    real_requests: Annotated[int | None, typer.Option(hidden=True)] = None,
    real_slots: Annotated[int | None, typer.Option(hidden=True)] = None,
    real_max_output: Annotated[int | None, typer.Option(hidden=True)] = None,
    probe_sizes: Annotated[str | None, typer.Option(hidden=True)] = None,
    probe_buffer_mb: Annotated[int | None, typer.Option(hidden=True)] = None,
    preset: c.PresetOpt = None,
    config: c.ConfigOpt = None,
    hidden: c.HiddenOpt = None,
    layers: c.LayersOpt = None,
    heads: c.HeadsOpt = None,
    kv_heads: c.KvHeadsOpt = None,
    intermediate: c.IntermediateOpt = None,
    vocab: c.VocabOpt = None,
    max_context: c.MaxContextOpt = None,
    seed: c.SeedOpt = 0,
    device: c.DeviceOpt = "auto",
    dtype: c.DtypeOpt = None,
    repeats: c.RepeatsOpt = 5,
    min_time: c.MinTimeOpt = 0.2,
    cuda_graphs: c.CudaGraphsOpt = True,
    out: c.OutOpt = None,
    force: c.ForceOpt = False,
    json_out: c.JsonOpt = False,
) -> None:
    """The article's tables B and A and experiment C on this device, in one folder with a
    report (report.md, report.html) that sets each number beside the article's and says
    which claims hold here.

    probe -> phases -> sweep -> occupancy, on one model with random weights. On CUDA the
    article's sizes (12 layers, hidden 2048, fp16); without CUDA a CPU-sized model
    (cpu-small: hidden 512, 4 layers, fp32) and batches up to 128, under a minute on 2
    cores (--real adds about a minute and a half).
    """
    target = c.resolve_target(device, dtype)
    sizes = SIZES["cuda" if target.device.type == "cuda" else "cpu"]
    model_opts = dict(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
        max_context=max_context,
    )
    cfg = c.build_config(preset, config, default=sizes.preset, **model_opts)
    job = Job(
        cfg=cfg,
        target=target,
        prompts=c.parse_int_list(prefill or sizes.prefill, "--prefill"),
        decode_batches=c.parse_int_list(decode_batch or sizes.decode_batch, "--decode-batch"),
        batches=c.parse_int_list(batch or sizes.batch, "--batch"),
        context=context,
        opts=c.timing_options(repeats, min_time),
        probe_plan=_probe_plan(target, probe_sizes, probe_buffer_mb),
        cuda_graphs=cuda_graphs,
        seed=seed,
        requests=requests,
        slots=slots,
        median=median,
        sigma=sigma,
        max_output=max_output,
        prompt_len=prompt_len,
        real=real,
        real_requests=real_requests or sizes.real_requests,
        real_slots=real_slots or sizes.real_slots,
        real_max_output=real_max_output or sizes.real_max_output,
        cpu_sized=target.device.type != "cuda",
    )
    _check(job)
    folder = results.run_dir(out, "reproduce", force)
    if not json_out:
        for line in header_lines(job):
            c.out_console.print(line, highlight=False)
    run = c.start_run(folder, "reproduce", target, cfg, _options(job))
    run.meta.update(cpu_sized=job.cpu_sized, parts={})
    with c.recording(run, target), c.progress(json_out) as bar:
        built = _run_parts(run, job, bar, json_out)
    _terminal(run, built, json_out)


def _probe_plan(target, sizes: str | None, buffer_mb: int | None) -> list[ceiling_probes.Probe]:
    default = ceiling_probes.default_plan(target.device)
    matmuls = (
        c.parse_int_list(sizes, "--probe-sizes")
        if sizes is not None
        else [p.size for p in default if p.kind == "matmul"]
    )
    if buffer_mb is not None and buffer_mb <= 0:
        raise UserError("--probe-buffer-mb", "must be a positive number of MiB")
    buffer = buffer_mb * ceiling_probes.MiB if buffer_mb is not None else default[-1].size
    return ceiling_probes.plan(matmuls, buffer)


def _check(job: Job) -> None:
    check_lengths(job.cfg.max_context, job.prompts, job.context)
    for option, value in (
        ("--requests", job.requests),
        ("--slots", job.slots),
        ("--max-output", job.max_output),
        ("--prompt-len", job.prompt_len),
    ):
        if value < 1:
            raise UserError(option, f"must be at least 1, got {value}")
    _sim_workload(job)  # its own checks (--median, --sigma), before any folder is made
    if job.real:
        check_fits(job.cfg.max_context, _real_workload(job))


def _options(job: Job) -> dict:
    keep = (
        "prompts", "decode_batches", "batches", "context", "cuda_graphs", "seed", "requests",
        "slots", "median", "sigma", "max_output", "prompt_len", "real", "real_requests",
        "real_slots", "real_max_output",
    )  # fmt: skip
    out = {k: getattr(job, k) for k in keep}
    out |= {"repeats": job.opts.min_repeats, "min_time": job.opts.min_time_s}
    return out | {"probe": [p.label for p in job.probe_plan]}


def header_lines(job: Job) -> list[str]:
    """What runs, on what; first of all whether this is the article's run or a CPU-sized one."""
    cfg, t = job.cfg, job.target
    lines = []
    if job.cpu_sized:
        lines.append(cpu_notice(job))
    lines.append(
        f"device: {devices.device_name(t.device)} ({t.device}), {t.dtype_name}; model "
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, random weights"
    )
    real = (
        f"; real engine: {job.real_requests} requests, {job.real_slots} slots" if job.real else ""
    )
    lines.append(
        f"parts: probe, phases (prefill {_list(job.prompts)}; decode batch "
        f"{_list(job.decode_batches)} at context {job.context:,}), sweep (batch "
        f"{_list(job.batches)}), occupancy ({job.requests:,} requests, {job.slots} slots, "
        f"simulated{real})"
    )
    return lines


def cpu_notice(job: Job) -> str:
    cfg = job.cfg
    return (
        f"CPU-sized run: no CUDA device, so a small model ({cfg.name}: hidden {cfg.hidden}, "
        f"{cfg.layers} layers, {job.target.dtype_name}), prefill {_list(job.prompts)} and "
        f"batches up to {job.batches[-1]:,}. Times are not comparable with the article's GPU; "
        "the claims are about ratios, and the verdicts say which of them hold on this CPU."
    )


def _list(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


# --- the parts -------------------------------------------------------------------------------


@dataclass
class Built:
    """What the parts produced, for the report and the terminal."""

    report: report.Report | None = None
    ceilings: roofline.Ceilings | None = None


def _run_parts(run, job: Job, bar, quiet: bool) -> Built:
    built = Built()
    # The sweep's memory ceiling subtracts the weights itself: read free memory first.
    free_bytes = devices.free_memory_bytes(job.target.device)
    with _part(run, "probe", quiet):
        built.ceilings = _probe(run, job, bar)
    model = Transformer(job.cfg, job.target.device, job.target.dtype, job.seed)
    with _part(run, "phases", quiet):
        _phases(run, job, model, built.ceilings, bar)
    with _part(run, "sweep", quiet):
        _sweep(run, job, model, built.ceilings, free_bytes, bar)
    _roofline(run, job, built.ceilings)
    with _part(run, "occupancy", quiet):
        _occupancy(run, job)
    if job.real:
        with _part(run, "occupancy, real engine", quiet):
            _real(run, job, model, bar)
    del model
    devices.release_memory(job.target.device)
    built.report = _write_report(run, job)
    return built


@contextlib.contextmanager
def _part(run, name: str, quiet: bool):
    """Times a part into metadata and says when it is done (stderr; the bar is transient)."""
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    run.meta["parts"][name] = round(seconds, 3)
    run.write_meta()
    if not quiet:
        c.err_console.print(f"{name}: done in {seconds:.1f} s", highlight=False)


def _probe(run, job: Job, bar) -> roofline.Ceilings:
    task = bar.add_task("probe", total=len(job.probe_plan))
    dev, dtype = job.target.device, job.target.dtype_name
    for row in ceiling_probes.run(job.probe_plan, dev, dtype, job.opts):
        run.add("probe", row)
        bar.advance(task)
    try:
        ceilings = roofline.ceilings_from_rows(run.rows("probe"))
    except ValueError as e:
        raise UserError("--probe-sizes", f"no ceiling could be measured: {e}") from None
    run.meta["probe"] = probe_summary(ceilings, _peak(job))
    return ceilings


def _peak(job: Job) -> peaks.Peak | None:
    return peaks.lookup(devices.device_name(job.target.device))


def _phases(run, job: Job, model, ceilings, bar) -> None:
    steps = phases_probe.plan(job.prompts, job.decode_batches, job.context)
    task = bar.add_task("phases", total=len(steps))
    dtype = job.target.dtype_name
    for row in phases_probe.run(model, dtype, steps, job.opts, job.cuda_graphs):
        run.add("phases", roofline.annotate(row, ceilings))
        bar.advance(task)
    rows = run.rows("phases")
    phases_figure(rows, run.folder / "phases.png", _title(job, "prefill vs decode"))
    run.meta["phases"] = phases_summary(rows)


def _sweep(run, job: Job, model, ceilings, free_bytes: int, bar) -> None:
    dtype, contexts = job.target.dtype_name, [job.context]
    ceiling = sweep_probe.ceilings(job.cfg, dtype, contexts, free_bytes)
    steps = sweep_probe.plan(contexts, job.batches)
    task = bar.add_task("sweep", total=len(steps))
    for row in sweep_probe.run(model, dtype, steps, job.opts, ceiling, False, job.cuda_graphs):
        run.add("sweep", roofline.annotate(row, ceilings))
        bar.advance(task)
    rows = run.rows("sweep")
    # The roofline knee on this device's measured ridge, not a datasheet's.
    summary = sweep_probe.summarize(rows, job.cfg, dtype, ceiling, ceilings.ridge, KNEE_THRESHOLD)
    run.meta["sweep"] = summary
    run.meta["ridge_source"] = "measured (probe)"
    sweep_figure(rows, summary, run.folder / "sweep.png", _title(job, "decode batch sweep"))


def _roofline(run, job: Job, ceilings) -> None:
    """Every probe, phases and sweep point under this device's measured roofs."""
    points = [{**r, "source": "probe"} for r in run.rows("probe") if r["kind"] != "copy"]
    points += [{**r, "source": "phases"} for r in run.rows("phases")]
    points += [{**r, "label": f"b={r['batch']}", "source": "sweep"} for r in run.rows("sweep")]
    roofline_figure(
        points, ceilings, run.folder / "roofline.png", _peak(job), _title(job, "roofline")
    )


def _title(job: Job, what: str) -> str:
    cfg, t = job.cfg, job.target
    return (
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {t.dtype_name}, "
        f"{devices.device_name(t.device)}: {what}"
    )


# --- experiment C ----------------------------------------------------------------------------


def _workload(job: Job, requests: int, max_output: int) -> list[Request]:
    return occupancy_probe.workload(
        requests,
        median=job.median,
        sigma=job.sigma,
        max_output=max_output,
        prompt_len=job.prompt_len,
        arrival_rate=None,
        seed=job.seed,
        trace=None,
    )


def _sim_workload(job: Job) -> list[Request]:
    return _workload(job, job.requests, job.max_output)


def _real_workload(job: Job) -> list[Request]:
    return _workload(job, job.real_requests, job.real_max_output)


def describe_workload(requests: list[Request], slots: int) -> str:
    outputs = sorted(r.output_tokens for r in requests)
    return (
        f"{len(requests):,} requests (output median {outputs[len(outputs) // 2]:,}, max "
        f"{outputs[-1]:,} tokens), {slots} slots, all queued"
    )


def _occupancy(run, job: Job) -> None:
    """The article's simulation: occupancy.csv, timeline.csv and its figure."""
    requests = _sim_workload(job)
    sims = occupancy_probe.simulate(requests, job.slots)
    rows = occupancy_probe.occupancy(sims, job.seed)
    run.put("occupancy", rows)
    timeline = timeline_rows(sims)
    run.put("timeline", timeline)
    workload = describe_workload(requests, job.slots)
    run.meta["occupancy"] = {"workload": workload, **occupancy_probe.summary(rows)}
    title = f"{workload}: active slots per step (simulated)"
    occupancy_figure(timeline, rows, run.folder / "occupancy.png", title)


def _real(run, job: Job, model, bar) -> None:
    """Both policies on the model, on the real workload (smaller on a CPU): engine.csv,
    engine_steps.csv and engine.png, as `benchbatch occupancy --engine real` writes them."""
    requests = _real_workload(job)
    sims = occupancy_probe.simulate(requests, job.real_slots)
    steps: list[dict] = []
    static_wall = None
    for policy in occupancy_probe.POLICIES:
        task = bar.add_task(f"{policy} (real)", total=sims[policy].total_steps)
        engine = Engine(model, policy, job.real_slots, job.seed)
        try:
            result = engine.run(requests, on_step=lambda record, t=task: bar.advance(t))
        finally:  # interrupted or not, every measured step reaches the disk
            run.put("engine_steps", steps + occupancy_probe.step_rows(engine.result))
        steps += occupancy_probe.step_rows(result)
        static_wall = result.wall_s if policy == "static" else static_wall
        run.add("engine", occupancy_probe.engine_row(result, sims[policy], static_wall))
    rows = run.rows("engine")
    workload = describe_workload(requests, job.real_slots)
    run.meta["engine"] = {"workload": workload, **occupancy_probe.engine_summary(rows, sims)}
    engine_figure(steps, rows, run.folder / "engine.png", _title(job, f"real engine, {workload}"))


# --- report ----------------------------------------------------------------------------------

FILE_ORDER = (
    "report.md", "report.html", "metadata.json", "probe.csv", "phases.csv", "phases.png",
    "sweep.csv", "sweep.png", "roofline.png", "occupancy.csv", "timeline.csv",
    "occupancy.png", "engine.csv", "engine_steps.csv", "engine.png",
)  # fmt: skip


def _write_report(run, job: Job) -> report.Report:
    folder = run.folder
    files = [f for f in FILE_ORDER if (folder / f).exists() or f.startswith("report.")]
    sweep = run.meta.get("sweep") or [{}]
    built = report.build(
        title=f"benchbatch reproduce: {devices.device_name(job.target.device)}",
        notices=[cpu_notice(job)] if job.cpu_sized else [],
        facts=_facts(run, job),
        phases_rows=run.rows("phases"),
        phases_summary=run.meta.get("phases"),
        sweep_rows=run.rows("sweep"),
        sweep_claim=sweep[0],
        occupancy_rows=run.rows("occupancy"),
        occupancy_workload=run.meta["occupancy"]["workload"],
        real_rows=run.rows("engine") or None,
        real_workload=run.meta.get("engine", {}).get("workload"),
        ceilings=run.meta.get("probe"),
        files=files,
    )
    run.meta["claims"] = [vars(cl) for cl in built.claims]
    results.atomic_write_text(folder / "report.md", report.to_markdown(built))
    images = {s.image: (folder / s.image).read_bytes() for s in built.sections if s.image}
    results.atomic_write_text(folder / "report.html", report.to_html(built, images))
    return built


def _facts(run, job: Job) -> list[tuple[str, str]]:
    cfg, t, env = job.cfg, job.target, run.meta["environment"]
    facts = [
        ("device", f"{devices.device_name(t.device)} ({t.device}), {t.dtype_name}"),
        (
            "model",
            f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads "
            f"({cfg.kv_heads} KV), MLP {cfg.intermediate}, vocab {cfg.vocab:,}, random weights",
        ),
        ("software", f"torch {env['torch_version']}, benchbatch {env['benchbatch_version']}"),
        (
            "timing",
            f"median of at least {job.opts.min_repeats} repeats and {job.opts.min_time_s} s",
        ),
        ("started", f"{run.meta['started_utc']} ({run.meta['command_line']})"),
    ]
    noisy = noisy_steps(run)
    if noisy:
        facts.append(("noisy (CV over 10%)", ", ".join(noisy)))
    return facts


def noisy_steps(run) -> list[str]:
    """Steps whose repeats spread by more than 10% of their mean: another process, most
    likely, shared the device; their medians are less sure."""
    return [
        f"{r['label']} ({r['cv']:.0%})" if table == "phases" else f"b={r['batch']} ({r['cv']:.0%})"
        for table in ("phases", "sweep")
        for r in run.rows(table)
        if r.get("noisy")
    ]


# --- terminal --------------------------------------------------------------------------------


def _terminal(run, built: Built, json_out: bool) -> None:
    if json_out:
        tables = ("probe", "phases", "sweep", "occupancy", "engine")
        parts = ("probe", "phases", "sweep", "occupancy", "engine")
        c.print_json(
            {
                "folder": str(run.folder),
                "cpu_sized": run.meta["cpu_sized"],
                "claims": run.meta["claims"],
                "summary": {k: run.meta.get(k) for k in parts if k in run.meta},
                "rows": {t: run.rows(t) for t in tables if run.rows(t)},
            }
        )
        return
    out = c.out_console
    out.print(_table_b(run.rows("phases")))
    out.print(_table_a(run.rows("sweep")))
    out.print(_table_c(run.rows("occupancy"), run.rows("engine")))
    for section in built.report.sections:
        if section.title == report.REAL_TITLE:
            for note in section.notes:
                c.err_console.print(f"[yellow]note:[/] {note}", highlight=False)
    m = built.ceilings
    out.print(
        f"measured ceilings ({m.dtype}): matmul {fmt(m.peak_tflops)} TFLOP/s "
        f"({m.tflops_source}), memory {fmt(m.peak_gbps)} GB/s ({m.gbps_source}), ridge "
        f"{fmt(m.ridge)} FLOP/byte",
        highlight=False,
    )
    verdicts = _table("verdicts (thresholds in report.md)", ["", "verdict", "claim"])
    for cl in built.report.claims:
        style = VERDICT_STYLE.get(cl.verdict, "")
        text = f"{cl.claim}\n  article: {cl.article}\n  here: {cl.measured}"
        verdicts.add_row(cl.key, f"[{style}]{cl.verdict}[/]", text)
    for column in verdicts.columns:
        column.justify = "left"
    out.print(verdicts)
    noisy = noisy_steps(run)
    if noisy:
        c.err_console.print(
            f"[yellow]warning:[/] noisy steps (CV over 10%): {', '.join(noisy)}; another "
            "process may share the device: try more --repeats or --min-time."
        )
    out.print(f"report: {run.folder / 'report.md'} (and report.html); every file: {run.folder}")


VERDICT_STYLE = {
    report.HOLDS: "bold green",
    report.PARTLY: "bold yellow",
    report.FAILS: "bold red",
    report.UNMEASURED: "dim",
}


def _table(title: str, headers: list[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    return table


def _table_b(rows: list[dict]) -> Table:
    table = _table(
        "B. prefill vs decode (article row, then this run)",
        ["step", "step ms", "us/token", "TFLOP/s", "MFU", "bound"],
    )
    for e in report.table_b(rows):
        a, m = e["article"], e["measured"]
        table.add_row(
            f"{a.label} (article)", fmt(a.step_ms), fmt(a.us_per_token), fmt(a.tflops), "", "",
            style="dim",
        )  # fmt: skip
        if m is None:
            table.add_row("  not measured", "", "", "", "", "")
            continue
        table.add_row(
            f"  {m['label']}",
            *(_cell(m, k) for k in ("step_ms", "us_per_token", "tflops")),
            _percent(m.get("mfu")),
            str(m.get("bound") or m.get("status")),
        )
    return table


def _table_a(rows: list[dict]) -> Table:
    context = report.sweep_context(rows)
    table = _table(
        f"A. decode step vs batch, context {context:,}",
        ["batch", "ms article", "ms here", "tok/s article", "tok/s here", "MBU"],
    )
    for e in report.table_a(rows):
        m = e["measured"]
        table.add_row(
            f"{e['batch']:,}",
            fmt(e["article_step_ms"]),
            _cell(m, "step_ms"),
            fmt(e["article_tokens_per_s"]),
            _cell(m, "tokens_per_s"),
            _percent(m.get("mbu")) if m else "-",
        )
    return table


def _table_c(rows: list[dict], engine: list[dict]) -> Table:
    table = _table(
        "C. static vs continuous batching (article / this run)",
        ["policy", "steps", "occupancy", "speedup", "wall s"],
    )
    for e in report.table_c(rows):
        m = e["measured"] or {}
        speedup = report.ARTICLE_C_SPEEDUP if e["policy"] == "continuous" else 1.0
        table.add_row(
            f"{e['policy']} (simulated)",
            f"{fmt(e['article_total_steps'])} / {_cell(m, 'total_steps')}",
            f"{e['article_occupancy']:.1%} / {_percent(m.get('occupancy'))}",
            f"{speedup:.3g}x / {_cell(m, 'speedup_vs_static')}x",
            "",
        )
    for m in engine:
        table.add_row(
            f"{m['policy']} (real engine)",
            _cell(m, "total_steps"),
            _percent(m.get("occupancy")),
            f"{_cell(m, 'speedup_vs_static')}x",
            _cell(m, "wall_s"),
        )
    return table


def _cell(row: dict | None, key: str) -> str:
    if not row:
        return "-"
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return str(row.get("status", "-"))
    return fmt(value)


def _percent(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.0%}" if value >= 0.1 else f"{value:.2%}"
