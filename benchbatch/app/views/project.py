"""project in the terminal: the projected table per GPU count, and its assumptions."""

from __future__ import annotations

from benchbatch.output import render

COLUMNS = {  # short headers: eleven columns in 80 (project.csv has every column)
    "tp": "GPUs",
    "batch": "batch",
    "context": "ctx",
    "memory_gib": "GiB/GPU",
    "fits_text": "fits",
    "model_ms": "model ms",
    "allreduce_ms": "AR ms",
    "share_pct": "AR %",
    "step_ms": "step ms",
    "tokens_per_s": "tok/s",
    "speedup": "speedup",
}


def document(rec) -> dict:
    return {"assumptions": rec.meta.get("assumptions"), "rows": rec.rows("project")}


def show(rec) -> None:
    rows, notes = rec.rows("project"), rec.meta["assumptions"]
    shown = [
        {
            **r,
            "share_pct": 100 * r["allreduce_share"],
            "fits_text": "?" if r["fits"] is None else "yes" if r["fits"] else "no",
            "memory_gib": r["weights_gib"] + r["kv_gib"],
        }
        for r in rows
    ]
    render.table(shown, COLUMNS, "projected decode step, per GPU (weights and KV cache; AR: "
                 "the step's all-reduces; speedup over the fewest GPUs that fit)")  # fmt: skip
    render.out_console.print("assumptions:", highlight=False)
    for line in notes:
        render.out_console.print(f"- {line}", highlight=False)
    render.results_line(rec)
