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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from benchbatch.engines.metrics import RunMetrics, StepClock, percentile
from benchbatch.engines.scheduler import Scheduler, SchedulerConfig, make_scheduler
from benchbatch.engines.simulate import SimResult, StepCostModel, fit_step_cost, simulate
from benchbatch.engines.workload import Request
from benchbatch.errors import UserError
from benchbatch.experiments import SCHEMES, SLO
from benchbatch.experiments import AblationOptions as Options
from benchbatch.noise import NOISY_P90_OVER_MEDIAN
from benchbatch.probes.piggyback import MixedStep, time_mixed
from benchbatch.timing import TimingOptions

if TYPE_CHECKING:
    from benchbatch.engines.engine import EngineResult

__all__ = ["Options", "SCHEMES", "SLO", "Budgets", "fit", "simulate_all", "summary_row"]
LABELS = {
    "mixed-only": "mixed batching, no chunks",
    "chunks-only": "chunks, no mixed batching",
    "both": "both (Sarathi-Serve)",
}
# The paper's ablation on Yi-34B: (P50 TTFT s, P99 TBT s).
PAPER = {"mixed-only": (0.53, 0.68), "chunks-only": (1.04, 0.17), "both": (0.76, 0.14)}
SLO_PERCENTILE = 99  # the SLO search holds P99 TTFT (over requests) and P99 TBT (all gaps)
STEP_COSTS_OPTION = "--step-costs"
OUTLIER = 0.5  # a step measured over 1.5x the fitted cost is treated as noise and refitted


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
    from benchbatch import machine
    from benchbatch.engines.workload import Workload

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


# --- the step-cost model ------------------------------------------------------------------------


