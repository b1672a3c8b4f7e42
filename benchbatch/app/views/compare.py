"""compare in the terminal: who is who, then each merged table as rows x runs, with each
run's ratio to the first."""

from __future__ import annotations

import math

from rich import box
from rich.table import Table

from benchbatch.core.units import figure
from benchbatch.output import render
from benchbatch.output.render import fmt

PREFIX = "compare-"  # the run's tables, as the experiment names them
RUN_COLUMNS = ("run", "kind", "device", "dtype", "model", "cuda_graphs", "status")

# What the terminal shows of each table: rows (index) x runs, one value, and its name.
VIEWS = {
    "probe": (["label"], "tflops", "TFLOP/s (matmul) and GB/s (copy, read)"),
    "phases": (["step"], "step_ms", "step ms"),  # its label, with its context where several
    "sweep": (["context", "batch"], "tokens_per_s", "decode tokens/s"),
    "occupancy": (["policy"], "occupancy", "slot occupancy (simulated)"),
    "engine": (["policy"], "wall_s", "real engine wall s"),
    "serve": (
        ["policy", "source", "matched_rate"],
        "ttft_p99_s",
        "p99 TTFT s at each rate (req/s; points matched by absolute rate)",
    ),
    "slo": (["policy", "source"], "sustained_rps", "largest rate within the SLO (req/s)"),
}


def _tables(rec) -> dict:
    """The merged tables (DataFrames), by the folders' table names, in the run's order."""
    return {
        name.removeprefix(PREFIX): df for name, df in rec.tables.items() if name.startswith(PREFIX)
    }


def document(rec) -> dict:
    """--json: the runs, what they differ in, every merged table's rows, the serve points
    matched, the knees and the conclusions side by side (what the terminal shows)."""
    from benchbatch.output import compare_serve as serve_merging

    tables = _tables(rec)
    rows = {t: df.to_dict(orient="records") for t, df in tables.items()}
    doc = {"runs": rec.meta.get("runs"), "differences": rec.meta.get("differences") or {},
           "rows": rows}  # fmt: skip
    names = [d["run"] for d in rec.meta.get("runs") or []]
    if "slo" in tables and serve_merging.knees(tables["slo"], names):
        doc["knees"] = serve_merging.knees(tables["slo"], names)
    if rec.meta.get("serve_rates") is not None:
        doc["serve_rates"] = rec.meta["serve_rates"]
    if rec.meta.get("conclusions"):
        doc["conclusions"] = rec.meta["conclusions"]
    doc["not_compared"] = rec.meta.get("not_compared") or []
    return doc


def show(rec) -> None:
    from benchbatch.output import compare as merging
    from benchbatch.output import compare_serve as serve_merging

    runs = rec.meta["runs"]
    names = [d["run"] for d in runs]
    who = _table("runs", list(RUN_COLUMNS))
    for d in runs:  # a flag as yes/no (fmt says False as nothing)
        who.add_row(*("-" if d[k] is None else {True: "yes", False: "no"}.get(d[k], fmt(d[k]))
                      if isinstance(d[k], bool) else fmt(d[k]) for k in RUN_COLUMNS))  # fmt: skip
    render.out_console.print(who)
    said = differences_line(rec.meta.get("differences") or {}, kind=runs[0]["kind"])
    if said:
        render.note(said)
    for table, df in _tables(rec).items():
        if table == "occupancy":
            seeds = df["seed"].nunique() if "seed" in df.columns else 1
            df = merging.first_seed(df)
            if seeds > 1:  # the table below is each run's first seed
                render.note("occupancy: each run's first seed (compare-occupancy.csv has "
                            "every seed)")  # fmt: skip
        if table == "peer_check":
            render.out_console.print(_peer_check(df), highlight=False)
            continue
        render.out_console.print(_view(table, df, names))
        if table == "serve" and rec.meta.get("serve_rates") is not None:
            render.out_console.print(_matched(rec.meta["serve_rates"]), highlight=False)
        if table == "slo" and serve_merging.knees(df, names):
            render.out_console.print(_knees(serve_merging.knees(df, names), names))
    if rec.meta.get("conclusions"):
        render.out_console.print(_conclusions(rec.meta["conclusions"], names))
    if rec.meta.get("not_compared"):
        render.note(f"not compared (compare reads {', '.join(_tables(rec))} only): "
                    + ", ".join(rec.meta["not_compared"]))  # fmt: skip
    if any(d["status"] != "complete" for d in runs):
        render.warning("some runs did not complete (see status): their tables may miss rows.")
    files = rec.meta["files"]
    render.out_console.print(f"results: {rec.folder} ({', '.join(files)})", highlight=False)


