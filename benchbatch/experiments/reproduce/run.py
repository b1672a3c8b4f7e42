"""`benchbatch reproduce`: the article's measurements in one command, one folder, one report.

probe (the device's measured ceilings), phases (table B), sweep (table A) and occupancy
(experiment C, simulated; on the model too with --engine real) run in turn on one model,
through the same parts the phases, sweep, probe and occupancy commands run; every row is
placed against the one set of ceilings the probe measured; every CSV and plot lands in one
folder with one metadata.json, a roofline of every step, and report.md / report.html
setting each number beside the article's with a verdict per claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass

from rich import box
from rich.table import Table
from rich.text import Text

from benchbatch.core.options import ModelOptions, ProbeOptions, RunOptions, WorkloadOptions, use
from benchbatch.core.units import flop_unit
from benchbatch.experiments import common as c
from benchbatch.experiments.phases.options import PhasesOptions
from benchbatch.experiments.reproduce.options import ReproduceOptions
from benchbatch.experiments.sweep.options import SweepOptions
from benchbatch.output import render, report
from benchbatch.output.render import fmt
from benchbatch.runtime import session

KNEE_THRESHOLD = 0.25  # sweep's default: a step 25% slower than the smallest batch's
# The real engine's workload on a CPU: the article's 32 slots, 128 requests, outputs up to
# 400 tokens: 1,853 steps in all (2.3x fewer for continuous batching, simulated), about a
# minute and a half with cpu-small on 2 cores. On CUDA it runs the simulated workload.
CPU_REAL = dict(requests=128, slots=32, max_output=400)
WORKLOAD_FIELDS = ("requests", "slots", "median", "sigma", "max_output", "prompt_len")
RUN_FIELDS = ("device", "dtype", "seed", "repeats", "min_time", "warmup", "threads",
              "cuda_graphs", "compile", "out", "force", "json_out")  # fmt: skip


@dataclass(frozen=True)
class Job:
    """Every part of a reproduction, as the options objects the commands take, checked."""

    phases: PhasesOptions
    sweep: SweepOptions
    workload: WorkloadOptions
    real: WorkloadOptions | None  # the real engine's workload (--engine real), else None
    probe: ProbeOptions
    cpu_sized: bool


@command(
    ReproduceOptions,
    PhasesOptions,
    use(SweepOptions, only=("batch",)),
    use(WorkloadOptions, only=WORKLOAD_FIELDS),
    ProbeOptions,
    ModelOptions,
    use(RunOptions, only=RUN_FIELDS),
)
def reproduce(
    opts: ReproduceOptions,
    phases: PhasesOptions,
    sweep: SweepOptions,
    workload: WorkloadOptions,
    probe: ProbeOptions,
    model: ModelOptions,
    run: RunOptions,
) -> None:
    """The article's tables B and A and experiment C on this device, in one folder with a
    report (report.md, report.html) that sets each number beside the article's and says
    which claims hold here.

    probe -> phases -> sweep -> occupancy, on one model with random weights. On CUDA the
    article's sizes (12 layers, hidden 2048, fp16); without CUDA a CPU-sized model
    (cpu-small: hidden 512, 4 layers, fp32) and batches up to 128, under a minute on 2
    cores (--engine real adds about a minute and a half).
    """
    target = session.target_of(run)
    job = _job(opts, phases, sweep, workload, probe, target)
    check = lambda cfg: _check(job, cfg, target)  # noqa: E731
    parts = (opts, phases, job.sweep, workload, probe)
    header = None if run.json_out else lambda cfg: _header(job, cfg, target)
    cache = None
    if job.real is not None:
        cache = lambda cfg: c.engine_cache(job.real.slots, job.real.draw(run.seed))  # noqa: E731
    rec = c.open_model_run("reproduce", model, run, *parts, check=check, before=header,
                           cache=cache)  # fmt: skip
    rec.meta.update(cpu_sized=job.cpu_sized, parts={})
    with rec:
        built = _run_parts(rec, job, model, run)
    _terminal(rec, built, run.json_out)


def _job(opts, phases, sweep, workload, probe, target) -> Job:
    cuda = target.device.type == "cuda"
    sweep = dataclasses.replace(sweep, batch=sweep.batches(target), context=phases.context,
                                knee_threshold=KNEE_THRESHOLD)  # fmt: skip
    real = None
    if opts.engine == "real":
        sizes = {} if cuda else dict(CPU_REAL)
        given = dict(requests=opts.real_requests, slots=opts.real_slots,
                     max_output=opts.real_max_output)  # fmt: skip
        sizes |= {k: v for k, v in given.items() if v is not None}
        real = dataclasses.replace(workload, **sizes)
    return Job(phases, sweep, workload, real, probe, cpu_sized=not cuda)


def _check(job: Job, cfg, target) -> None:
    from benchbatch.runtime import ceilings as probes
    from benchbatch.runtime.engine import check_fits

    probes.plan_for(target, job.probe)  # its sizes and buffers must fit, as in `probe`
    job.phases.check(cfg)
    job.workload.draw()  # its own checks, before any folder is made
    if job.real is not None:
        check_fits(cfg.max_context, job.real.draw())


def _header(job: Job, cfg, target) -> None:
    for line in header_lines(job, cfg, target):
        render.out_console.print(line, highlight=False)


def header_lines(job: Job, cfg, target) -> list[str]:
    """What runs, on what; first of all whether this is the article's run or a CPU-sized one."""
    from benchbatch.runtime.device import device_name

    lines = [cpu_notice(job, cfg, target.dtype_name)] if job.cpu_sized else []
    lines.append(
        f"device: {device_name(target.device)} ({target.device}), {target.dtype_name}; model "
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, random weights"
    )
    r, w, p = job.real, job.workload, job.phases
    real = f"; real engine: {r.requests} requests, {r.slots} slots" if r else ""
    lines.append(
        f"parts: probe, phases (prefill {_list(p.prefill)}; decode batch "
        f"{_list(p.decode_batch)} at context {_list(p.context)}), sweep (batch "
        f"{_list(job.sweep.batch)}), occupancy ({w.requests:,} requests, {w.slots} slots, "
        f"simulated{real})"
    )
    return lines


