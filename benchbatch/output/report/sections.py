"""The report's sections: each of the article's tables beside this run's rows (B: prefill vs
decode, A: the batch sweep, C: static vs continuous, simulated and on the model), and
`build`, which puts them, the sections beyond them (beyond.py: the prediction, the memory
limit, the serving curve, the roofline's ceilings) and the claims into one `Report`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from benchbatch.core.noise import summary_range
from benchbatch.core.units import figure, flop_unit
from benchbatch.output.render import fmt
from benchbatch.output.report.article import (
    ARTICLE_A,
    ARTICLE_B,
    ARTICLE_C,
    ARTICLE_C_SPEEDUP,
    ARTICLE_C_WORKLOAD,
)
from benchbatch.output.report.beyond import (
    section_memory,
    section_prediction,
    section_roofline,
    section_serve,
)
from benchbatch.output.report.beyond_claims import prediction_claim, serve_claim
from benchbatch.output.report.cells import (
    measured_cell,
    number,
    ok_rows,
    pair,
    pair_percent,
    percent,
    status_of,
    times,
)
from benchbatch.output.report.claims import UNEVEN_STEPS, claims
from benchbatch.output.report.shapes import Report, Section

# --- table B: prefill vs decode ------------------------------------------------------------


def pair_sizes(article: Sequence[int], measured: Sequence[int]) -> list[int | None]:
    """The measured size set beside each article size: the same size when every article size
    was measured, else by rank (first with smallest, last with largest), as a CPU-sized run
    scales the article's prompts and batches down together."""
    measured = sorted(set(measured))
    if all(a in measured for a in article):
        return list(article)
    if not measured:
        return [None] * len(article)
    if len(measured) == 1:
        nearest = min(range(len(article)), key=lambda i: abs(math.log(article[i] / measured[0])))
        return [measured[0] if i == nearest else None for i in range(len(article))]
    middle = [a if a in measured[1:-1] else None for a in article[1:-1]]
    return [measured[0], *middle, measured[-1]]


def decode_context(rows: list[dict]) -> int | None:
    """The context table B's decodes are read at: the smallest measured, the one its
    verdicts (phases' summary) compare at."""
    return min((int(r["context"]) for r in rows if r.get("phase") == "decode"), default=None)


def table_b(rows: list[dict]) -> list[dict]:
    """One entry per row of the article's table B, with its measured counterpart (or None):
    decodes at decode_context only (another context's would be another step)."""
    out = []
    context = decode_context(rows)
    for phase in ("prefill", "decode"):
        mine = [r for r in rows if r.get("phase") == phase and _size(r) is not None
                and (phase == "prefill" or int(r["context"]) == context)]  # fmt: skip
        by_size = {_size(r): r for r in sorted(mine, key=lambda r: r.get("status") == "ok")}
        steps = [s for s in ARTICLE_B if s.phase == phase]
        for step, size in zip(steps, pair_sizes([s.size for s in steps], by_size), strict=True):
            out.append({"article": step, "measured": by_size.get(size)})
    return out


def _size(row: dict) -> int | None:
    """Prompt tokens of a single-sequence prefill, or sequences of a decode step."""
    if row.get("phase") == "prefill":
        return int(row["tokens"]) if int(row.get("batch", 1)) == 1 else None
    return int(row["batch"])


def _section_b(rows: list[dict], image: str | None) -> Section:
    unit = flop_unit(number(r, "tflops") for r in ok_rows(rows))
    headers = ["article step", "measured step", "step ms", "us/token (cost)", unit.name, "MFU",
               "bound"]  # fmt: skip
    body = []
    for entry in table_b(rows):
        a, m = entry["article"], entry["measured"]
        body.append(
            [
                a.label,
                m["label"] if m else "not measured",
                pair(a.step_ms, number(m, "step_ms")),
                pair(a.us_per_token, number(m, "us_per_token")),
                pair(unit(a.tflops), unit(number(m, "tflops"))),
                percent(number(m, "mfu")),
                str(m.get("bound") or "-") if m and m.get("status", "ok") == "ok" else status_of(m),
            ]
        )
    intro = [
        "One step of each kind: prefill multiplies every weight by a whole prompt (many "
        "FLOPs for each byte read: compute-bound), decode by one token per sequence (few: "
        "memory-bound at small batches; the bound column says where each step fell here). "
        "The steps were "
        "timed together, their repeats interleaved, so a load that came and went slowed "
        "each of them alike.",
        "Cells read article / measured. us/token is the step's cost per token (step time "
        "over the tokens it made). MFU is the achieved FLOP/s over this device's matmul "
        "ceiling (probe); bound is memory or compute from the step's arithmetic intensity "
        "against the ridge point of the same ceilings.",
    ]
    contexts = sorted({int(r["context"]) for r in rows if r.get("phase") == "decode"})
    if contexts:
        others = contexts[1:]
        intro.append(
            f"The decode steps are at context {contexts[0]:,} (tokens already cached per "
            "sequence)" + (f"; those at {', '.join(f'{c:,}' for c in others)} are in "
                           "phases.csv." if others else ".")  # fmt: skip
        )
    if any(e["measured"] and e["article"].label != e["measured"]["label"] for e in table_b(rows)):
        intro.append(
            "The measured sizes differ from the article's: they are paired by rank (shortest "
            "prompt with 512, longest with 2048; smallest decode batch with 1, largest with 32)."
        )
    return Section("B. Prefill vs decode, one step each", intro, headers, body, image)