def _peer_check(df) -> str:
    """A peer's saved result, recomputed: how many of its own aggregates benchbatch's code
    gives back from its per-request times, and how many are defined otherwise."""
    lines = []
    for run, mine in df.groupby("run", sort=False):
        same = mine[mine["same_definition"].astype(bool)]
        agree = int(same["agrees"].astype(bool).sum())
        line = (
            f"{run}: {agree} of its {len(same)} aggregates recomputed exactly from its "
            "per-request times"
        )
        other = len(mine) - len(same)
        if other:
            line += f"; {other} defined otherwise (compare-peer_check.csv's note says how)"
        lines.append(line)
    return "\n".join(lines)


def _view(table: str, df, names: list[str]) -> Table:
    from benchbatch.output import compare as merging
    from benchbatch.output import compare_serve as serve_merging

    index, value, what = VIEWS[table]
    if table == "phases":
        df = merging.phases_steps(df)
    if table == "probe":
        df = df.assign(value=df["tflops"].where(df["kind"] == "matmul", df["gbps"]))
        value = "value"
    if table == "serve":
        df = serve_merging.rate_order(df)
        if serve_merging.concurrency_sweeps(df, names):
            what = "p99 TTFT s at each cap (requests in flight, at one rate)"
    if table == "slo" and df.get("sustained_concurrency") is not None:
        if df["sustained_concurrency"].notna().any() or df["sustained_rps"].isna().all():
            value, what = "sustained_concurrency", "most requests in flight within the SLO"
    # The SLO table: a run that has the row but never met the SLO says "none".
    wide = merging.pivot(df, index, value, names, missing="none" if table == "slo" else None)
    bound = _lower_bounds(df, index, value, names) if table == "slo" else None
    first = names[0]
    others = [n for n in wide.columns if n != first]
    headers = [*index, *wide.columns, *(f"{n} / {first}" for n in others if first in wide)]
    view = _table(f"{table}: {what}", headers)
    for key, row in wide.iterrows():
        keys = key if isinstance(key, tuple) else (key,)
        least = {n: bool(bound is not None and bound.at[key, n]) for n in wide.columns}
        cells = [fmt(_plain(k)) for k in keys]
        cells += [(">=" if least[n] else "") + _cell(row[n], table) for n in wide.columns]
        if first in wide:
            cells += [_bounded(_ratio(row[first], row[n]), least[first], least[n])
                      for n in others]  # fmt: skip
        view.add_row(*cells)
    return view


def _lower_bounds(df, index: list[str], value: str, names: list[str]):
    """Per row and run, whether its sustained rate is only a lower bound: the policy never
    left the SLO on the rates swept (leaves_slo_rps empty), so it sustains that at least."""
    from benchbatch.output import compare as merging

    if value != "sustained_rps" or "leaves_slo_rps" not in df.columns:
        return None
    import pandas as pd

    flags = df.assign(least=pd.to_numeric(df["leaves_slo_rps"], errors="coerce").isna()
                      & df["sustained_rps"].notna())  # fmt: skip
    wide = merging.pivot(flags, index, "least", names)
    return wide.reindex(columns=names).eq(True)  # a run without the row: not a bound


def _bounded(ratio: str, first: bool, other: bool) -> str:
    """A ratio of rates one or both of which are lower bounds: said as a bound, or none."""
    if ratio == "-" or not (first or other):
        return ratio
    if first and other:
        return "- (both lower bounds)"
    return (">=" if other else "<=") + ratio


def _knees(found: list[dict], names: list[str]) -> Table:
    """The simulated knees side by side: each run's knee (its range with every step 10%
    slower and faster), then each later run's over the first's and whether the ranges
    overlap, the runs agreeing within the noise they report."""
    title = "slo: simulated knee, req/s (with every step 10% slower-faster)"
    return _side_by_side(title, "policy", [(k["policy"], k) for k in found], names)