def fit_points(b: Budgets, requests: Sequence[Request], max_context: int) -> list[MixedStep]:
    """Steps to time for the fit, at the workload's operating points: decode batches, the
    prompts and chunks alone, a chunk late in a long prompt (KV re-read), and the mixed
    steps each scheme runs (decodes + a chunk, decodes + a whole long prompt)."""
    seqs, chunk, budget = b.max_num_seqs, b.chunk_size, b.max_num_batched_tokens
    prompts = sorted(r.prompt_tokens for r in requests)
    outputs = sorted(r.output_tokens for r in requests)
    short, longest = prompts[len(prompts) // 2], prompts[-1]
    ctx = min(short + outputs[len(outputs) // 2], max_context - 1)
    ctx_long = min(longest + outputs[len(outputs) // 2], max_context - 1)
    late = max(0, min(longest, max_context) - chunk)
    points = [
        *(MixedStep(n, ctx) for n in sorted({1, max(1, seqs // 2), seqs})),
        MixedStep(seqs, ctx_long),
        *(MixedStep(0, 0, p) for p in sorted({short, chunk, budget, longest})),
        MixedStep(0, 0, chunk, late),
        MixedStep(seqs, ctx, chunk),
        MixedStep(seqs, ctx, max(1, budget - seqs)),
        MixedStep(max(1, seqs - 1), ctx, short),
        MixedStep(max(1, seqs - 1), ctx, longest),
    ]
    fits = [p for p in points if p.prefill_start + p.prefill_tokens <= max_context]
    return list(dict.fromkeys(fits))


def cost_rows(model, points: Sequence[MixedStep], opts: TimingOptions) -> Iterator[dict]:
    """step_cost.csv's rows: every fit point timed through the shared harness, yielded as
    it is measured; eagerly, since the fit predicts the real engine, which runs eagerly."""
    for p in points:
        m = time_mixed(model, p, opts, cuda_graphs=False)  # the fit predicts the eager engine
        d, n, c = p.features
        yield (
            {
                "source": "measured",
                "label": p.label,
                "kind": p.kind,
                "decode_tokens": d,
                "prefill_tokens": n,
                "context_tokens": c,
                "step_ms": m.median_ms,
                "step_ms_min": m.min_ms,
                "cv": m.cv,
                "repeats": m.repeats,
                "noisy": m.noisy,
            }
        )


def cost_rows_from_csv(paths: Iterable[Path]) -> list[dict]:
    """Step times from earlier runs: a phases or sweep CSV (phase, batch, tokens, context,
    step_ms), a piggyback.csv (decode_batch, context, prefill_tokens, step_ms) or an
    ablation's step_cost.csv (decode_tokens, prefill_tokens, context_tokens, step_ms)."""
    rows = []
    for path in paths:
        rows += [{"source": str(path), **r} for r in _csv_cost_rows(Path(path))]
    return rows


def _csv_cost_rows(path: Path) -> list[dict]:
    df = _read_costs_csv(path)
    if "status" in df:
        df = df[df["status"] == "ok"]  # the index keeps each row's place, for errors
    cols = set(df.columns)
    if {"decode_tokens", "prefill_tokens", "context_tokens", "step_ms"} <= cols:
        _check_numbers(path, df, ("decode_tokens", "prefill_tokens", "context_tokens"))
        d, p, c = df["decode_tokens"], df["prefill_tokens"], df["context_tokens"]
    elif {"decode_batch", "context", "prefill_tokens", "step_ms"} <= cols:
        _check_numbers(path, df, ("decode_batch", "context", "prefill_tokens"))
        d, p, c = df["decode_batch"], df["prefill_tokens"], df["decode_batch"] * df["context"]
    elif {"phase", "batch", "tokens", "context", "step_ms"} <= cols:
        _check_numbers(path, df, ("batch", "tokens", "context"))
        decode = df["phase"] == "decode"
        d = df["batch"].where(decode, 0)
        p = (df["batch"] * df["tokens"]).where(~decode, 0)
        c = df["batch"] * df["context"]
    else:
        raise UserError(
            STEP_COSTS_OPTION,
            f"{path} has no step times this reads (phases, sweep, piggyback or step_cost CSV)",
        )
    _check_numbers(path, df, ("step_ms",), STEP_MS_RANGE, missing_ok=True)
    out = pd.DataFrame({"decode_tokens": d, "prefill_tokens": p, "context_tokens": c})
    out["step_ms"] = df["step_ms"]
    out["kind"] = "file"
    out = out.dropna()
    if not len(out):
        raise UserError(STEP_COSTS_OPTION, f"{path} holds no measured step")
    return out.to_dict("records")


# A step time in ms no device and no model gives: faster than 100 ns, slower than an hour.
STEP_MS_RANGE = (1e-4, 3.6e6)
TOKENS_RANGE = (0, 1e9)  # tokens, batches and contexts of one step


def _read_costs_csv(path: Path) -> pd.DataFrame:
    import io

    from benchbatch.inputs import read_bytes, reason

    data = read_bytes(path, STEP_COSTS_OPTION).removeprefix(b"\xef\xbb\xbf")
    try:
        return pd.read_csv(io.BytesIO(data), index_col=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:
        raise UserError(STEP_COSTS_OPTION, f"cannot read {path}: {reason(e)}") from None


def _check_numbers(path, df, columns, bounds=TOKENS_RANGE, missing_ok: bool = False) -> None:
    """Each column numbers within bounds (an empty cell only where missing_ok: a step that
    was not measured); else a UserError naming the file, line and column."""
    lo, hi = bounds
    for col in columns:
        numbers = pd.to_numeric(df[col], errors="coerce")
        bad = ~numbers.between(lo, hi)
        if missing_ok:
            bad &= df[col].notna()
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(
                STEP_COSTS_OPTION,
                f"{path} row {df.index[i] + 1}: {col} {str(df[col].iloc[i])[:40]!r} is not a "
                f"number in [{lo:g}, {hi:g}]",
            )
        df[col] = numbers


def fit(rows: list[dict], option: str = STEP_COSTS_OPTION) -> tuple[StepCostModel, list[dict]]:
    """The linear step-cost model, least squares on relative error (each step counts alike,
    so the short decode steps that make up TBT are fitted as well as the long prefills).
    A per-token cost never comes out negative: a feature whose coefficient would (noise, or
    samples that cannot separate it, e.g. one context only) is left out and the rest refitted.
    When timing noise hides every per-token cost the model is flat (cost_summary says which
    costs were left unmeasured); samples too few to determine one are refused. Returns the
    model and the rows with its prediction beside each measurement."""
    model = _fit_nonnegative(rows, option)
    # A busy device only ever slows a step down: a measurement far above the first fit is
    # noise (another process had the cores), so it is left out of a second fit.
    used = [predict(model, r) * 1e3 * (1 + OUTLIER) >= r["step_ms"] for r in rows]
    if not all(used):
        kept = [r for r, u in zip(rows, used, strict=True) if u]
        try:
            model = _fit_nonnegative(kept, option)
        except UserError:
            used = [True] * len(rows)
    fitted = []
    for r, u in zip(rows, used, strict=True):
        ms = 1e3 * predict(model, r)
        fitted.append({**r, "fitted_ms": ms, "error": ms / r["step_ms"] - 1, "used": u})
    return model, fitted


def _fit_nonnegative(rows: list[dict], option: str) -> StepCostModel:
    """Least squares, leaving out a feature whose cost comes out negative (noise: down to a
    flat model if need be) or that the samples cannot separate (the context, first), and
    fitting through the origin when the base cost comes out negative; samples that
    determine nothing even then are refused."""
    samples = [
        (r["decode_tokens"], r["prefill_tokens"], r["context_tokens"], r["step_ms"] / 1e3)
        for r in rows
    ]
    weights = [1 / s[3] ** 2 for s in samples]
    left_out: set[int] = set()  # 0 decode, 1 prefill, 2 context
    through_origin = False  # a negative base (noise) would price small steps below zero
    while True:
        kept = [(*(0 if j in left_out else s[j] for j in range(3)), s[3]) for s in samples]
        intercept = not through_origin or len(left_out) == 3  # a flat model keeps its base
        try:
            model = fit_step_cost(kept, weights, intercept)
        except ValueError:
            if 2 in left_out:
                raise UserError(
                    option,
                    "the step times do not determine a cost model: they need decode steps of "
                    "two batch sizes or more and, for prefills, two prompt lengths or more",
                ) from None
            left_out.add(2)
            continue
        if model.base_s < 0 and not through_origin:
            through_origin = True
            continue
        bad = [j for j in (2, 0, 1) if j not in left_out and _per_token(model)[j] < 0]
        if not bad:
            return model
        left_out.add(bad[0])


def unmeasured(model: StepCostModel, rows: list[dict]) -> list[str]:
    """Per-token costs the samples held but the fit left at 0: decode or prefill tokens that
    did not make any step measurably slower (timing noise larger than their cost)."""
    names = ("decode_tokens", "prefill_tokens")
    return [
        name
        for name, coef in zip(names, _per_token(model)[:2], strict=False)
        if coef == 0 and any(r[name] for r in rows)
    ]


def _per_token(model: StepCostModel) -> tuple[float, float, float]:
    return model.per_decode_token_s, model.per_prefill_token_s, model.per_context_token_s


def predict(model: StepCostModel, row: dict) -> float:
    return (
        model.base_s
        + model.per_decode_token_s * row["decode_tokens"]
        + model.per_prefill_token_s * row["prefill_tokens"]
        + model.per_context_token_s * row["context_tokens"]
    )


def cost_summary(model: StepCostModel, fitted: list[dict]) -> dict:
    """step_cost.json: the coefficients, and how well they fit (median and largest |error|)."""
    errors = [abs(r["error"]) for r in fitted if r["used"]]
    return {
        "per_token_costs_unmeasured": unmeasured(model, fitted),
        "base_ms": model.base_s * 1e3,
        "per_decode_token_ms": model.per_decode_token_s * 1e3,
        "per_prefill_token_ms": model.per_prefill_token_s * 1e3,
        "per_context_token_us": model.per_context_token_s * 1e6,
        "samples": sum(r["used"] for r in fitted),
        "left_out_as_noise": sum(not r["used"] for r in fitted),
        "median_abs_error": percentile(errors, 50),
        "max_abs_error": max(errors),
        "fit": "least squares on relative error",
    }


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
    wide (p90 over twice the median): another process likely took the device meanwhile."""
    out = []
    for scheme in SCHEMES:
        ratios = [r["step_ms"] / r["sim_step_ms"] for r in steps if r["scheme"] == scheme]
        if ratios and percentile(ratios, 90) > NOISY_P90_OVER_MEDIAN * percentile(ratios, 50):
            out.append(scheme)
    return out


# --- the paper's ordering -------------------------------------------------------------------------


def ordering(rows: Sequence[dict], source: str) -> dict | None:
    """Whether a source's rows order as the paper's table: P99 TBT both < chunks-only <
    mixed-only, and P50 TTFT mixed-only < both < chunks-only. None without all three."""
    by = {r["scheme"]: r for r in rows if r["source"] == source}
    if set(by) != set(SCHEMES):
        return None
    m, c, b = by["mixed-only"], by["chunks-only"], by["both"]
    tbt = b["tbt_p99_s"] < c["tbt_p99_s"] < m["tbt_p99_s"]
    ttft = m["ttft_p50_s"] < b["ttft_p50_s"] < c["ttft_p50_s"]
    return {
        "tbt_p99_order": tbt,
        "ttft_p50_order": ttft,
        "as_paper": tbt and ttft,
        "stall_shrink": ratio(m["tbt_max_s"], b["tbt_max_s"]),
    }


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
