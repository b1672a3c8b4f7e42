"""The Sarathi-Serve ablation: mixed batching and chunked prefill, alone and together.

A long prompt prefilled whole in one step freezes every running decode for that step (a
generation stall): time between tokens (TBT) spikes. Chunking the prompt bounds the step,
and letting the chunks ride in the decodes' steps (mixed batching, decodes first) keeps
prompts moving too. The paper's ablation (Yi-34B) has the three schemes' P50 TTFT and P99
TBT; here they run on one workload in simulation, with a step-cost model fitted to this
device's measured steps, and on the real model.

Arrivals are counted in scheduler steps (a request arriving at step k is first seen by the
plan of step k), as in the occupancy command, so every scheme sees the same arrival order.

Everything here returns rows (dicts, the CSV's shape) or plain results; nothing prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from benchbatch.core.metrics import RunMetrics, StepClock, percentile
from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN
from benchbatch.core.scheduler import Scheduler, make_scheduler
from benchbatch.core.scheduler_config import SchedulerConfig
from benchbatch.core.simulate import SimResult, simulate
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.workload import Request
from benchbatch.errors import UserError
from benchbatch.experiments.ablation.options import SCHEMES
from benchbatch.experiments.ablation.options import AblationOptions as Options
from benchbatch.experiments.fields import SLO

if TYPE_CHECKING:
    from benchbatch.runtime.records import EngineResult

__all__ = ["Options", "SCHEMES", "SLO", "Budgets", "simulate_all", "summary_row"]
LABELS = {
    "mixed-only": "mixed batching, no chunks",
    "chunks-only": "chunks, no mixed batching",
    "both": "both (Sarathi-Serve)",
}
# The paper's ablation on Yi-34B: (P50 TTFT s, P99 TBT s).
PAPER = {"mixed-only": (0.53, 0.68), "chunks-only": (1.04, 0.17), "both": (0.76, 0.14)}
SLO_PERCENTILE = 99  # the SLO search holds P99 TTFT (over requests) and P99 TBT (all gaps)


@dataclass(frozen=True)
class Budgets:
    """The scheduler's knobs (vLLM's names). max_num_seqs is also the number of KV slots."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunk_size: int


def scheme_settings(scheme: str, b: Budgets) -> dict:
    """make_scheduler settings of a scheme. Mixed batching without chunks has no token budget
    (ORCA-style: a whole prompt rides with the decodes, however long), as in the paper."""
    if scheme == "mixed-only":
        return {"max_num_seqs": b.max_num_seqs, "mixed": True, "chunked_prefill": False}
    return {
        "max_num_seqs": b.max_num_seqs,
        "max_num_batched_tokens": b.max_num_batched_tokens,
        "chunked_prefill": True,
        "chunk_size": b.chunk_size,
        "mixed": scheme == "both",
    }


def make(scheme: str, b: Budgets, record_tokens: bool = True) -> Scheduler:
    return make_scheduler("continuous", b.max_num_seqs, record_tokens, **scheme_settings(scheme, b))


def check_budgets(schemes: Sequence[str], b: Budgets, chunk_given: bool) -> None:
    """A UserError naming the option for any setting a scheme would refuse."""
    if b.max_num_seqs < 1:
        raise UserError("slots", f"must be at least 1, got {b.max_num_seqs}")
    # The budget is checked even when only mixed-only runs (which ignores it): never silently.
    SchedulerConfig(
        b.max_num_seqs, max_num_seqs=b.max_num_seqs, max_num_batched_tokens=b.max_num_batched_tokens
    )
    chunked = [s for s in schemes if s != "mixed-only"]
    if chunk_given and not chunked:
        raise UserError(
            "chunk_size", "only applies with chunked prefill (schemes chunks-only and both)"
        )
    for s in chunked:
        SchedulerConfig(b.max_num_seqs, **scheme_settings(s, b))


# Every scheme's and every SLO grid point's steps are simulated one by one (25 to 45 us a
# step on a 2-core CPU): past this the ablation would run for many minutes.
MAX_SIM_STEPS = 5_000_000
# Every gap between two tokens is kept per scheme and source (a tbt.csv row, the request's
# metrics and token steps): about 1.5 KB each in memory, measured.
BYTES_PER_GAP = 1500