def _conclusions(found: list[dict], names: list[str]) -> Table:
    """The ratios the runs conclude with side by side, as the knees are."""
    title = "conclusions: each ratio (its range across the steps' p10-p90)"
    return _side_by_side(title, "ratio", [(f"{k['table']}: {k['ratio']}", k) for k in found],
                         names)  # fmt: skip


def _side_by_side(title: str, what: str, found: list[tuple[str, dict]], names: list[str]):
    """One number of several runs per row: each run's value (its range), then each later
    run's over the first's and whether the ranges overlap."""
    first = names[0]
    present = [n for n in names if any(n in k["runs"] for _, k in found)]
    others = [n for n in present if n != first]
    headers = [what, *present, *(f"{n} / {first}" for n in others)]
    view = _table(title, headers)
    for i, n in enumerate(present, start=1):  # a range is never folded inside
        spans = [f"({fmt(v[1])}-{fmt(v[2])})" for _, k in found if (v := k["runs"].get(n))]
        view.columns[i].min_width = max(map(len, spans), default=1)
    for name, k in found:
        cells = [name]
        for n in present:
            v = k["runs"].get(n)
            cells.append(f"{fmt(v[0])} ({fmt(v[1])}-{fmt(v[2])})" if v else "-")
        for n in others:
            vs = k["versus_first"].get(n)
            if not vs:
                cells.append("-")
                continue
            agree = {True: "ranges overlap", False: "ranges apart", None: "no range"}[vs["overlap"]]
            cells.append(f"{_ratio(1.0, vs['ratio'])}, {agree}")
        view.add_row(*cells)
    return view


def _table(title: str, headers: list[str]) -> Table:
    """Names wrap, never cut: a run's whole name is in every header and cell."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for h in headers:
        table.add_column(h, overflow="fold")
    return table


def _matched(rates: dict) -> str:
    """Which serve points the table set side by side: the rates every run has, and those
    only some have (their rows show '-' for the others)."""
    tol = f"{rates['tolerance']:.1%}".replace(".0%", "%")
    every = ("; " if rates.get("caps") else ", ").join(rates["matched"]) or "none"
    by = "absolute rate and cap" if rates.get("caps") else "absolute rate"
    line = f"serve points matched by {by} (within {tol}): in every run {every}"
    apart = [f"{r['rate']} only in {', '.join(r['runs'])}" for r in rates["not_in_every_run"]]
    if apart:
        line += "; " + "; ".join(apart)
        line += " (the same --rates on every machine gives every point a match)"
    return line


def _plain(value):
    """numpy scalars to Python's, so fmt formats them."""
    return value.item() if hasattr(value, "item") else value


def differences_line(found: dict[str, list[str]], most: int = 8,
                     kind: str | None = None) -> str | None:  # fmt: skip
    """The versions, sizes and options the runs measured with differently, in one line,
    each option by the name the user typed (the `kind` command's: --output-median, not
    its field's median): each ratio below compares them too (a seed apart draws other
    requests)."""
    if not found:
        return None
    names = option_names(kind) if kind else {}
    shown = [f"{names.get(k, k.replace('_', '-'))} ({', '.join(v)})"
             for k, v in list(found.items())[:most]]  # fmt: skip
    more = f" and {len(found) - most} more (metadata.json's differences)" if len(found) > most \
        else ""  # fmt: skip
    return (f"the runs differ in {'; '.join(shown)}{more}: each ratio below compares these "
            "too")  # fmt: skip


def option_names(kind: str) -> dict[str, str]:
    """A command's options by their field's name: {"median": "--output-median", ...} (the
    long name it was given first); {} for a command this benchbatch does not have."""
    import click
    import typer.main

    from benchbatch.app.cli import app

    command = typer.main.get_command(app).commands.get(kind)
    if command is None:
        return {}
    params = command.get_params(click.Context(command))
    return {p.name: next((o for o in p.opts if o.startswith("--")), p.opts[0])
            for p in params if p.opts and p.name and "__alias" not in p.name}  # fmt: skip


def _cell(value, table: str) -> str:
    value = _plain(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value) and table in ("serve", "slo"):
        return "max"  # the max point (every request queued), as the runs printed it
    return f"{value:.1%}" if table == "occupancy" else fmt(value)


def _ratio(a, b) -> str:
    from benchbatch.output import compare as merging

    r = merging.ratio(_plain(a), _plain(b))
    return "-" if math.isnan(r) else f"x{figure(r)}"