def cpu_notice(job: Job, cfg, dtype: str) -> str:
    return (
        f"CPU-sized run: no CUDA device, so a small model ({cfg.name}: hidden {cfg.hidden}, "
        f"{cfg.layers} layers, {dtype}), prefill {_list(job.phases.prefill)} and "
        f"batches up to {job.sweep.batch[-1]:,}. Times are not comparable with the article's "
        "GPU; the claims are about ratios, and the verdicts say which of them hold on this CPU."
    )


def _list(values) -> str:
    return ",".join(str(v) for v in values)


# --- the parts -------------------------------------------------------------------------------


@dataclass
class Built:
    """What the parts produced, for the report and the terminal."""

    report: object = None
    ceilings: object = None


def _run_parts(rec, job: Job, model: ModelOptions, run: RunOptions) -> Built:
    from benchbatch.experiments.occupancy import run as occupancy
    from benchbatch.experiments.phases import probe as phases_probe
    from benchbatch.experiments.phases import run as phases
    from benchbatch.experiments.probe import run as probe
    from benchbatch.experiments.sweep import probe as sweep_probe
    from benchbatch.experiments.sweep import run as sweep
    from benchbatch.runtime import ceilings as probes
    from benchbatch.runtime import device as devices

    built, target = Built(), rec.target
    # A noisy step (or group of steps timed together) is measured once more before its
    # numbers are kept: the verdicts rest on them.
    timing = dataclasses.replace(run.timing(), retry_noisy=1)
    # The sweep's memory ceiling subtracts the weights itself: read free memory first.
    free_bytes = devices.free_memory_bytes(target.device)
    with _part(rec, "probe"):
        rows = probe.measure(rec, probes.plan_for(target, job.probe), run, timing)
        rec.ceilings = built.ceilings = probes.ceilings(rows, "probe_sizes")
        rec.meta["ceilings"] = built.ceilings.to_dict()
        rec.meta["probe"] = probe.summary(built.ceilings, _peak(target))
    net, cfg = c.build_model(rec, model, run, target)
    with _part(rec, "phases"):
        phases_rows = phases.measure(rec, net, job.phases, run, timing)
        rec.meta["phases"] = phases_probe.summary(phases_rows)
    with _part(rec, "sweep"):
        ceiling = sweep_probe.ceilings(cfg, target.dtype_name, job.sweep.context, free_bytes)
        # The roofline knee on this device's measured ridge, not a datasheet's.
        _, rec.meta["sweep"] = sweep.measure(rec, net, job.sweep, ceiling, built.ceilings.ridge,
                                             run, timing)  # fmt: skip
        rec.meta["ridge_source"] = "measured (probe)"
    # The ceilings every row was placed against: the probe's, raised where a step beat it.
    built.ceilings = rec.ceilings
    rec.meta["probe"] = probe.summary(rec.ceilings, _peak(target))
    _roofline(rec)
    with _part(rec, "occupancy"):
        requests = job.workload.draw(run.seed)
        _, claim = occupancy.simulate_part(rec, requests, job.workload, 1, run.seed)
        described = describe_workload(requests, job.workload.slots)
        rec.meta["occupancy"] = {"workload": described, **claim}
    with _part(rec, "memory"):
        _memory(rec, requests, job.workload, free_bytes)
    if job.real is not None:
        with _part(rec, "occupancy, real engine"):
            _real(rec, net, job.real, run.seed)
    with _part(rec, "serving curve"):
        from benchbatch.experiments.serve.run import reproduce_curve

        rec.meta["serve"] = reproduce_curve(rec, run.seed)
    del net
    devices.release_memory(target.device)
    built.report = _write_report(rec, job)
    return built