# --- table A: batch sweep ------------------------------------------------------------------


def sweep_context(rows: list[dict], preferred: int = 512) -> int | None:
    """The context table A is read at: the article's 512 when measured, else the smallest."""
    contexts = sorted({int(r["context"]) for r in rows})
    if not contexts:
        return None
    return preferred if preferred in contexts else contexts[0]


def table_a(rows: list[dict]) -> list[dict]:
    """One entry per batch, the article's and the measured ones (union), in batch order."""
    context = sweep_context(rows)
    mine = {int(r["batch"]): r for r in rows if int(r["context"]) == context}
    out = []
    for batch in sorted(set(ARTICLE_A) | set(mine)):
        article = ARTICLE_A.get(batch)
        out.append(
            {
                "batch": batch,
                "article_step_ms": article[0] if article else None,
                "article_tokens_per_s": article[1] if article else None,
                "measured": mine.get(batch),
            }
        )
    return out


def _section_a(rows: list[dict], claim: dict | None, image: str | None) -> Section:
    entries = table_a(rows)
    headers = ["", *(f"batch {e['batch']:,}" for e in entries)]

    def line(name: str, value) -> list[str]:
        return [name, *(value(e) for e in entries)]

    body = [
        line("step ms, article", lambda e: fmt(e["article_step_ms"])),
        line("step ms, measured", lambda e: measured_cell(e["measured"], "step_ms")),
        line("tokens/s, article", lambda e: fmt(e["article_tokens_per_s"])),
        line("tokens/s, measured", lambda e: measured_cell(e["measured"], "tokens_per_s")),
        line("MBU, measured", lambda e: percent(number(e["measured"], "mbu"))),
    ]
    context = sweep_context(rows)
    intro = [
        f"Decode steps at context {context:,} (the article's 512 when measured): a step "
        "reads every weight once whatever the batch, so while it is bound by that read more "
        "sequences cost little. A '-' is a batch the article or this run did not measure.",
        "MBU is the achieved bytes/s over this device's measured memory bandwidth (probe).",
    ]
    notes = []
    if claim and "batch_from" in claim:
        notes.append(
            f"From batch {claim['batch_from']:,} to {claim['batch_to']:,}: throughput "
            f"x{figure(claim['throughput_ratio'])}{summary_range(claim, 'throughput_ratio')}, "
            f"step time x{figure(claim['step_latency_ratio'])}"
            f"{summary_range(claim, 'step_latency_ratio')} (article, 1 to 256: x223 and x1.1)."
        )
    if claim and claim.get("measured_knee") is not None:
        notes.append(
            f"Measured knee: batch {claim['measured_knee']:,}, the first whose step time "
            f"exceeds batch {claim['batch_from']:,}'s by more than {claim['knee_threshold']:.0%}."
        )
    return Section("A. Batch size vs decode step", intro, headers, body, image, notes)


# --- experiment C: static vs continuous ------------------------------------------------------


def table_c(rows: list[dict]) -> list[dict]:
    """One entry per article policy (static, continuous) with its measured row or None."""
    mine = {r["policy"]: r for r in rows}
    return [
        {"policy": p, "article_total_steps": s, "article_occupancy": o, "measured": mine.get(p)}
        for p, (s, o) in ARTICLE_C.items()
    ]


