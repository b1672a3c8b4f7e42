"""The reproduction report: each measurement beside the article's number, and a verdict on
each claim computed from the measured numbers against thresholds stated in the report.

Pure: rows and summaries (as the CSV files and metadata.json hold them) go in, a `Report`
comes out, and `to_markdown` / `to_html` render it (the HTML with the plots inline as
base64 PNG, so one file can be mailed or attached to an issue). Nothing here measures,
prints or writes.

The article's numbers were measured on an RTX 5080 in fp16 with torch 2.8 (its "12 layers,
hidden 2048" model: 77.6 TFLOP/s x 0.664 ms / 512 tokens is 2 x 12 x 2048^2 FLOPs a token,
so twelve 2048 x 2048 linear layers); table C is a simulation of 600 requests on 32 slots.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from benchbatch.render import fmt
from benchbatch.units import flop_unit

ARTICLE_SOURCE = "the article (RTX 5080, fp16, 12 linear layers of 2048 x 2048)"

HOLDS, PARTLY, FAILS, UNMEASURED = "holds", "partly", "does not hold", "not measured"


@dataclass(frozen=True)
class ArticleStep:
    """One row of the article's table B."""

    phase: str  # prefill or decode
    size: int  # prompt tokens (prefill) or sequences (decode)
    step_ms: float
    us_per_token: float
    tflops: float

    @property
    def label(self) -> str:
        return f"prefill {self.size}" if self.phase == "prefill" else f"decode b={self.size}"


ARTICLE_B = (
    ArticleStep("prefill", 512, 0.664, 1.3, 77.6),
    ArticleStep("prefill", 2048, 1.955, 1.0, 105.5),
    ArticleStep("decode", 1, 0.319, 318.9, 0.3),
    ArticleStep("decode", 32, 0.257, 8.0, 12.6),
)
# Table A: batch -> (step ms, tokens/s), decode at context 512.
ARTICLE_A = {
    1: (0.321, 3120.0),
    8: (0.243, 32971.0),
    32: (0.246, 130006.0),
    128: (0.228, 561933.0),
    256: (0.368, 696195.0),
}
# Experiment C: policy -> (total steps, slot occupancy); 600 requests, 32 slots.
ARTICLE_C = {"static": (9602, 0.203), "continuous": (2445, 0.799)}
ARTICLE_C_SPEEDUP = 3.93
ARTICLE_C_WORKLOAD = "600 requests (output median 70, max 1,327 tokens), 32 slots, all queued"


