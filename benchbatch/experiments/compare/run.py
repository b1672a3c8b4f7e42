"""`benchbatch compare`: the same plots from several result folders, overlaid."""

from __future__ import annotations

import math
from pathlib import Path

from rich import box
from rich.table import Table

from benchbatch.core.options import RunOptions, use
from benchbatch.experiments import common as c
from benchbatch.experiments.compare.options import CompareOptions
from benchbatch.output import render
from benchbatch.output.recorder import Recorder, create
from benchbatch.output.render import fmt

RUN_COLUMNS = ("run", "kind", "device", "dtype", "model", "cuda_graphs", "status")


@command(CompareOptions, use(RunOptions, only=("out", "force", "json_out")))
def compare(opts: CompareOptions, run: RunOptions) -> None:
    """Overlay the same plot from several result folders (compare-*.png) and merge their
    rows into one compare-TABLE.csv per table (phases, sweep, ...) with a `run` column.

    Folders must come from the same command; a missing, corrupt or unknown file is named
    in a one-line error (exit code 2).
    """
    from benchbatch.output import compare as merging
    from benchbatch.output import results

    merging.check_out(run.out, list(opts.runs))
    loaded = merging.load_all(list(opts.runs), opts.label)
    names = [r.label for r in loaded]
    tables = merging.merge(loaded)
    if run.out is not None:
        results.check_out(run.out, "compare", run.force)
    meta = {"runs": [r.describe() for r in loaded], "files": []}
    rec = create(Recorder, run.out, run.force, "compare", meta, quiet=True)
    folder, files = rec.folder, rec.meta["files"]  # what is written, as it is
    with rec:
        for table, df in tables.items():
            results.write_csv(folder / f"compare-{table}.csv", df)
            files.append(f"compare-{table}.csv")
        files += _figures(tables, loaded, folder, loaded[0].kind)
    _report(rec, loaded, tables, names, files, run.json_out)


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
        plots.compare_phases_figure(tables["phases"], names, folder / "compare-phases.png", title)
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
        plots.compare_serve_figure(tables["serve"], names, folder / "compare-serve.png", title)
        drawn.append("compare-serve.png")
    return drawn


# --- terminal --------------------------------------------------------------------------------

# What the terminal shows of each table: rows (index) x runs, one value, and its name.
VIEWS = {
    "probe": (["label"], "tflops", "TFLOP/s (matmul) and GB/s (copy, read)"),
    "phases": (["label"], "step_ms", "step ms"),
    "sweep": (["context", "batch"], "tokens_per_s", "decode tokens/s"),
    "occupancy": (["policy"], "occupancy", "slot occupancy (simulated)"),
    "engine": (["policy"], "wall_s", "real engine wall s"),
    "serve": (["policy", "source", "rate"], "ttft_p99_s", "p99 TTFT s at each rate (req/s)"),
    "slo": (["policy", "source"], "sustained_rps", "largest rate within the SLO (req/s)"),
}


def _report(run, loaded, tables, names: list[str], files: list[str], json_out: bool) -> None:
    from benchbatch.output import compare as merging

    if json_out:
        rows = {t: df.to_dict(orient="records") for t, df in tables.items()}
        return c.report_json(run, runs=run.meta["runs"], rows=rows)
    who = _table("runs", list(RUN_COLUMNS))
    for r in loaded:
        d = r.describe()
        who.add_row(*(fmt(d[k]) if d[k] is not None else "-" for k in RUN_COLUMNS))
    render.out_console.print(who)
    for table, df in tables.items():
        if table == "occupancy":
            df = merging.first_seed(df)
        render.out_console.print(_view(table, df, names))
    if any(r.meta.get("status") != "complete" for r in loaded):
        render.warning("some runs did not complete (see status): their tables may miss rows.")
    render.out_console.print(f"results: {run.folder} ({', '.join(files)})", highlight=False)


def _view(table: str, df, names: list[str]) -> Table:
    from benchbatch.output import compare as merging

    index, value, what = VIEWS[table]
    if table == "probe":
        df = df.assign(value=df["tflops"].where(df["kind"] == "matmul", df["gbps"]))
        value = "value"
    wide = merging.pivot(df, index, value, names)
    first = names[0]
    others = [n for n in wide.columns if n != first]
    headers = [*index, *wide.columns, *(f"{n} / {first}" for n in others if first in wide)]
    view = _table(f"{table}: {what}", headers)
    for key, row in wide.iterrows():
        keys = key if isinstance(key, tuple) else (key,)
        cells = [fmt(_plain(k)) for k in keys]
        cells += [_cell(row[n], table) for n in wide.columns]
        if first in wide:
            cells += [_ratio(row[first], row[n]) for n in others]
        view.add_row(*cells)
    return view


def _table(title: str, headers: list[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for h in headers:
        table.add_column(h)
    return table


def _plain(value):
    """numpy scalars to Python's, so fmt formats them."""
    return value.item() if hasattr(value, "item") else value


def _cell(value, table: str) -> str:
    value = _plain(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.1%}" if table == "occupancy" else fmt(value)


def _ratio(a, b) -> str:
    from benchbatch.output import compare as merging

    r = merging.ratio(_plain(a), _plain(b))
    return "-" if math.isnan(r) else f"x{r:.3g}"
