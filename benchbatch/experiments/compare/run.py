"""`benchbatch compare`: the same plots from several result folders, overlaid."""

from __future__ import annotations

import math
from pathlib import Path

from benchbatch.core.options import RunOptions
from benchbatch.experiments.compare.options import CompareOptions
from benchbatch.output.recorder import Recorder
from benchbatch.output.run_folder import create

PREFIX = "compare-"  # the run's tables: compare-TABLE.csv, one per table of the folders


def open_run(opts: CompareOptions, run: RunOptions) -> Recorder:
    """Every folder loaded and checked (one kind, readable tables) before the run's own
    folder is made; metadata.json names the runs compared."""
    from benchbatch.output import compare as merging
    from benchbatch.output import compare_serve as serve_merging
    from benchbatch.output import results

    loaded = merging.load_all(list(opts.runs), opts.label)  # the folders first, then --out
    merging.check_out(run.out, list(opts.runs))
    tables = merging.merge(loaded)
    if "serve" in tables:  # like with like: rate sweeps, or concurrency sweeps
        serve_merging.check_like(tables["serve"], [r.label for r in loaded])
    if run.out is not None:
        results.check_out(run.out, "compare", run.force)
    from benchbatch.output.recorder import environment

    meta = {"runs": [r.describe() for r in loaded], "differences": merging.differences(loaded),
            "not_compared": not_compared(loaded),
            "files": [], "environment": environment()}  # fmt: skip (what compared them)
    return create(Recorder, run.out, run.force, "compare", meta, quiet=True)


def not_compared(runs) -> list[str]:
    """The tables the folders hold that compare does not read (memory.csv, timeline.csv,
    a real run's steps...), by name, so a reader knows they were left out, not matched."""
    read = {f"{t}.csv" for run in runs for t in run.tables}
    held = set()
    for run in runs:
        if run.folder.is_dir():
            held |= {p.name for p in run.folder.glob("*.csv")}
    return sorted(held - read)


def measure_run(rec, opts: CompareOptions, run: RunOptions) -> None:
    """compare-TABLE.csv per table (the run's tables, named so) and the overlaid figures;
    metadata's `files` lists what was written, as it is."""
    from benchbatch.output import compare as merging
    from benchbatch.output import compare_serve as serve_merging

    loaded = merging.load_all(list(opts.runs), opts.label)  # as open_run checked them
    tables = merging.merge(loaded)
    if "serve" in tables:  # points matched by absolute rate, and which ones matched
        names = [r.label for r in loaded]
        tables["serve"], rec.meta["serve_rates"] = serve_merging.match_rates(tables["serve"], names)
    said = conclusions(tables, [r.label for r in loaded])
    if said:
        rec.meta["conclusions"] = said
    files = rec.meta["files"]
    for table, df in tables.items():
        rec.put(PREFIX + table, df)
        files.append(f"{PREFIX}{table}.csv")
    files += _figures(tables, loaded, rec.folder, loaded[0].kind)


def conclusions(tables: dict, names: list[str]) -> list[dict]:
    """The ratios phases and sweep (and reproduce's parts) conclude with, recomputed from
    each run's rows, side by side: each run's value with its range across its steps'
    p10-p90, each later run's over the first's and whether the ranges overlap. A ratio is
    matched only between runs that measured the same steps (its name says which)."""
    from benchbatch.experiments.phases import probe as phases
    from benchbatch.experiments.sweep import probe as sweep
    from benchbatch.output import compare_serve as serve_merging

    found: dict[tuple[str, str], dict] = {}

    def keep(table: str, what: str, run: str, s: dict, key: str) -> None:
        value = (s[key], s.get(f"{key}_low", math.nan), s.get(f"{key}_high", math.nan))
        found.setdefault((table, what), {})[run] = value

    if "phases" in tables:
        for run, df in tables["phases"].groupby("run", sort=False):
            s = phases.summary(df.to_dict("records"))
            # the decodes' context in each name: a ratio is matched only at the same steps
            ctx = s.get("decode_context")
            at = "" if ctx is None or ctx != ctx else f" at context {int(ctx):,}"
            if "prefill_over_decode_tflops" in s:
                what = f"{s['prefill_label']} FLOP/s over {s['decode_label']}{at}"
                keep("phases", what, run, s, "prefill_over_decode_tflops")
            if "decode_token_cost_ratio" in s:
                b0, b1 = s["decode_batches"]
                what = f"each token cheaper, batch {b0:,} to {b1:,}{at}"
                keep("phases", what, run, s, "decode_token_cost_ratio")
    if "sweep" in tables:
        for (run, context), df in tables["sweep"].groupby(["run", "context"], sort=False):
            c = sweep.claim(df.to_dict("records"))
            if c is None:
                continue
            span = f"batch {c['batch_from']:,} to {c['batch_to']:,}, context {int(context):,}"
            keep("sweep", f"throughput, {span}", run, c, "throughput_ratio")
            keep("sweep", f"step time, {span}", run, c, "step_latency_ratio")
    return [
        {"table": table, "ratio": what, **serve_merging.side_by_side(by, names)}
        for (table, what), by in found.items()
    ]


def _run_title(run) -> str:
    """A run as a figure's title names it: its device, dtype and whether it was noisy."""
    d = run.describe()
    noisy = any(
        "noisy" in df.columns and df["noisy"].astype(str).str.lower().eq("true").any()
        for df in run.tables.values()
    )
    return f"{run.label} ({d['device']}, {d['dtype']}{', noisy' if noisy else ''})"


def _figures(tables: dict, loaded: list, folder: Path, kind: str) -> list:
    from benchbatch.output import compare as merging
    from benchbatch.output.plots import compare as plots

    names = [r.label for r in loaded]
    title = f"{kind} runs: " + "; ".join(_run_title(r) for r in loaded)
    drawn = []
    if "phases" in tables:
        plots.compare_phases_figure(merging.phases_steps(tables["phases"]), names,
                                    folder / "compare-phases.png", title)  # fmt: skip
        drawn.append("compare-phases.png")
    if "sweep" in tables:
        plots.compare_sweep_figure(tables["sweep"], names, folder / "compare-sweep.png", title)
        drawn.append("compare-sweep.png")
    if "probe" in tables:
        plots.compare_probe_figure(tables["probe"], names, folder / "compare-probe.png", title)
        drawn.append("compare-probe.png")
    if "occupancy" in tables:
        occupancy = merging.first_seed(tables["occupancy"])
        path = folder / "compare-occupancy.png"
        plots.compare_occupancy_figure(occupancy, tables.get("engine"), names, path, title)
        drawn.append("compare-occupancy.png")
    if "serve" in tables:
        options = {r.label: r.meta.get("options") or {} for r in loaded}  # each run's SLO
        slos = {k: (o.get("slo_ttft"), o.get("slo_tpot")) for k, o in options.items()}
        plots.compare_serve_figure(tables["serve"], names, folder / "compare-serve.png", title,
                                   slos)  # fmt: skip
        drawn.append("compare-serve.png")
    return drawn