@dataclass(frozen=True)
class Rule:
    """A claim's verdict: holds at or above `holds`, partly at or above `partly`."""

    holds: float
    partly: float
    text: str

    def verdict(self, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return UNMEASURED
        if value >= self.holds:
            return HOLDS
        return PARTLY if value >= self.partly else FAILS


# The thresholds, stated once: the report prints each rule's text beside its verdict.
PREFILL_RULE = Rule(10.0, 2.0, "holds at 10x or more, partly at 2x or more")
SPEEDUP_RULE = Rule(2.0, 1.2, "holds at 2x or more, partly at 1.2x or more")
# A real run whose wall time exceeds its steps x its median step by this much was disturbed.
UNEVEN_STEPS = 1.5
# Decode per-token cost against perfect batching (cost / (batch_to / batch_from)).
BATCHING_FRACTION, BATCHING_MIN_HOLDS, BATCHING_MIN_PARTLY = 0.25, 2.0, 1.25
BATCHING_RULE_TEXT = (
    "holds when each token got at least a quarter of perfect batching cheaper (batch 1 to 32: "
    "8x) and at least 2x cheaper; partly when at least 1.25x cheaper"
)
# Throughput vs latency: how much faster throughput grew than the step time.
LATENCY_HOLDS = 2.0  # the step time at most doubled...
THROUGHPUT_OVER_LATENCY = 2.0  # ...and throughput grew at least twice as fast as it
LATENCY_RULE_TEXT = (
    "holds when the step time at most doubled while throughput grew at least twice as fast "
    "as it; partly when throughput still grew at least twice as fast as the step time"
)
# Memory, not compute: the ceiling reserving prompt + maximum output against the compute knee.
PAGING_GAIN = 2.0  # paging must at least double the sequences that fit
MEMORY_RULE_TEXT = (
    "holds when the memory ceiling reserving prompt + maximum output per sequence comes before "
    "the compute knee (the sweep's measured knee; with none, its largest batch, where the step "
    "time had not yet grown 25%) and paging at least doubles that ceiling; partly when only "
    "one of the two; does not hold when neither"
)
MEMORY_TITLE = "Memory, not compute, limits the batch"


@dataclass(frozen=True)
class Claim:
    key: str
    claim: str
    article: str
    measured: str
    verdict: str
    rule: str
    caveat: str = ""  # the rows it rests on were noisy or slowed: the verdict is less sure

    def with_caveat(self, caveat: str) -> Claim:
        return replace(self, caveat=caveat)

    @property
    def verdict_text(self) -> str:
        """The verdict as shown, with its caveat beside it."""
        return f"{self.verdict} ({self.caveat})" if self.caveat else self.verdict


@dataclass
class Section:
    title: str
    intro: list[str]
    headers: list[str]
    rows: list[list[str]]
    image: str | None = None  # a PNG file name in the run folder
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    title: str
    notices: list[str]  # shown first, in bold (CPU-sized run, failed parts)
    facts: list[tuple[str, str]]  # what was run, on what
    claims: list[Claim]
    sections: list[Section]
    files: list[str]


# --- table B: prefill vs decode ------------------------------------------------------------


def _ok(rows: Iterable[dict]) -> list[dict]:
    return [r for r in rows if r.get("status", "ok") == "ok"]


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


def table_b(rows: list[dict]) -> list[dict]:
    """One entry per row of the article's table B, with its measured counterpart (or None)."""
    out = []
    for phase in ("prefill", "decode"):
        mine = [r for r in rows if r.get("phase") == phase and _size(r) is not None]
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
    unit = flop_unit(_get(r, "tflops") for r in _ok(rows))
    headers = ["article step", "measured step", "step ms", "us/token (cost)", unit.name, "MFU",
               "bound"]  # fmt: skip
    body = []
    for entry in table_b(rows):
        a, m = entry["article"], entry["measured"]
        body.append(
            [
                a.label,
                m["label"] if m else "not measured",
                _pair(a.step_ms, _get(m, "step_ms")),
                _pair(a.us_per_token, _get(m, "us_per_token")),
                _pair(unit(a.tflops), unit(_get(m, "tflops"))),
                _percent(_get(m, "mfu")),
                str(m.get("bound") or "-") if m and m.get("status", "ok") == "ok" else _status(m),
            ]
        )
    intro = [
        "One step of each kind: prefill multiplies every weight by a whole prompt "
        "(compute-bound), decode by one token per sequence (memory-bound). The steps were "
        "timed together, their repeats interleaved, so a load that came and went slowed "
        "each of them alike.",
        "Cells read article / measured. us/token is the step's cost per token (step time "
        "over the tokens it made). MFU is the achieved FLOP/s over this device's matmul "
        "ceiling (probe); bound is memory or compute from the step's arithmetic intensity "
        "against the ridge point of the same ceilings.",
    ]
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
        line("step ms, measured", lambda e: _measured(e["measured"], "step_ms")),
        line("tokens/s, article", lambda e: fmt(e["article_tokens_per_s"])),
        line("tokens/s, measured", lambda e: _measured(e["measured"], "tokens_per_s")),
        line("MBU, measured", lambda e: _percent(_get(e["measured"], "mbu"))),
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
            f"x{claim['throughput_ratio']:.3g}, step time x{claim['step_latency_ratio']:.3g} "
            "(article, 1 to 256: x223 and x1.1)."
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
                _pair(e["article_total_steps"], _get(m, "total_steps")),
                _pair_percent(e["article_occupancy"], _get(m, "occupancy")),
                _pair(article_speedup, _get(m, "speedup_vs_static"), suffix="x"),
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
            fmt(_get(r, "total_steps")),
            _percent(_get(r, "occupancy")),
            fmt(_get(r, "wall_s")),
            fmt(_get(r, "tokens_per_s")),
            _times(_get(r, "speedup_vs_static")),
        ]
        for r in rows
    ]
    intro = [
        f"Both policies on the model itself ({workload}): the engine runs the scheduler's "
        "steps, so the step counts equal a simulation of this workload, and the wall time "
        "says whether fewer steps also means less time on this device.",
    ]
    notes = []
    slowed = [r for r in rows if (_get(r, "measured_over_sim") or 0) > UNEVEN_STEPS]
    if slowed:
        which = ", ".join(f"{r['policy']} x{_get(r, 'measured_over_sim'):.2f}" for r in slowed)
        notes.append(
            f"Uneven step times ({which} the steps priced at the run's median step): part of "
            "the run was slowed, most likely by another process on the device, so the "
            "wall-time speedup is less sure than the step counts."
        )
    return Section(REAL_TITLE, intro, headers, body, image, notes)