def _section_c(sim_rows: list[dict], sim_workload: str, image: str | None) -> Section:
    headers = ["policy", "total steps", "slot occupancy", "speedup over static"]
    body = []
    for e in table_c(sim_rows):
        m = e["measured"]
        article_speedup = ARTICLE_C_SPEEDUP if e["policy"] == "continuous" else 1.0
        body.append(
            [
                e["policy"],
                pair(e["article_total_steps"], number(m, "total_steps")),
                pair_percent(e["article_occupancy"], number(m, "occupancy")),
                pair(article_speedup, number(m, "speedup_vs_static"), suffix="x"),
            ]
        )
    intro = [
        "Cells read article / simulated. A request with n output tokens holds a slot for n "
        "decode steps; static batching admits requests in groups of the slot count and a "
        "group lasts as long as its longest request; continuous batching refills a slot the "
        "step after it frees. Occupancy = output tokens / (steps x slots).",
        f"Article: {ARTICLE_C_WORKLOAD}. This run: {sim_workload}.",
    ]
    title = "C. Slot occupancy, static vs continuous batching"
    return Section(title, intro, headers, body, image)


REAL_TITLE = "C on the real engine"


def _section_real(rows: list[dict], workload: str | None, image: str | None) -> Section:
    """The same two policies run on the model: steps, wall time and the speedup measured."""
    headers = ["policy", "steps", "slot occupancy", "wall s", "tokens/s", "speedup (wall)"]
    body = [
        [
            str(r["policy"]),
            fmt(number(r, "total_steps")),
            percent(number(r, "occupancy")),
            fmt(number(r, "wall_s")),
            fmt(number(r, "tokens_per_s")),
            times(number(r, "speedup_vs_static")),
        ]
        for r in rows
    ]
    intro = [
        f"Both policies on the model itself ({workload}): the engine runs the scheduler's "
        "steps, so the step counts equal a simulation of this workload, and the wall time "
        "says whether fewer steps also means less time on this device.",
    ]
    notes = []
    slowed = [r for r in rows if (number(r, "measured_over_sim") or 0) > UNEVEN_STEPS]
    if slowed:
        which = ", ".join(f"{r['policy']} x{number(r, 'measured_over_sim'):.2f}" for r in slowed)
        notes.append(
            f"Uneven step times ({which} the steps priced at the run's median step): part of "
            "the run was slowed, most likely by another process on the device, so the "
            "wall-time speedup is less sure than the step counts."
        )
    return Section(REAL_TITLE, intro, headers, body, image, notes)


# --- the whole report ------------------------------------------------------------------------


def build(
    *,
    title: str,
    notices: list[str],
    facts: list[tuple[str, str]],
    phases_rows: list[dict],
    phases_summary: dict | None,
    sweep_rows: list[dict],
    sweep_claim: dict | None,
    occupancy_rows: list[dict],
    occupancy_workload: str,
    real_rows: list[dict] | None = None,
    real_workload: str | None = None,
    ceilings: dict | None = None,
    files: Sequence[str] = (),
    memory_ceiling: list[dict] | None = None,
    memory_rows: list[dict] | None = None,
    serve_rows: list[dict] | None = None,
    serve_slo: list[dict] | None = None,
    serve_meta: dict | None = None,
    ceilings_raised: list[dict] | None = None,
    prediction_rows: list[dict] | None = None,
    prediction_verdict: str | None = None,
    prediction_at_speed: str | None = None,
) -> Report:
    """Every section of the report, from rows and summaries (see reproduce's metadata)."""
    images = set(files)

    def image(name: str) -> str | None:
        return name if name in images else None

    sections = [
        _section_b(phases_rows, image("phases.png")),
        _section_a(sweep_rows, sweep_claim, image("sweep.png")),
        _section_c(occupancy_rows, occupancy_workload, image("occupancy.png")),
    ]
    if real_rows:
        sections.append(_section_real(real_rows, real_workload, image("engine.png")))
    if prediction_rows:
        sections.append(section_prediction(prediction_rows, prediction_verdict,
                                           image("prediction.png"),
                                           prediction_at_speed))  # fmt: skip
    if memory_ceiling:
        sections.append(section_memory(memory_ceiling, memory_rows, image("memory.png")))
    if serve_rows:
        sections.append(section_serve(serve_rows, serve_slo or [], serve_meta or {},
                                      image("serve.png")))  # fmt: skip
    if ceilings:
        sections.append(section_roofline(ceilings, image("roofline.png"), ceilings_raised))
    found = claims(phases_summary, sweep_claim, occupancy_rows, real_rows, memory_ceiling,
                   phases_rows, sweep_rows)  # fmt: skip
    found += [serve_claim(serve_slo)] if serve_slo else []
    found += [prediction_claim(prediction_rows)] if prediction_rows else []
    return Report(title, list(notices), list(facts), found, sections, list(files))
