"""The claims the report judges: each one's measured number beside the article's, and a
verdict from the thresholds stated here (the report prints each rule beside its verdict). A
verdict resting on noisy, throttled or uneven rows carries a caveat saying which."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from benchbatch.core.kvceiling import reservation_text
from benchbatch.core.noise import same_work, summary_span
from benchbatch.core.units import figure, significant
from benchbatch.output.render import fmt
from benchbatch.output.report.cells import number, ok_rows, percent

HOLDS, PARTLY, FAILS, UNMEASURED = "holds", "partly", "does not hold", "not measured"


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
        _prefill_claim(s).with_caveat(_caveat(_prefill_rows(phases_rows or [], s), "phases")),
        _batching_claim(s).with_caveat(_caveat(_batching_rows(phases_rows or [], s), "phases")),
        _latency_claim(a).with_caveat(_caveat(_latency_rows(sweep_rows or [], a), "sweep")),
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
        f"{reserved:,} sequences reserving {reservation_text(c)} vs "
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


def _first_context_decodes(rows: list[dict]) -> list[dict]:
    """The decode rows phases' summary compares: those at the first context measured."""
    dec = [r for r in ok_rows(rows) if r.get("phase") == "decode"]
    first = min((int(r["context"]) for r in dec), default=None)
    return [r for r in dec if int(r["context"]) == first]


def _prefill_rows(rows: list[dict], s: dict) -> list[dict]:
    pre = [r for r in ok_rows(rows) if r.get("label") == s.get("prefill_label")]
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
        r for r in ok_rows(rows)
        if int(r["batch"]) in ends and (context is None or int(r["context"]) == context)
    ]  # fmt: skip


def _flagged(row: dict, flag: str) -> bool:
    return row.get(flag) is True or str(row.get(flag)).lower() == "true"


def _caveat(rows: list[dict], table: str) -> str:
    """Which of the rows a verdict rests on were noisy (their repeats spread) or slowed,
    each named with its table (phases' decode b=1 and sweep's are two rows)."""
    noisy = [f"{table} {r['label']} (CV {float(r['cv']):.0%})" for r in rows
             if _flagged(r, "noisy")]  # fmt: skip
    slowed = [f"{table} {r['label']}" for r in rows if _flagged(r, "throttled")]
    parts = ([f"noisy {', '.join(noisy)}"] if noisy else []) + (
        [f"throttled {', '.join(slowed)}"] if slowed else []
    )
    return "rests on " + "; ".join(parts) if parts else ""


def _real_caveat(rows: list[dict]) -> str:
    """The real engine's steps spread (another process took the device meanwhile)."""
    from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN

    uneven = []
    for r in rows:
        p90, median = number(r, "p90_step_ms"), number(r, "median_step_ms")
        if p90 and median and p90 > NOISY_P90_OVER_MEDIAN * median:
            uneven.append(f"{r['policy']} (p90 step {significant(p90 / median, 2)}x the median)")
        elif (number(r, "measured_over_sim") or 0) > UNEVEN_STEPS:
            wall = significant(number(r, "measured_over_sim"), 2)
            uneven.append(f"{r['policy']} (wall {wall}x its steps)")
    return f"rests on uneven steps: {', '.join(uneven)}" if uneven else ""


def said(value: float, *thresholds: float) -> str:
    """A ratio as its claim says it: figure()'s three digits, or six where those would put
    it on the other side of a threshold its verdict is judged at (9.996 read "10x" beside
    "partly" under "holds at 10x or more")."""
    text = figure(value)
    shown = float(text.replace(",", ""))
    if any((shown >= t) != (value >= t) for t in thresholds):
        return significant(value, 6)
    return text


def _p10_p90(s: dict, key: str) -> str:
    """'; x4.12-x9.2 across the steps' p10-p90' for a ratio's range, '' without one."""
    span = summary_span(s, key)
    return f"; {span} across the steps' p10-p90" if span else ""


def _prefill_claim(s: dict) -> Claim:
    ratio = s.get("prefill_over_decode_tflops")
    measured = "not measured"
    if ratio is not None:
        span = _p10_p90(s, "prefill_over_decode_tflops")
        shown = said(ratio, PREFILL_RULE.holds, PREFILL_RULE.partly)
        measured = f"{shown}x ({s['prefill_label']} over {s['decode_label']}{span})"
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
        span = _p10_p90(s, "decode_token_cost_ratio")
        least = max(BATCHING_MIN_HOLDS, BATCHING_FRACTION * b1 / b0)
        shown = said(ratio, least, BATCHING_MIN_PARTLY)
        measured = f"{shown}x cheaper (batch {b0:,} to {b1:,}{span})"
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
        t_span, lat_span = (
            summary_span(c, "throughput_ratio"),
            summary_span(c, "step_latency_ratio"),
        )
        spans = f"; {t_span} and {lat_span} across the steps' p10-p90" if t_span else ""
        t_said, lat_said = figure(t), figure(lat)
        shown_t, shown_lat = (float(x.replace(",", "")) for x in (t_said, lat_said))
        if latency_verdict(shown_t, shown_lat) != latency_verdict(t, lat):  # rounded across
            t_said, lat_said = significant(t, 6), significant(lat, 6)
        measured = (
            f"throughput x{t_said}, step time x{lat_said} "
            f"(batch {c['batch_from']:,} to {c['batch_to']:,}{spans})"
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
    speedup = number(cont, "speedup_vs_static")
    judged = speedup
    measured = "not measured"
    if static and cont and speedup is not None:
        n, slots = number(cont, "requests"), number(cont, "slots")
        sizes = f"; {n:,.0f} requests on {slots:,.0f} slots" if n and slots else ""
        measured = (
            f"occupancy {percent(number(static, 'occupancy'))} vs "
            f"{percent(number(cont, 'occupancy'))}, "
            f"{said(speedup, SPEEDUP_RULE.holds, SPEEDUP_RULE.partly)}x faster ({how}{sizes})"
        )
        # Both policies doing the same work (the same steps at the same occupancy: one
        # request, or every slot filled alike) differ in wall time by the device's speed
        # alone, not batching (the same 900 steps "1.45x faster" said partly): judged 1x.
        if same_work(static, cont) and speedup != 1:
            judged = 1.0
            measured += ("; both ran the same steps at the same occupancy, so the wall-time "
                         "difference is the device's speed: judged 1x")  # fmt: skip
    return Claim(
        key,
        "continuous batching fills the slots and finishes the same requests much sooner",
        "occupancy 20.3% vs 79.9%, 3.93x faster",
        measured,
        SPEEDUP_RULE.verdict(judged),
        SPEEDUP_RULE.text,
    )
