"""A reproduction's report from its run alone (its tables and metadata): what report.md and
report.html hold and what the terminal shows, the CPU-sized run's notice, the facts and
the noisy steps."""

from __future__ import annotations

from benchbatch.output import report


def cpu_notice(options: dict, cfg, dtype: str) -> str:
    """The CPU-sized run said first (the header) and in the report; options: the run's."""
    return (
        f"CPU-sized run: no CUDA device, so a small model ({cfg.name}: hidden {cfg.hidden}, "
        f"{cfg.layers} layers, {dtype}), prefill {_list(options['prefill'])} and "
        f"batches up to {options['batch'][-1]:,}. Times are not comparable with the article's "
        "GPU; the claims are about ratios, and the verdicts say which of them hold on this CPU."
    )


def _list(values) -> str:
    return ",".join(str(v) for v in values)


FILE_ORDER = (
    "report.md", "report.html", "result.json", "metadata.json", "probe.csv", "phases.csv",
    "phases.png",
    "sweep.csv", "sweep.png", "roofline.png", "occupancy.csv", "timeline.csv",
    "occupancy.png", "memory_ceiling.csv", "memory.csv", "memory_timeline.csv", "memory.png",
    "engine.csv", "engine_steps.csv", "engine.png", "step_cost.json", "step_cost.csv",
    "calibration_steps.csv", "prediction.csv", "prediction.png", "serve.csv", "slo.csv",
    "serve.png",
)  # fmt: skip


WRITTEN_AFTER = ("report", "result")


def build_report(run) -> report.Report:
    """The report of a reproduction from its run alone (its tables and metadata): what
    report.md and report.html hold, and what the terminal shows (its view)."""
    from benchbatch.runtime.device import device_name

    folder, options = run.folder, run.meta["options"]
    # the report and result.json are written after this list is made, whatever the run
    files = [f for f in FILE_ORDER if (folder / f).exists() or f.split(".")[0] in WRITTEN_AFTER]
    sweep = run.meta.get("sweep") or [{}]
    notice = cpu_notice(options, run.cfg, run.target.dtype_name)
    return report.build(
        title=f"benchbatch reproduce: {device_name(run.target.device)}",
        notices=[notice] if run.meta["cpu_sized"] else [],
        facts=_facts(run),
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
        prediction_rows=run.rows("prediction") or None,
        prediction_verdict=(run.meta.get("prediction") or {}).get("verdict"),
        prediction_at_speed=(run.meta.get("prediction") or {}).get("at_speed"),
    )


def _facts(run) -> list[tuple[str, str]]:
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
        ("KV cache", _layout(opts)),
        ("started", f"{run.meta['started_utc']} ({run.meta['command_line']})"),
    ]
    noisy = noisy_steps(run)
    if noisy:
        said = f"noisy (CV over {DEFAULT_CV_THRESHOLD:.0%}, or timed once)"
        facts.append((said, ", ".join(noisy)))
    return facts


def _layout(opts: dict) -> str:
    """The KV cache every timed step ran in (an older run recorded none: contiguous)."""
    if opts.get("kv_layout") == "paged":
        return f"paged, blocks of {opts.get('block_size')} tokens (every timed step)"
    return "contiguous, one row per sequence (every timed step)"


def noisy_steps(run) -> list[str]:
    """Steps whose repeats spread by more than the noise threshold: another process, most
    likely, shared the device; their medians are less sure."""
    return [
        f"{table} {r['label']} ({r['cv']:.0%})"  # as the verdicts' caveats name them
        for table in ("phases", "sweep")
        for r in run.rows(table)
        if r.get("noisy")
    ]