# --- the serving curve -------------------------------------------------------------------------

SERVE_TITLE = "Serving curve: request rate against latency (simulated)"
SERVE_POLICIES = ("static", "continuous", "chunked")


def section_serve(rows: list[dict], slo: list[dict], meta: dict, image: str | None) -> Section:
    """p99 TTFT and p99 TPOT of each policy at each rate, and where each leaves the SLO."""
    rates = list(dict.fromkeys(str(r["rate"]) for r in rows))
    by = {(r["policy"], str(r["rate"])): r for r in rows}
    headers = ["policy", *(f"{rate} req/s" for rate in rates), "leaves the SLO at"]
    leaves = {r["policy"]: r for r in slo if r.get("source") == "sim"}
    body = []
    for policy in (p for p in SERVE_POLICIES if any(k[0] == p for k in by)):
        cells = [_serve_cell(by.get((policy, rate))) for rate in rates]
        body.append([policy, *cells, _leaves(leaves.get(policy))])
    limits = meta.get("slo") or {}
    intro = [
        "Poisson arrivals at three request rates (fractions of the simulated capacity), "
        "simulated with a step-cost model fitted to this run's phases and sweep steps; "
        f"{meta.get('workload', '')}. Cells: p99 TTFT s / p99 TPOT ms, and whether both "
        f"are within the SLO (TTFT {limits.get('ttft_s', '-')} s, TPOT "
        f"{1e3 * limits.get('tpot_s', math.nan):g} ms). `benchbatch serve-sweep` draws the "
        "whole curve and serves it on the model.",
    ]
    return Section(SERVE_TITLE, intro, headers, body, image, serve_lines(slo))


def _serve_cell(r: dict | None) -> str:
    if r is None:
        return "-"
    ok = "within" if r.get("within_slo") in (True, "True") else "outside"
    return f"{fmt(_get(r, 'ttft_p99_s'))} / {fmt(1e3 * (_get(r, 'tpot_p99_s') or math.nan))}, {ok}"


def _leaves(r: dict | None) -> str:
    if r is None:
        return "-"
    left = r.get("leaves_slo_at")
    return f"{left} req/s" if left not in (None, "") and left == left else "stays within"


def serve_lines(slo: list[dict]) -> list[str]:
    """Where each policy leaves the SLO, in words."""
    lines = []
    for r in slo:
        if r.get("source") != "sim":
            continue
        left, kept = r.get("leaves_slo_at"), r.get("sustained_rate")
        if left in (None, "") or left != left:
            lines.append(f"{r['policy']} stays within the SLO at every rate (up to {kept} req/s).")
        elif kept in (None, "") or kept != kept:
            lines.append(f"{r['policy']} is outside the SLO already at {left} req/s.")
        else:
            lines.append(f"{r['policy']} leaves the SLO at {left} req/s (within up to {kept}).")
    return lines


def serve_claim(slo: list[dict]) -> Claim:
    by = {r["policy"]: r for r in slo if r.get("source") == "sim"}
    rates = {p: _get(by.get(p), "sustained_rps") or 0.0 for p in ("static", "continuous")}
    measured, verdict = "not measured", UNMEASURED
    if "static" in by and "continuous" in by:
        s, cont = rates["static"], rates["continuous"]
        measured = f"continuous within up to {fmt(cont)} req/s, static up to {fmt(s)} (simulated)"
        verdict = HOLDS if cont > s else (PARTLY if cont == s else FAILS)
    return Claim(
        "S",
        "continuous batching sustains a higher request rate than static within the same SLO",
        "(a serving benchmark's view of claim C)",
        measured,
        verdict,
        "holds when continuous stays within the SLO at a higher rate than static; partly at "
        "the same rate",
    )