@contextlib.contextmanager
def _part(rec, name: str):
    """Times a part into metadata and says when it is done (stderr; the bar is transient)."""
    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    rec.meta["parts"][name] = round(seconds, 3)
    rec.write_meta()
    if not rec.quiet:
        render.err_console.print(f"{name}: done in {seconds:.1f} s", highlight=False)


def _peak(target):
    from benchbatch.core import peaks
    from benchbatch.runtime.device import device_name

    return peaks.lookup(device_name(target.device))


def _roofline(rec) -> None:
    """Every probe, phases and sweep point under this device's measured roofs."""
    from benchbatch.output.plots.roofline import roofline_figure

    points = [{**r, "source": "probe"} for r in rec.rows("probe") if r["kind"] != "copy"]
    points += [{**r, "source": "phases"} for r in rec.rows("phases")]
    points += [{**r, "label": f"b={r['batch']}", "source": "sweep"} for r in rec.rows("sweep")]
    roofline_figure(points, rec.ceilings, rec.folder / "roofline.png", _peak(rec.target),
                    c.title(rec, "roofline", points))  # fmt: skip


def _memory(rec, requests, workload: WorkloadOptions, free_bytes: int) -> None:
    """Memory, not compute: the occupancy workload's ceiling reserved against paged on this
    device's free memory (and a known GPU's datasheet memory), memory_ceiling.csv; and the
    memory policies on the slot count's worth, memory.csv and memory.png."""
    from benchbatch.core import kvceiling
    from benchbatch.core.kvblocks import DEFAULT_BLOCK_SIZE as BLOCK
    from benchbatch.experiments.occupancy import memory as mprobe
    from benchbatch.experiments.occupancy.run import memory_part

    cfg, dtype = rec.cfg, rec.target.dtype_name
    where = "free GPU memory" if rec.target.device.type == "cuda" else "available RAM"
    memories = [(f"this device ({where})", free_bytes)]
    peak = _peak(rec.target) if rec.target.device.type == "cuda" else None
    if peak is not None and peak.memory_gib:
        memories.append((f"{peak.name} datasheet", kvceiling.datasheet_bytes(peak.memory_gib)))
    reserve = mprobe.reserve_output(requests, workload.max_output, workload.trace)
    found = kvceiling.for_workload(cfg, dtype, requests, reserve, BLOCK, memories)
    rows = [c.row() for c in found]
    rec.put("memory_ceiling", rows)
    rec.meta["memory_ceiling"] = rows
    per_token = mprobe.bytes_per_token(cfg, dtype)
    setup = mprobe.setup(requests, workload.slots, BLOCK, reserve, per_token, None, "")
    memory_part(rec, requests, setup, None)


