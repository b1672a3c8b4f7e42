"""ablation in the terminal: the fitted step cost, the schemes beside the paper's, whether
they order as the paper's do, and with --slo the goodput and the search."""

from __future__ import annotations

from benchbatch.core.units import figure
from benchbatch.output import render

COLUMNS = {
    "label": "scheme",
    "source": "source",
    "ttft_p50_s": "P50 TTFT s",
    "tbt_p99_s": "P99 TBT s",
    "tbt_max_s": "TBT max s",
    "e2e_p50_s": "e2e p50 s",
    "total_s": "total s",
}
SLO_COLUMNS = {
    "label": "scheme",
    "source": "source",
    "slo_met": "met SLO",
    "requests": "of",
    "goodput_rps": "goodput req/s",
}


def document(rec) -> dict:
    meta = rec.meta
    doc = {
        "step_cost": meta.get("step_cost"),
        "ordering": meta.get("ordering"),
        "rows": rec.rows("ablation"),
        "prediction": meta.get("prediction"),
    }
    if "slo" in meta:
        doc["slo"] = meta["slo"]
    return doc


def show(rec) -> None:
    from benchbatch.core.calibration_text import step_cost_line

    rows, meta = rec.rows("ablation"), rec.meta
    render.out_console.print(step_cost_line(meta["step_cost"]), highlight=False)
    paper = [
        {
            "label": r["label"],
            "source": "paper",
            "ttft_p50_s": r["paper_ttft_p50_s"],
            "tbt_p99_s": r["paper_tbt_p99_s"],
        }
        for r in rows
        if r["source"] == "sim"
    ]
    render.table(rows + paper, COLUMNS, "schemes side by side (paper: Yi-34B)")
    for source, verdict in meta["ordering"].items():
        if verdict is not None:
            render.out_console.print(_ordering_line(source, verdict))
    real = [r for r in rows if r["source"] == "real"]
    if real:
        render.out_console.print(
            "real/simulated total time: "
            + ", ".join(f"{r['scheme']} {r['real_over_sim']:.2f}" for r in real)
        )
    if (meta.get("prediction") or {}).get("verdict"):
        render.out_console.print(meta["prediction"]["verdict"], highlight=False)
    if "slo" in meta:
        _slo_report(rows, meta["slo"])
    render.results_line(rec)


def _ordering_line(source: str, v: dict) -> str:
    from benchbatch.experiments.ablation.ordering import TIE

    name = {"sim": "simulated", "real": "real engine"}[source]
    verdict = {True: "same ordering as the paper", False: "NOT the paper's ordering",
               None: "no ordering to judge"}[v["as_paper"]]  # fmt: skip
    ties = v.get("ties") or []
    tied = (f"; {' and '.join(ties)}: two schemes within {TIE:.0%} of each other, an order "
            "the noise does not settle") if ties else ""  # fmt: skip
    return (
        f"{name}: {verdict} (P99 TBT both < chunks-only < mixed-only: "
        f"{_yes(v['tbt_p99_order'])}; P50 TTFT mixed-only < both < chunks-only: "
        f"{_yes(v['ttft_p50_order'])}{tied}); {_stall(v['stall_shrink'])}"
    )


def _stall(shrink: float) -> str:
    if shrink != shrink:  # NaN: no request had a second token, so no gap
        return "no gap between tokens to stall"
    if abs(shrink - 1) < 0.01:  # every prompt within one chunk, or no prompt stalled
        return "chunking did not change the longest stall"
    return f"chunking cut the stall {shrink:.2g}x" if shrink > 1 else (
        f"the longest stall {1 / shrink:.2g}x longer with chunking")  # fmt: skip


def _yes(ok: bool | None) -> str:
    return "n/a (no gap between tokens)" if ok is None else "yes" if ok else "no"


def _slo_report(rows: list[dict], slo: dict) -> None:
    render.table(
        rows,
        SLO_COLUMNS,
        f"goodput: TTFT <= {slo['ttft_s']:g} s and own P99 TBT <= {slo['tbt_s']:g} s",
    )
    head = (
        "SLO search (scheme both, chunk = budget, simulated): "
        f"P99 TTFT <= {slo['ttft_s']:g} s and P99 TBT <= {slo['tbt_s']:g} s"
    )
    if not slo["met"]:
        render.out_console.print(f"{head}: no max_num_seqs and token budget on the grid meets it")
        return
    s, b, g = slo["largest_seqs"], slo["largest_budget"], slo["best_goodput"]
    render.out_console.print(
        f"{head}: largest max_num_seqs {s['max_num_seqs']} (token budget "
        f"{s['max_num_batched_tokens']}); largest token budget {b['max_num_batched_tokens']} "
        f"(max_num_seqs {b['max_num_seqs']}); best goodput {figure(g['goodput_rps'])} req/s at "
        f"max_num_seqs {g['max_num_seqs']}, budget {g['max_num_batched_tokens']}"
    )