# --- claims ----------------------------------------------------------------------------------


def claims(
    phases_summary: dict | None,
    sweep_claim: dict | None,
    occupancy_rows: list[dict] | None,
    real_rows: list[dict] | None = None,
    memory_ceiling: list[dict] | None = None,
    phases_rows: list[dict] | None = None,
    sweep_rows: list[dict] | None = None,
) -> list[Claim]:
    """Every claim the report judges, its measured number and its verdict; a verdict that
    rests on noisy or slowed rows says which, beside it."""
    s, a = phases_summary or {}, sweep_claim or {}
    out = [
        _prefill_claim(s).with_caveat(_caveat(_prefill_rows(phases_rows or [], s))),
        _batching_claim(s).with_caveat(_caveat(_batching_rows(phases_rows or [], s))),
        _latency_claim(a).with_caveat(_caveat(_latency_rows(sweep_rows or [], a))),
        _occupancy_claim("C", "simulated", occupancy_rows or []),
    ]
    if real_rows:
        real = _occupancy_claim("C, real engine", "measured wall time", real_rows)
        out.append(real.with_caveat(_real_caveat(real_rows)))
    if memory_ceiling:
        out.append(_memory_claim(memory_ceiling[0], sweep_claim or {}))
    return out


def memory_verdict(reserved: int, paged: int, knee: int | None, largest_batch: int | None) -> str:
    """MEMORY_RULE_TEXT: memory before compute, and paging's gain, each a half."""
    first = bool(_memory_first(reserved, knee, largest_batch))  # unknown counts as not shown
    gain = paged >= PAGING_GAIN * reserved and paged > 0
    if first and gain:
        return HOLDS
    return PARTLY if (first or gain) else FAILS


def _memory_first(reserved: int, knee: int | None, largest_batch: int | None) -> bool | None:
    """Does the reserved ceiling come before compute saturates? None when unknown."""
    if knee is not None:
        return reserved < knee
    if largest_batch is None:
        return None
    return reserved <= largest_batch


def _memory_claim(c: dict, sweep: dict) -> Claim:
    knee, largest = sweep.get("measured_knee"), sweep.get("batch_to")
    reserved, paged = int(c["reserved_sequences"]), int(c["paged_sequences"])
    compute = f"compute knee at batch {knee:,}" if knee else "no compute knee measured"
    if not knee and largest:
        compute += f" up to batch {largest:,}"
    measured = (
        f"{reserved:,} sequences reserving {int(c['reserved_tokens']):,} tokens vs "
        f"{paged:,} paged on {c['where']} ({fmt(c['memory_bytes'] / 2**30)} GiB); {compute}"
    )
    return Claim(
        "memory",
        "memory, not compute, limits the batch (and paging lifts the limit)",
        "every running request holds its KV cache, so memory caps the batch before compute; "
        "PagedAttention fills it densely",
        measured,
        memory_verdict(reserved, paged, knee, largest),
        MEMORY_RULE_TEXT,
    )


def _section_memory(ceilings: list[dict], memory_rows: list[dict] | None, image) -> Section:
    headers = ["memory", "GiB", "reserved: tokens each", "reserved: sequences",
               "paged: mean tokens", "paged: sequences", "paging gain"]  # fmt: skip
    body = [
        [
            str(c["where"]),
            fmt(c["memory_bytes"] / 2**30),
            fmt(int(c["reserved_tokens"])),
            fmt(int(c["reserved_sequences"])),
            fmt(float(c["paged_mean_tokens"])),
            fmt(int(c["paged_sequences"])),
            _times(_get(c, "paging_gain")),
        ]
        for c in ceilings
    ]
    intro = [
        "How many sequences of the occupancy workload fit beside the weights (a tenth of the "
        "memory held back): reserving the longest prompt plus the maximum output each (a "
        "contiguous cache row), against paged blocks at the lengths they reach.",
    ]
    notes = []
    for r in memory_rows or []:
        notes.append(
            f"{r['policy']} (simulated on one budget): peak {int(r['peak_running']):,} "
            f"running, mean {fmt(_get(r, 'mean_running'))}, "
            f"{_percent(_get(r, 'fragmentation'))} of the reserved memory never written, "
            f"{int(r['preemptions']):,} preemptions, {fmt(int(r['total_steps']))} steps."
        )
    return Section(MEMORY_TITLE, intro, headers, body, image, notes)