def check_work(
    requests: Sequence[Request], schemes: Sequence[str], b: Budgets, slo, real: bool
) -> dict:
    """Refuse, before anything runs, a workload whose simulation needs more steps than
    MAX_SIM_STEPS or more memory than the machine has; returns the estimate (lower bounds:
    a step serves at most max_num_seqs decodes, and idles until the last arrival)."""
    from benchbatch.core import machine
    from benchbatch.core.workload import Workload

    w = Workload.of(requests)
    tokens, last = int(w.output_tokens.sum()), int(w.arrival_step.max())
    points = [b] * len(schemes) + (slo_grid(b) if slo is not None else [])
    steps = sum(max(last + 1, -(-tokens // p.max_num_seqs)) for p in points)
    if steps > MAX_SIM_STEPS:
        raise UserError(
            "requests",
            f"the ablation would simulate at least {steps:,} steps ({len(points)} runs of "
            f"{len(w):,} requests, {tokens:,} output tokens, the last arriving at step "
            f"{last:,}), more than the {MAX_SIM_STEPS:,} it allows: serve fewer or shorter "
            "requests, or let them arrive sooner",
        )
    gaps = (tokens - len(w)) * len(schemes) * (2 if real else 1)
    need, free = gaps * BYTES_PER_GAP, machine.available_ram_bytes()
    if need > free:
        raise UserError(
            "requests",
            f"the ablation would keep {gaps:,} gaps between tokens, about "
            f"{need / 2**30:,.1f} GiB, more than the {free / 2**30:,.1f} GiB of available RAM: "
            "serve fewer or shorter requests",
        )
    return {"simulated_steps_at_least": steps, "token_gaps": gaps, "memory_bytes": need}


# --- running the schemes --------------------------------------------------------------------------


@dataclass
class SchemeRun:
    """One scheme on the workload: per-request metrics, the steps at which each request got
    each token, and the step end times (simulated or measured)."""

    scheme: str
    source: str  # "sim" or "real"
    metrics: RunMetrics
    token_steps: dict[int, list[int]]
    step_end_times: list[float]
    step_tokens: list[tuple[int, int]]  # (decode, prefill) tokens of each step

    @property
    def total_s(self) -> float:
        return self.step_end_times[-1] if self.step_end_times else 0.0

    @property
    def steps(self) -> int:
        return len(self.step_end_times)


def simulate_scheme(
    requests: Sequence[Request], scheme: str, b: Budgets, cost: StepCostModel
) -> SchemeRun:
    sched = make(scheme, b)
    result: SimResult = simulate(requests, sched, cost)
    t = result.timeline
    return SchemeRun(
        scheme,
        "sim",
        result.metrics,
        sched.recorder.token_steps,
        result.step_end_times,
        list(zip(t.decode_tokens, t.prefill_tokens, strict=True)),
    )


def real_scheme(result: EngineResult, sim: SchemeRun) -> SchemeRun:
    """The real run of a scheme: it took exactly the simulated steps (same scheduler, same
    requests), so the tokens' steps are the simulation's and only the times are measured."""
    assert result.total_steps == sim.steps, "the engine did not take the simulated steps"
    return SchemeRun(
        sim.scheme,
        "real",
        result.metrics,
        sim.token_steps,
        result.step_end_times(),
        [(s.decode_tokens, s.prefill_tokens) for s in result.steps],
    )


def simulate_all(
    requests: Sequence[Request], schemes: Sequence[str], b: Budgets, cost: StepCostModel
) -> dict[str, SchemeRun]:
    return {s: simulate_scheme(requests, s, b, cost) for s in schemes}


# --- rows -----------------------------------------------------------------------------------------


def summary_row(run: SchemeRun, b: Budgets, slo: SLO | None = None) -> dict:
    """ablation.csv's row of one scheme and source."""
    s = run.metrics.summary()
    tokens = sum(m.num_tokens for m in run.metrics.requests)
    settings = scheme_settings(run.scheme, b)
    row = {
        "scheme": run.scheme,
        "label": LABELS[run.scheme],
        "source": run.source,
        "max_num_seqs": b.max_num_seqs,
        "max_num_batched_tokens": settings.get("max_num_batched_tokens"),
        "chunk_size": settings.get("chunk_size"),
        "requests": len(run.metrics.requests),
        "steps": run.steps,
        "total_s": run.total_s,
        "tokens_per_s": tokens / run.total_s if run.total_s else math.nan,
        "ttft_p50_s": s["ttft_p50"],
        "ttft_p99_s": s["ttft_p99"],
        "ttft_mean_s": s["ttft_mean"],
        "tbt_p50_s": s["tbt_p50"],
        "tbt_p99_s": s["tbt_p99"],
        "tbt_max_s": s["tbt_max"],
        "e2e_p50_s": s["e2e_p50"],
        "e2e_p99_s": s["e2e_p99"],
        "paper_ttft_p50_s": PAPER[run.scheme][0],
        "paper_tbt_p99_s": PAPER[run.scheme][1],
    }
    if slo is not None:
        met = sum(slo.met(m) for m in run.metrics.requests)
        row |= {"slo_met": met, "goodput_rps": met / run.total_s if run.total_s else math.nan}
    return row


def real_columns(row: dict, sim_row: dict, result: EngineResult) -> dict:
    """The real row's comparison with the simulation of the same scheme."""
    return {
        **row,
        "sim_total_s": sim_row["total_s"],
        "real_over_sim": ratio(row["total_s"], sim_row["total_s"]),
        "ttft_p50_real_over_sim": ratio(row["ttft_p50_s"], sim_row["ttft_p50_s"]),
        "tbt_p99_real_over_sim": ratio(row["tbt_p99_s"], sim_row["tbt_p99_s"]),
        "model_s": result.model_s,
        "overhead": result.overhead,
    }


def request_rows(run: SchemeRun, requests: Sequence[Request], slo: SLO | None) -> list[dict]:
    """requests.csv: every request's latencies under one scheme and source."""
    by_id = {r.id: r for r in requests}
    rows = []
    for m in run.metrics.requests:
        r = by_id[m.request_id]
        row = {
            "scheme": run.scheme,
            "source": run.source,
            "request_id": m.request_id,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "arrival_step": r.arrival_step,
            "arrival_s": m.arrival,
            "ttft_s": m.ttft,
            "tbt_p50_s": m.tbt_p50,
            "tbt_p99_s": m.tbt_p99,
            "tbt_max_s": m.tbt_max,
            "e2e_s": m.e2e,
        }
        if slo is not None:
            row["slo_met"] = slo.met(m)
        rows.append(row)
    return rows


def gap_rows(run: SchemeRun) -> list[dict]:
    """tbt.csv: every gap between two tokens of a request, at the time the later came."""
    clock = StepClock(run.step_end_times)
    rows = []
    for rid, steps in run.token_steps.items():
        times = [clock.end(s) for s in steps]
        for k in range(1, len(times)):
            rows.append(
                {
                    "scheme": run.scheme,
                    "source": run.source,
                    "request_id": rid,
                    "token": k,
                    "time_s": times[k],
                    "tbt_s": times[k] - times[k - 1],
                }
            )
    rows.sort(key=lambda r: r["time_s"])
    return rows


def step_costs(sim: SchemeRun) -> list[float]:
    """The cost model's price of each simulated step, in seconds."""
    ends = sim.step_end_times
    return [end - start for start, end in zip([0.0, *ends[:-1]], ends, strict=True)]


def noisy(steps: Sequence[dict]) -> list[str]:
    """Schemes whose real steps, each over the cost model's price of the same step, spread
    wide (p90 over twice the median): another process likely took the device meanwhile.
    A step the cost model prices at 0 (every cost hidden by timing noise) has no ratio."""
    out = []
    for scheme in SCHEMES:
        mine = [r for r in steps if r["scheme"] == scheme and r["sim_step_ms"] > 0]
        ratios = [r["step_ms"] / r["sim_step_ms"] for r in mine]
        if ratios and percentile(ratios, 90) > NOISY_P90_OVER_MEDIAN * percentile(ratios, 50):
            out.append(scheme)
    return out


def ratio(a: float, b: float) -> float:
    """a / b, NaN where b is 0 or either is not a number (every request one token long:
    no gap between tokens, so no stall to shrink)."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return math.nan
    return a / b


# --- SLO search -----------------------------------------------------------------------------------


def slo_grid(b: Budgets) -> list[Budgets]:
    """max_num_seqs and token budgets in powers of two around the given ones (the given pair
    included), a budget never below max_num_seqs. As in vLLM, a prefill chunk is whatever the
    budget leaves (chunk size = budget), so the budget alone trades TBT against TTFT."""
    seqs = sorted(
        {2**k for k in range(7) if 2**k <= max(32, 2 * b.max_num_seqs)} | {b.max_num_seqs}
    )
    top = max(2048, 2 * b.max_num_batched_tokens)
    budgets = sorted({2**k for k in range(5, 16) if 2**k <= top} | {b.max_num_batched_tokens})
    return [Budgets(s, t, t) for s in seqs for t in budgets if t >= s]


def slo_search(
    requests: Sequence[Request], b: Budgets, cost: StepCostModel, slo: SLO, scheme: str = "both"
) -> list[dict]:
    """slo.csv: every grid point simulated with the fitted cost model: P99 TTFT over requests
    and P99 TBT over all gaps against the limits, and goodput (requests meeting both)."""
    rows = []
    for point in slo_grid(b):
        run = simulate_scheme(requests, scheme, point, cost)
        row = summary_row(run, point, slo)
        row["meets_slo"] = row["ttft_p99_s"] <= slo.ttft_s and row["tbt_p99_s"] <= slo.tbt_s
        rows.append(row)
    return rows


def slo_best(rows: Sequence[dict]) -> dict:
    """From the search: the largest max_num_seqs that meets the SLOs (with its largest budget
    meeting them), the largest budget that meets them, and the best goodput."""
    ok = [r for r in rows if r["meets_slo"]]
    if not ok:
        return {"met": False}

    def pick(r: dict) -> dict:
        keys = ("max_num_seqs", "max_num_batched_tokens", "chunk_size", "goodput_rps")
        return {k: r[k] for k in (*keys, "ttft_p99_s", "tbt_p99_s", "tokens_per_s")}

    by_seqs = max(ok, key=lambda r: (r["max_num_seqs"], r["max_num_batched_tokens"]))
    by_budget = max(ok, key=lambda r: (r["max_num_batched_tokens"], r["max_num_seqs"]))
    best = max(ok, key=lambda r: (r["goodput_rps"], r["tokens_per_s"]))
    return {
        "met": True,
        "largest_seqs": pick(by_seqs),
        "largest_budget": pick(by_budget),
        "best_goodput": pick(best),
    }
