"""phases in the terminal: the steps' table, the two ratios the article is about."""

from __future__ import annotations

from math import nan

from benchbatch.core.noise import summary_range
from benchbatch.output import render

# Short headers so the table fits 80 columns (MBU stands for GB/s); the CSV has every column.
COLUMNS = {
    "label": "step",
    "step_ms": "ms",
    "spread_ms": "p10-p90",
    "us_per_token": "us/tok",
    "tflops": "TFLOP/s",
    "arithmetic_intensity": "FLOP/B",
    "mfu_pct": "MFU %",
    "mbu_pct": "MBU %",
    "bound": "bound",
}


def document(rec) -> dict:
    return {"summary": rec.meta.get("summary", {}), "rows": rec.rows("phases")}


def show(rec) -> None:
    rows, s = rec.rows("phases"), rec.meta.get("summary", {})
    shown, columns = render.with_flop_unit(_shown(rows), _columns(rows))
    render.table(shown, columns, "prefill vs decode (ms: median of the repeats)")
    failed = [f"{r['label']}: {r['status']}" for r in rows if r["status"] != "ok"]
    if failed:
        render.labelled("not measured:", ", ".join(failed))
    # several decode contexts: each row says its own, and the ratios which they are at
    at = f" at context {s['decode_context']:,}" if _contexts(rows) > 1 and s.get(
        "decode_context") is not None else ""  # fmt: skip
    if "prefill_over_decode_tflops" in s:
        render.out_console.print(
            f"{s['prefill_label']} ran at {s['prefill_over_decode_tflops']:.1f}x the FLOP/s "
            f"of {s['decode_label']}{at}{summary_range(s, 'prefill_over_decode_tflops')}."
        )
    if "decode_token_cost_ratio" in s:
        b0, b1 = s["decode_batches"]
        render.out_console.print(
            f"Batching {b1} decodes made each token {s['decode_token_cost_ratio']:.1f}x cheaper "
            f"than batch {b0}{at}{summary_range(s, 'decode_token_cost_ratio')}."
        )
    render.warn_untrusted(rec.meta["untrusted"], render.run_threads(rec.meta))
    if rec.meta.get("ceilings_source"):
        render.line(f"ceilings (mfu, mbu, bound): {rec.meta['ceilings_source']}")
    render.results_line(rec)


def _shown(rows: list[dict]) -> list[dict]:
    """Rows as the terminal shows them: MFU and MBU in percent (the CSV keeps fractions)."""
    return [
        {
            **r,
            "mfu_pct": 100 * r.get("mfu", nan),
            "mbu_pct": 100 * r.get("mbu", nan),
            "allreduce_pct": 100 * r.get("allreduce_share", nan),
        }
        for r in rows
    ]


def _contexts(rows: list[dict]) -> int:
    return len({r.get("context") for r in rows if r.get("phase") == "decode"})


def _columns(rows: list[dict]) -> dict:
    """Under tensor parallelism the all-reduces' share of the step too; with several decode
    contexts each row's (their labels, decode b=1, alike)."""
    columns = dict(COLUMNS)
    if _contexts(rows) > 1:
        columns = {"label": "step", "context": "context", **COLUMNS}
    if any(r.get("tp", 1) > 1 for r in rows):
        columns["allreduce_pct"] = "AR%"
    return columns