def _first_context_decodes(rows: list[dict]) -> list[dict]:
    """The decode rows phases' summary compares: those at the first context measured."""
    dec = [r for r in _ok(rows) if r.get("phase") == "decode"]
    first = min((int(r["context"]) for r in dec), default=None)
    return [r for r in dec if int(r["context"]) == first]


def _prefill_rows(rows: list[dict], s: dict) -> list[dict]:
    pre = [r for r in _ok(rows) if r.get("label") == s.get("prefill_label")]
    dec = [r for r in _first_context_decodes(rows) if r.get("label") == s.get("decode_label")]
    return pre + dec


def _batching_rows(rows: list[dict], s: dict) -> list[dict]:
    batches = s.get("decode_batches") or []
    return [r for r in _first_context_decodes(rows) if int(r["batch"]) in batches]


def _latency_rows(rows: list[dict], c: dict) -> list[dict]:
    if "batch_from" not in c:
        return []
    ends = (c["batch_from"], c["batch_to"])
    context = c.get("context")
    return [
        r for r in _ok(rows)
        if int(r["batch"]) in ends and (context is None or int(r["context"]) == context)
    ]  # fmt: skip


def _flagged(row: dict, flag: str) -> bool:
    return row.get(flag) is True or str(row.get(flag)).lower() == "true"


def _caveat(rows: list[dict]) -> str:
    """Which of the rows a verdict rests on were noisy (their repeats spread) or slowed."""
    noisy = [f"{r['label']} (CV {float(r['cv']):.0%})" for r in rows if _flagged(r, "noisy")]
    slowed = [str(r["label"]) for r in rows if _flagged(r, "throttled")]
    parts = ([f"noisy {', '.join(noisy)}"] if noisy else []) + (
        [f"throttled {', '.join(slowed)}"] if slowed else []
    )
    return "rests on " + "; ".join(parts) if parts else ""


def _real_caveat(rows: list[dict]) -> str:
    """The real engine's steps spread (another process took the device meanwhile)."""
    from benchbatch.noise import NOISY_P90_OVER_MEDIAN

    uneven = []
    for r in rows:
        p90, median = _get(r, "p90_step_ms"), _get(r, "median_step_ms")
        if p90 and median and p90 > NOISY_P90_OVER_MEDIAN * median:
            uneven.append(f"{r['policy']} (p90 step {p90 / median:.2g}x the median)")
        elif (_get(r, "measured_over_sim") or 0) > UNEVEN_STEPS:
            uneven.append(f"{r['policy']} (wall {_get(r, 'measured_over_sim'):.2g}x its steps)")
    return f"rests on uneven steps: {', '.join(uneven)}" if uneven else ""


def _prefill_claim(s: dict) -> Claim:
    ratio = s.get("prefill_over_decode_tflops")
    measured = "not measured"
    if ratio is not None:
        measured = f"{ratio:.3g}x ({s['prefill_label']} over {s['decode_label']})"
    return Claim(
        "B",
        "prefill runs at far more FLOP/s than decode on the same device",
        "350x (105.5 vs 0.3 TFLOP/s)",
        measured,
        PREFILL_RULE.verdict(ratio),
        PREFILL_RULE.text,
    )


def _batching_claim(s: dict) -> Claim:
    ratio = s.get("decode_token_cost_ratio")
    measured, verdict = "not measured", UNMEASURED
    if ratio is not None:
        b0, b1 = s["decode_batches"]
        measured = f"{ratio:.3g}x cheaper (batch {b0:,} to {b1:,})"
        verdict = batching_verdict(ratio, b1 / b0)
    return Claim(
        "B",
        "batching decodes makes each token much cheaper",
        "40x cheaper (batch 1 to 32: 318.9 to 8.0 us)",
        measured,
        verdict,
        BATCHING_RULE_TEXT,
    )