def describe_workload(requests, slots: int) -> str:
    outputs = sorted(r.output_tokens for r in requests)
    return (
        f"{len(requests):,} requests (output median {outputs[len(outputs) // 2]:,}, max "
        f"{outputs[-1]:,} tokens), {slots} slots, all queued"
    )


def _real(rec, net, workload: WorkloadOptions, seed: int) -> None:
    """Both policies on the model, on the real workload (smaller on a CPU): engine.csv,
    engine_steps.csv and engine.png, as `benchbatch occupancy --engine real` writes them."""
    from benchbatch.experiments.occupancy import probe
    from benchbatch.experiments.occupancy.run import engine_runs
    from benchbatch.output.plots.occupancy import engine_figure

    requests = workload.draw(seed)
    sims = probe.simulate(requests, workload.slots)
    engine_runs(rec, net, requests, workload.slots, sims, seed)
    rows = rec.rows("engine")
    described = describe_workload(requests, workload.slots)
    rec.meta["engine"] = {"workload": described, **probe.engine_summary(rows, sims)}
    title = c.title(rec, f"real engine, {described}", noise=c.engine_noise(rows))
    engine_figure(rec.rows("engine_steps"), rows, rec.folder / "engine.png", title)


# --- report ----------------------------------------------------------------------------------

FILE_ORDER = (
    "report.md", "report.html", "metadata.json", "probe.csv", "phases.csv", "phases.png",
    "sweep.csv", "sweep.png", "roofline.png", "occupancy.csv", "timeline.csv",
    "occupancy.png", "memory_ceiling.csv", "memory.csv", "memory_timeline.csv", "memory.png",
    "engine.csv", "engine_steps.csv", "engine.png", "serve.csv", "slo.csv", "serve.png",
)  # fmt: skip


def _write_report(run, job: Job):
    from benchbatch.output import results
    from benchbatch.runtime.device import device_name

    folder = run.folder
    files = [f for f in FILE_ORDER if (folder / f).exists() or f.startswith("report.")]
    sweep = run.meta.get("sweep") or [{}]
    notice = cpu_notice(job, run.cfg, run.target.dtype_name)
    built = report.build(
        title=f"benchbatch reproduce: {device_name(run.target.device)}",
        notices=[notice] if job.cpu_sized else [],
        facts=_facts(run, job),
        phases_rows=run.rows("phases"),
        phases_summary=run.meta.get("phases"),
        sweep_rows=run.rows("sweep"),
        sweep_claim=sweep[0],
        occupancy_rows=run.rows("occupancy"),
        occupancy_workload=run.meta["occupancy"]["workload"],
        real_rows=run.rows("engine") or None,
        real_workload=run.meta.get("engine", {}).get("workload"),
        serve_rows=run.rows("serve") or None,
        serve_slo=run.rows("slo") or None,
        serve_meta=run.meta.get("serve"),
        ceilings=run.meta.get("probe"),
        files=files,
        memory_ceiling=run.meta.get("memory_ceiling"),
        memory_rows=run.rows("memory") or None,
        ceilings_raised=run.meta.get("ceilings_raised"),
    )
    run.meta["claims"] = [vars(cl) for cl in built.claims]
    results.atomic_write_text(folder / "report.md", report.to_markdown(built))
    images = {s.image: (folder / s.image).read_bytes() for s in built.sections if s.image}
    results.atomic_write_text(folder / "report.html", report.to_html(built, images))
    return built


