"""Static against continuous batching on one workload: simulated, and run on the model.

Static batching runs a group of `slots` requests until its longest one ends, so the slots of
the short ones sit idle (padded); continuous (iteration-level) batching refills a slot in
the step after it frees. Output lengths are long-tailed (lognormal), so static batching
leaves most slot-steps idle. The simulation counts steps; the real engine runs the same
scheduler's steps on the model and times them, so measured over simulated time says how
well "time is proportional to steps" holds on this machine. The engine's loop itself is
benchbatch/runtime/runs.py (run.py runs it through the recorder).

Everything here returns rows (dicts, the CSV's shape); nothing prints.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from benchbatch.core.fits import cache_len
from benchbatch.core.metrics import percentile, summarize
from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN, same_work
from benchbatch.core.simulate import SimResult, occupancy_rows, run_policies
from benchbatch.core.workload import Request, Workload
from benchbatch.experiments.occupancy.options import OccupancyOptions as Options

__all__ = ["Options", "simulate", "occupancy", "seed_spread", "summary", "engine_row"]

if TYPE_CHECKING:
    pass

POLICIES = ("static", "continuous")
SIM_TIME_BASIS = "simulated steps x this policy's median measured step"


# --- workload and simulation ----------------------------------------------------------------


# The simulation of both policies keeps about this much per request (columns, admission
# steps, per-request metrics, the run-length timeline): 2 GB for 10 million, measured.
BYTES_PER_REQUEST = 250


def check_memory(requests: int, option: str = "requests") -> int:
    """Refuse, before it runs, a simulation that needs more memory than is available;
    returns the bytes it needs."""
    from benchbatch.core import machine
    from benchbatch.errors import UserError

    need, free = requests * BYTES_PER_REQUEST, machine.available_ram_bytes()
    if need > free:
        raise UserError(
            option,
            f"simulating {requests:,} requests needs about {need / 2**30:,.1f} GiB, more than "
            f"the {free / 2**30:,.1f} GiB of available RAM",
        )
    return need


def simulate(requests: Sequence[Request] | Workload, slots: int) -> dict[str, SimResult]:
    """Both policies on the same requests (the article's rule: one decode per slot-step)."""
    return run_policies(requests, slots, POLICIES)


def title(requests: Sequence[Request] | Workload, slots: int) -> str:
    """The occupancy figure's title: the workload's output lengths and the slots."""
    outputs = np.sort(Workload.of(requests).output_tokens)
    return (
        f"{len(requests):,} requests (output tokens: median {outputs[len(outputs) // 2]:,}, "
        f"max {outputs[-1]:,}), {slots} slots: active slots per step"
    )


def occupancy(results: dict[str, SimResult], seed: int | None) -> list[dict]:
    """occupancy.csv's rows: one per policy (seed None for a trace)."""
    return [{"seed": seed, **row} for row in occupancy_rows(results)]


def seed_spread(rows: list[dict]) -> list[dict]:
    """Mean, min and max over seeds of steps, occupancy and speedup, one row per policy."""
    out = []
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        row: dict = {"policy": policy, "seeds": len(mine)}
        for key in ("total_steps", "occupancy", "speedup_vs_static"):
            values = [r[key] for r in mine]
            row |= {
                f"{key}_mean": statistics.fmean(values),
                f"{key}_min": min(values),
                f"{key}_max": max(values),
            }
        out.append(row)
    return out


def summary(rows: list[dict]) -> dict:
    """The article's claim from one seed's rows: occupancy of each policy and the speedup."""
    by = {r["policy"]: r for r in rows}
    return {
        "static_occupancy": by["static"]["occupancy"],
        "continuous_occupancy": by["continuous"]["occupancy"],
        "speedup": by["continuous"]["speedup_vs_static"],
        "static_steps": by["static"]["total_steps"],
        "continuous_steps": by["continuous"]["total_steps"],
    }


# --- the real engine --------------------------------------------------------------------------


def estimate(
    model, dtype: str, requests: Sequence[Request], slots: int, sims: dict[str, SimResult]
) -> dict:
    """A rough duration of the real run: every simulated step priced as one decode step of
    `slots` sequences at a typical context, plus one prefill per request and policy. Timing
    these two steps (through the shared harness) also warms the model up."""
    from benchbatch.core import accounting

    prompt = max(1, round(statistics.median(r.prompt_tokens for r in requests)))
    context = prompt + round(statistics.median(r.output_tokens for r in requests))
    context = min(context, model.cfg.max_context - 1)
    decode_s = _fastest(model, "decode", slots, context)
    prefill_s = _fastest(model, "prefill", 1, prompt)
    steps = sum(s.total_steps for s in sims.values())
    return {
        "decode_step_ms": decode_s * 1e3,
        "decode_context": context,
        "prefill_ms": prefill_s * 1e3,
        "prefill_tokens": prompt,
        "simulated_steps": steps,
        "estimated_s": steps * decode_s + len(sims) * len(requests) * prefill_s,
        "kv_cache_bytes": accounting.kv_cache_bytes(model.cfg, dtype, slots, cache_len(requests)),
    }


def _fastest(model, phase: str, batch: int, length: int) -> float:
    """Seconds of the fastest of a few repeats of one step (decode: `length` tokens cached)."""
    from benchbatch.runtime import steps
    from benchbatch.runtime.timing import TimingOptions

    step = steps.decode(batch, length) if phase == "decode" else steps.prefill(batch, length)
    quick = TimingOptions(min_repeats=3, min_time_s=0.0, warmup=1, warmup_s=0.0, l2_flush=False)
    return steps.time_step(model, step, quick, cuda_graphs=False).min_ms / 1e3


def engine_row(result, sim: SimResult, static_wall_s: float | None) -> dict:
    """engine.csv's row of one policy: wall time, throughput, latencies, occupancy, and the
    measured time over the simulation's steps priced at this run's median step."""
    median_step_s = statistics.median(s.step_s for s in result.steps)
    sim_s = sim.total_steps * median_step_s
    wall = result.wall_s
    m = result.metrics
    e2e = summarize([r.e2e for r in m.requests])
    ttft = summarize([r.ttft for r in m.requests])
    return {
        "policy": result.policy,
        "requests": result.requests,
        "slots": result.slots,
        "total_steps": result.total_steps,
        "sim_steps": sim.total_steps,
        "wall_s": wall,
        "generated_tokens": result.generated_tokens,
        "tokens_per_s": result.generated_tokens / wall,
        **{f"e2e_{k}_s": v for k, v in e2e.items()},
        **{f"ttft_{k}_s": v for k, v in ttft.items()},
        "occupancy": result.occupancy,
        "sim_occupancy": sim.occupancy,
        "median_step_ms": median_step_s * 1e3,
        "p90_step_ms": percentile([s.step_s for s in result.steps], 90) * 1e3,
        "sim_s": sim_s,
        "measured_over_sim": wall / sim_s,
        **({} if getattr(result, "compile_s", None) is None else {"compile_s": result.compile_s}),
        "sim_time_basis": SIM_TIME_BASIS,
        "model_s": result.model_s,
        "overhead": result.overhead,
        "speedup_vs_static": static_wall_s / wall if static_wall_s else None,
        "tokens_digest": tokens_digest(result),
    }


def tokens_digest(result) -> str:
    """A fingerprint of every generated token, request by request: two runs (one device and
    tensor-parallel, or two policies) that generated the same tokens have the same one."""
    import hashlib

    text = ";".join(f"{rid}:{','.join(map(str, result.tokens[rid]))}" for rid in
                    sorted(result.tokens))  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def noisy(rows: list[dict]) -> list[str]:
    """Policies whose step times spread too wide to trust measured over simulated time."""
    return [
        r["policy"] for r in rows if r["p90_step_ms"] > NOISY_P90_OVER_MEDIAN * r["median_step_ms"]
    ]


def engine_summary(rows: list[dict]) -> dict:
    """Measured speedup in wall time beside the runs' steps and the simulated steps."""
    by = {r["policy"]: r for r in rows}
    if set(by) != set(POLICIES):
        return {}
    # the simulations each run is set beside (with --stop-at-eos, of the lengths it made)
    return {
        "wall_speedup": by["static"]["wall_s"] / by["continuous"]["wall_s"],
        "sim_speedup": by["static"]["sim_steps"] / by["continuous"]["sim_steps"],
        "same_work": same_work(by["static"], by["continuous"]),
        "static_measured_over_sim": by["static"]["measured_over_sim"],
        "continuous_measured_over_sim": by["continuous"]["measured_over_sim"],
        "continuous_overhead": by["continuous"]["overhead"],
    }