def batching_verdict(cost_ratio: float, batch_ratio: float) -> str:
    if not math.isfinite(cost_ratio):
        return UNMEASURED
    if cost_ratio >= max(BATCHING_MIN_HOLDS, BATCHING_FRACTION * batch_ratio):
        return HOLDS
    return PARTLY if cost_ratio >= BATCHING_MIN_PARTLY else FAILS


def _latency_claim(c: dict) -> Claim:
    measured, verdict = "not measured", UNMEASURED
    if "batch_from" in c:
        t, lat = c["throughput_ratio"], c["step_latency_ratio"]
        measured = (
            f"throughput x{t:.3g}, step time x{lat:.3g} "
            f"(batch {c['batch_from']:,} to {c['batch_to']:,})"
        )
        verdict = latency_verdict(t, lat)
    return Claim(
        "A",
        "throughput grows much faster than each user's wait (step time) as the batch grows",
        "throughput x223, step time x1.1 (batch 1 to 256)",
        measured,
        verdict,
        LATENCY_RULE_TEXT,
    )


def latency_verdict(throughput_ratio: float, latency_ratio: float) -> str:
    if not (math.isfinite(throughput_ratio) and math.isfinite(latency_ratio)):
        return UNMEASURED
    faster = throughput_ratio >= THROUGHPUT_OVER_LATENCY * latency_ratio
    if faster and latency_ratio <= LATENCY_HOLDS:
        return HOLDS
    return PARTLY if faster else FAILS


def _occupancy_claim(key: str, how: str, rows: list[dict]) -> Claim:
    by = {r["policy"]: r for r in rows}
    static, cont = by.get("static"), by.get("continuous")
    speedup = _get(cont, "speedup_vs_static")
    measured = "not measured"
    if static and cont and speedup is not None:
        measured = (
            f"occupancy {_percent(_get(static, 'occupancy'))} vs "
            f"{_percent(_get(cont, 'occupancy'))}, {speedup:.3g}x faster ({how})"
        )
    return Claim(
        key,
        "continuous batching fills the slots and finishes the same requests much sooner",
        "occupancy 20.3% vs 79.9%, 3.93x faster",
        measured,
        SPEEDUP_RULE.verdict(speedup),
        SPEEDUP_RULE.text,
    )


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
    if memory_ceiling:
        sections.append(_section_memory(memory_ceiling, memory_rows, image("memory.png")))
    if serve_rows:
        sections.append(section_serve(serve_rows, serve_slo or [], serve_meta or {},
                                      image("serve.png")))  # fmt: skip
    if ceilings:
        sections.append(_section_roofline(ceilings, image("roofline.png"), ceilings_raised))
    return Report(
        title,
        list(notices),
        list(facts),
        claims(phases_summary, sweep_claim, occupancy_rows, real_rows, memory_ceiling,
               phases_rows, sweep_rows)  # fmt: skip
        + ([serve_claim(serve_slo)] if serve_slo else []),
        sections,
        list(files),
    )


def _section_roofline(s: dict, image: str | None, raised: list[dict] | None = None) -> Section:
    m, d = s["measured"], s.get("datasheet")
    unit = flop_unit([m["peak_tflops"]])
    headers = ["ceiling", "measured", "measured by", f"datasheet ({s.get('datasheet_name', '-')})"]
    body = []
    for name, key, source, scale in (
        (f"matmul {unit.name}", "peak_tflops", m.get("tflops_source", ""), unit.per_tflops),
        ("memory GB/s", "peak_gbps", m.get("gbps_source", ""), 1),
        ("ridge FLOP/byte", "ridge", "", 1),
    ):
        sheet = fmt(d[key] * scale) if d else "unknown"
        body.append([name, fmt(m[key] * scale), source, sheet])
    intro = [
        f"This device's ceilings in {m['dtype']}, measured by the probe; every phases and "
        "sweep step is placed under them (solid roof: measured; dashed: datasheet, when known).",
    ]
    notes = [
        f"The {r['ceiling']} ceiling was raised from {fmt(r['from'])} to {fmt(r['to'])} "
        f"{r['unit']}: {r['by']} reached it, so the probe had measured it low (another "
        "process during the probe, or sizes it did not try). Every MFU and MBU is against "
        "the raised ceiling."
        for r in raised or []
    ]
    return Section("Roofline: the measured ceilings", intro, headers, body, image, notes)


# --- rendering -------------------------------------------------------------------------------