def _facts(run, job: Job) -> list[tuple[str, str]]:
    from benchbatch.core.noise import DEFAULT_CV_THRESHOLD
    from benchbatch.runtime.device import device_name

    cfg, t, env, opts = run.cfg, run.target, run.meta["environment"], run.meta["options"]
    facts = [
        ("device", f"{device_name(t.device)} ({t.device}), {t.dtype_name}"),
        (
            "model",
            f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads "
            f"({cfg.kv_heads} KV), MLP {cfg.intermediate}, vocab {cfg.vocab:,}, random weights",
        ),
        ("software", f"torch {env['torch_version']}, benchbatch {env['benchbatch_version']}"),
        (
            "timing",
            f"median of at least {opts['repeats']} repeats and {opts['min_time']} s",
        ),
        ("started", f"{run.meta['started_utc']} ({run.meta['command_line']})"),
    ]
    noisy = noisy_steps(run)
    if noisy:
        facts.append((f"noisy (CV over {DEFAULT_CV_THRESHOLD:.0%})", ", ".join(noisy)))
    return facts


def noisy_steps(run) -> list[str]:
    """Steps whose repeats spread by more than the noise threshold: another process, most
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
        tables = (
            "probe", "phases", "sweep", "occupancy", "memory_ceiling", "memory", "engine",
            "serve", "slo",
        )  # fmt: skip
        parts = (
            "probe", "phases", "sweep", "occupancy", "memory", "memory_ceiling", "engine",
            "serve",
        )  # fmt: skip
        render.print_json(
            {
                "folder": str(run.folder),
                "cpu_sized": run.meta["cpu_sized"],
                "claims": run.meta["claims"],
                "summary": {k: run.meta.get(k) for k in parts if k in run.meta},
                "rows": {t: run.rows(t) for t in tables if run.rows(t)},
            }
        )
        return
    out = render.out_console
    out.print(_table_b(run.rows("phases")))
    out.print(_table_a(run.rows("sweep")))
    out.print(_table_c(run.rows("occupancy"), run.rows("engine")))
    for section in built.report.sections:
        if section.title == report.SERVE_TITLE:
            out.print(_section_table(section))
    for section in built.report.sections:
        if section.title == report.REAL_TITLE:
            for note in section.notes:
                render.note(note)
    m = built.ceilings
    unit = flop_unit([m.peak_tflops])
    out.print(
        f"measured ceilings ({m.dtype}): matmul {fmt(unit(m.peak_tflops))} {unit.name} "
        f"({m.tflops_source}), memory {fmt(m.peak_gbps)} GB/s ({m.gbps_source}), ridge "
        f"{fmt(m.ridge)} FLOP/byte",
        highlight=False,
    )
    verdicts = _table("verdicts (thresholds in report.md)", ["", "verdict", "claim"])
    for cl in built.report.claims:
        style = VERDICT_STYLE.get(cl.verdict, "")
        text = f"{cl.claim}\n  article: {cl.article}\n  here: {cl.measured}"
        line = Text(text)
        if cl.caveat:
            line.append(f"\n  less sure: {cl.caveat}", style="yellow")
        verdicts.add_row(cl.key, Text(cl.verdict, style=style), line)
    for column in verdicts.columns:
        column.justify = "left"
    out.print(verdicts)
    noisy = noisy_steps(run)
    if noisy:
        render.warn_untrusted({"noisy": noisy})
    out.print(f"report: {run.folder / 'report.md'} (and report.html); every file: {run.folder}")


def _section_table(section) -> Table:
    """A report section's table and notes on the terminal."""
    table = _table(section.title, section.headers)
    for row in section.rows:
        table.add_row(*row)
    if section.notes:
        table.caption = "\n".join(section.notes)
        table.caption_justify = "left"
    return table


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
    unit = flop_unit(r.get("tflops") for r in rows if r.get("status") == "ok")
    table = _table(
        "B. prefill vs decode (article row, then this run)",
        ["step", "step ms", "us/token (cost)", unit.name, "MFU", "bound"],
    )
    for e in report.table_b(rows):
        a, m = e["article"], e["measured"]
        table.add_row(
            f"{a.label} (article)", fmt(a.step_ms), fmt(a.us_per_token), fmt(unit(a.tflops)),
            "", "", style="dim",
        )  # fmt: skip
        if m is None:
            table.add_row("  not measured", "", "", "", "", "")
            continue
        table.add_row(
            f"  {m['label']}",
            *(_cell(m, k) for k in ("step_ms", "us_per_token")),
            _cell({**m, "rate": unit(m.get("tflops"))}, "rate"),
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
