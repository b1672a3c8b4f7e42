"""reproduce in the terminal: the header (what runs, on what), then tables B, A and C beside
the article's, the serving curve, the measured ceilings and every claim's verdict."""

from __future__ import annotations

import math

from rich import box
from rich.table import Table
from rich.text import Text

from benchbatch.core.units import figure, flop_unit
from benchbatch.output import render, report
from benchbatch.output.render import fmt
from benchbatch.output.report.cells import article_number, percent

TABLES = ("probe", "phases", "sweep", "occupancy", "memory_ceiling", "memory", "engine",
          "prediction", "serve", "slo")  # fmt: skip
SUMMARIES = ("probe", "phases", "sweep", "occupancy", "memory", "memory_ceiling", "engine",
             "serve")  # fmt: skip
VERDICT_STYLE = {
    report.HOLDS: "bold green",
    report.PARTLY: "bold yellow",
    report.FAILS: "bold red",
    report.UNMEASURED: "dim",
}


def before(rec) -> None:
    for line in header_lines(rec):
        render.out_console.print(line, highlight=False)


def header_lines(rec) -> list[str]:
    """What runs, on what; first of all whether this is the article's run or a CPU-sized one."""
    from benchbatch.experiments.reproduce.reporting import cpu_notice
    from benchbatch.experiments.reproduce.run import real_sizes
    from benchbatch.runtime.device import device_name

    o, cfg, target = rec.meta["options"], rec.cfg, rec.target
    lines = [cpu_notice(o, cfg, target.dtype_name)] if rec.meta["cpu_sized"] else []
    lines.append(
        f"device: {device_name(target.device)} ({target.device}), {target.dtype_name}; model "
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, random weights"
    )
    r = real_sizes(o, target.device.type == "cuda")
    real = ""
    if r is not None:
        real = f"; real engine: {r.get('requests', o['requests'])} requests, "
        real += f"{r.get('slots', o['slots'])} slots"
    lines.append(
        f"parts: probe, phases (prefill {_list(o['prefill'])}; decode batch "
        f"{_list(o['decode_batch'])} at context {_list(o['context'])}), sweep (batch "
        f"{_list(o['batch'])}), occupancy ({o['requests']:,} requests, {o['slots']} slots, "
        f"simulated{real})"
    )
    return lines


def _list(values) -> str:
    return ",".join(str(v) for v in values)


def document(rec) -> dict:
    return {
        "cpu_sized": rec.meta.get("cpu_sized"),
        "claims": rec.meta.get("claims"),  # None: interrupted before the verdicts
        "summary": {k: rec.meta.get(k) for k in SUMMARIES if k in rec.meta},
        "rows": {t: rec.rows(t) for t in TABLES if rec.rows(t)},
    }


def show(rec) -> None:
    from benchbatch.experiments.reproduce.reporting import build_report, noisy_steps

    built = build_report(rec)
    out = render.out_console
    out.print(_table_b(rec.rows("phases")))
    out.print(_table_a(rec.rows("sweep")))
    out.print(_table_c(rec.rows("occupancy"), rec.rows("engine")))
    for section in built.sections:
        if section.title == report.SERVE_TITLE:
            out.print(_section_table(section))
    for section in built.sections:
        if section.title == report.REAL_TITLE:
            for note in section.notes:
                render.note(note)
    if (rec.meta.get("prediction") or {}).get("verdict"):
        out.print(rec.meta["prediction"]["verdict"], highlight=False)
    m = rec.ceilings
    unit = flop_unit([m.peak_tflops])
    out.print(
        f"measured ceilings ({m.dtype}): matmul {fmt(unit(m.peak_tflops))} {unit.name} "
        f"({m.tflops_source}), memory {fmt(m.peak_gbps)} GB/s ({m.gbps_source}), ridge "
        f"{fmt(m.ridge)} FLOP/byte"
        + (f"; {rec.meta['ceilings_source']}" if rec.meta.get("ceilings_source") else ""),
        highlight=False,
    )
    verdicts = _table("verdicts (thresholds in report.md)", ["", "verdict", "claim"])
    for cl in built.claims:
        style = VERDICT_STYLE.get(cl.verdict, "")
        text = f"{cl.claim}\n  article: {cl.article}\n  here: {cl.measured}"
        line = Text(text)
        if cl.caveat:
            line.append(f"\n  less sure: {cl.caveat}", style="yellow")
        verdicts.add_row(cl.key, Text(cl.verdict, style=style), line)
    for column in verdicts.columns:
        column.justify = "left"
    out.print(verdicts)
    noisy = noisy_steps(rec)
    if noisy:
        render.warn_untrusted({"noisy": noisy}, render.run_threads(rec.meta))
    out.print(f"report: {rec.folder / 'report.md'} (and report.html); every file: {rec.folder}")


def _section_table(section) -> Table:
    """A report section's table and notes on the terminal."""
    table = _table(section.title, section.headers)
    for row in section.rows:
        table.add_row(*row)
    if section.notes:
        table.caption = "\n".join(section.notes)
        table.caption_justify = "left"
    return table


def _table(title: str, headers: list[str]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    return table


def _table_b(rows: list[dict]) -> Table:
    unit = flop_unit(r.get("tflops") for r in rows if r.get("status") == "ok")
    context = report.decode_context(rows)
    at = "" if context is None else f"; decodes at context {context:,}"
    table = _table(
        f"B. prefill vs decode (article row, then this run{at})",
        ["step", "step ms", "us/token (cost)", unit.name, "MFU", "bound"],
    )
    for e in report.table_b(rows):
        a, m = e["article"], e["measured"]
        table.add_row(
            f"{a.label} (article)", article_number(a.step_ms), article_number(a.us_per_token),
            article_number(unit(a.tflops)),
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
            f"{figure(speedup)}x / {_cell(m, 'speedup_vs_static')}x",
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
    """As report.md says it (report/cells.percent): one precision for both."""
    return percent(value)
