"""The memory policies of `occupancy`: one KV budget, reserved against paged, simulated and
on the model. Rows only (memory.csv, memory_timeline.csv, memory_engine.csv); nothing prints.

The budget: --kv-memory GiB in blocks of --block-size tokens (a token's KV bytes from the
model's shape and dtype); by default in simulation the slot count's worth (--slots sequences
of the longest prompt and the maximum output, what the reserving policies need to run
--slots at once; they then run at most --slots at once, so they reproduce static and
continuous batching step for step, whatever the prompts' lengths), and with the real engine
what the device has free beside the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchbatch.core import accounting, memory
from benchbatch.core.memory import MEMORY_POLICIES, MemorySetup
from benchbatch.core.simulate import SimResult, StepCost
from benchbatch.core.timeline import Timeline
from benchbatch.core.workload import Request, Workload
from benchbatch.experiments.occupancy.options import check_kv_budget
from benchbatch.runtime.runs import EngineRun

GIB = memory.GIB
SLOTS_WORTH = "the slot count's worth"


def reserve_output(requests: Sequence[Request] | Workload, max_output: int, trace) -> int:
    """The output each sequence reserves: --max-output (the serving cap), or a trace's
    longest output (a trace replaces --max-output)."""
    if trace is None:
        return max_output
    return int(Workload.of(requests).output_tokens.max())


def setup(
    requests: Sequence[Request] | Workload,
    slots: int,
    block_size: int,
    reserve: int,
    bytes_per_token: int,
    kv_bytes: int | None,
    source: str,
) -> MemorySetup:
    """The shared budget: kv_bytes in whole blocks, or (None) the slot count's worth. A
    UserError (--kv-memory) if it cannot hold one request's prompt and reservation."""
    longest = int(Workload.of(requests).prompt_tokens.max())  # columns: no Request objects
    if kv_bytes is None:
        blocks = slots * memory.slot_blocks(block_size, longest, reserve)
        source = f"{SLOTS_WORTH} ({slots} x ({longest:,} + {reserve:,}) tokens)"
    else:
        blocks = kv_bytes // (block_size * bytes_per_token)
    gib = blocks * block_size * bytes_per_token / GIB if kv_bytes is None else kv_bytes / GIB
    check_kv_budget(gib, blocks, block_size, longest, reserve)
    slots_held = blocks // memory.slot_blocks(block_size, longest, reserve)
    # The slot count's worth runs --slots reservations at once, never more: sized by tokens,
    # short prompts' reservations would otherwise fit more sequences than slots.
    cap = slots if kv_bytes is None else None
    return MemorySetup(blocks, block_size, reserve, bytes_per_token, source, slots_held, cap)


def bytes_per_token(cfg, dtype: str, tp: int = 1) -> int:
    """One token's KV in every layer (with tp, one rank's share of the KV heads)."""
    return accounting.kv_bytes_per_token(cfg, dtype, tp)


def simulate(
    requests: Sequence[Request] | Workload, s: MemorySetup, step_cost: StepCost | None = None
) -> dict[str, SimResult]:
    return memory.run(requests, s, step_cost)


def prompt_total(requests: Sequence[Request] | Workload) -> int:
    return int(Workload.of(requests).prompt_tokens.sum())


def rows(results: dict[str, SimResult], s: MemorySetup, requests) -> list[dict]:
    """memory.csv: one row per policy."""
    return memory.rows(results, s, prompt_total(requests))


def timeline(results: dict[str, SimResult], s: MemorySetup) -> list[dict]:
    return memory.timeline_rows(results, s)


def claim(rows: list[dict]) -> dict:
    """What the budget shows: the sequences each policy ran at once, side by side."""
    by = {r["policy"]: r for r in rows}
    paged, reserved = by["continuous-paged"], by["continuous-reserve"]
    return {
        "reserve_peak_running": reserved["peak_running"],
        "paged_peak_running": paged["peak_running"],
        "reserve_mean_running": reserved["mean_running"],
        "paged_mean_running": paged["mean_running"],
        "paged_over_reserve_mean_running": paged["mean_running"] / reserved["mean_running"],
        "reserve_fragmentation": reserved["fragmentation"],
        "paged_fragmentation": paged["fragmentation"],
        "preemptions": paged["preemptions"],
    }


# --- on the model ------------------------------------------------------------------------


def engine_runs(s: MemorySetup, requests: int, sims: dict[str, SimResult]) -> list[EngineRun]:
    """The memory policies on the real engine: the simulated schedulers, each in a paged
    cache of exactly the budget (the scheduler's blocks are the cache's)."""
    runs = []
    for name in MEMORY_POLICIES:
        policy, slots, settings = memory.engine_settings(name, s, requests)
        settings = {**settings, "kv_layout": "paged"}
        runs.append(EngineRun(name, slots, policy, settings, sims[name].total_steps,
                              key="memory_policy"))  # fmt: skip
    return runs


def engine_row(name: str, result, s: MemorySetup, requests) -> dict:
    """memory_engine.csv's row: the simulated columns from the run's own steps, and time."""
    steps = result.steps
    t = Timeline(
        [r.active for r in steps],
        [r.decode_tokens for r in steps],
        [r.prefill_tokens for r in steps],
        [r.kv_blocks for r in steps],
        [r.kv_tokens for r in steps],
        [r.preempted for r in steps],
    )
    wall = result.wall_s
    return {
        **memory.summary(name, t, wall, s, prompt_total(requests)),
        "time_unit": "s",
        "wall_s": wall,
        "tokens_per_s": result.generated_tokens / wall if wall else None,
        "kv_cache_gib": (s.blocks + 1) * s.block_bytes / GIB,  # the pool and its scratch block
    }