VERDICT_MARK = {HOLDS: "holds", PARTLY: "partly", FAILS: "does not hold", UNMEASURED: "-"}


def claim_rows(report: Report) -> list[list[str]]:
    return [[c.key, c.claim, c.article, c.measured, c.verdict_text, c.rule] for c in report.claims]


CLAIM_HEADERS = ["", "claim", "article", "this run", "verdict", "rule"]


def to_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    lines += [f"**{n}**\n" for n in report.notices]
    lines += [f"- {k}: {v}" for k, v in report.facts] + [""]
    lines += ["## Verdicts", "", *_md_table(CLAIM_HEADERS, claim_rows(report)), ""]
    for s in report.sections:
        lines += [f"## {s.title}", ""]
        for paragraph in s.intro:
            lines += [paragraph, ""]
        lines += [*_md_table(s.headers, s.rows), ""]
        lines += [f"- {n}" for n in s.notes] + ([""] if s.notes else [])
        if s.image:
            lines += [f"![{s.title}]({s.image})", ""]
    if report.files:
        lines += ["## Files", "", *(f"- `{f}`" for f in report.files), ""]
    return "\n".join(lines)


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    def cells(values) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    return [cells(headers), cells(["---"] * len(headers)), *(cells(r) for r in rows)]


CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.notice { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.5em 0.8em; }
.v-holds { background: #dff3df; } .v-partly { background: #fff1cc; }
.v-fails { background: #f8d7d7; } .v-none { background: #eee; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
"""
VERDICT_CLASS = {HOLDS: "v-holds", PARTLY: "v-partly", FAILS: "v-fails", UNMEASURED: "v-none"}


def to_html(report: Report, images: dict[str, bytes]) -> str:
    """One self-contained page: `images` maps a section's PNG name to its bytes."""
    e = html.escape
    out = [
        "<!doctype html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{e(report.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(report.title)}</h1>",
    ]
    out += [f'<p class="notice"><strong>{e(n)}</strong></p>' for n in report.notices]
    out.append("<ul>" + "".join(f"<li>{e(k)}: {e(v)}</li>" for k, v in report.facts) + "</ul>")
    out += ["<h2>Verdicts</h2>", _html_claims(report.claims)]
    for s in report.sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{e(p)}</p>" for p in s.intro]
        out.append(_html_table(s.headers, s.rows))
        if s.notes:
            out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in s.notes) + "</ul>")
        if s.image and s.image in images:
            data = base64.b64encode(images[s.image]).decode("ascii")
            out.append(f'<img alt="{e(s.title)}" src="data:image/png;base64,{data}">')
    if report.files:
        out += ["<h2>Files</h2>", "<ul>", *(f"<li><code>{e(f)}</code></li>" for f in report.files)]
        out.append("</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _html_claims(items: list[Claim]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in CLAIM_HEADERS)
    rows = []
    for c in items:
        cells = [c.key, c.claim, c.article, c.measured]
        tds = "".join(f"<td>{e(v)}</td>" for v in cells)
        caveat = f"<br>{e(c.caveat)}" if c.caveat else ""
        verdict = f"<strong>{e(c.verdict)}</strong>{caveat}"
        tds += f'<td class="{VERDICT_CLASS[c.verdict]}">{verdict}</td>'
        tds += f"<td>{e(c.rule)}</td>"
        rows.append(f"<tr>{tds}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


# --- cells -----------------------------------------------------------------------------------


def _get(row: dict | None, key: str) -> float | None:
    """A finite number from a row (CSV cells come back as text or NaN), else None."""
    if row is None:
        return None
    value = row.get(key)
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _status(row: dict | None) -> str:
    return "not measured" if row is None else str(row.get("status", "-"))


def _measured(row: dict | None, key: str) -> str:
    if row is None:
        return "-"
    value = _get(row, key)
    return fmt(value) if value is not None else _status(row)


def _pair(article: float | None, measured: float | None, suffix: str = "") -> str:
    a = f"{fmt(article)}{suffix}" if article is not None else "-"
    m = f"{fmt(measured)}{suffix}" if measured is not None else "-"
    return f"{a} / {m}"


def _pair_percent(article: float | None, measured: float | None) -> str:
    return f"{_percent(article)} / {_percent(measured)}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
