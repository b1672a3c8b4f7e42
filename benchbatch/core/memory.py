"""Memory, not compute, limits the batch: three policies on one KV budget (no torch).

Every running request holds its share of KV cache, so the memory left beside the weights
caps the batch. How much a request holds is what the policies differ in:

- static-reserve: static batching, each sequence reserving prompt + maximum output up front
  (a contiguous cache row per sequence); the group's memory is held until its longest ends;
- continuous-reserve: continuous batching with the same reservation, freed when a request ends;
- continuous-paged: continuous batching with vLLM's paged blocks: a sequence holds the blocks
  it has reached, so the same memory runs more of them; when the pool runs dry the most
  recently admitted one is preempted and later prefilled again.

Only memory limits the running sequences here: a reservation policy runs as many as the
budget reserves, the paged one as many as its blocks hold (each holds at least one). One
exception, the slot count's worth (a budget of --slots sequences of the longest prompt and
the maximum output): there the reserving policies also run at most --slots at once
(MemorySetup.reserve_slots), so they reproduce static and continuous batching step for step
even when prompts differ in length (a reservation sized by tokens would otherwise fit a
ninth short-prompt sequence in eight slots' worth); paging still runs as many as fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchbatch.core.kvblocks import PAGED, RESERVE, KVBudget, blocks_for
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import SimResult, StepCost, simulate
from benchbatch.core.workload import Request, Workload

# name -> (batching policy, KV policy)
MEMORY_POLICIES = {
    "static-reserve": ("static", RESERVE),
    "continuous-reserve": ("continuous", RESERVE),
    "continuous-paged": ("continuous", PAGED),
}
GIB = 2**30


@dataclass(frozen=True)
class MemorySetup:
    """The budget the policies share. bytes_per_token: one token's keys and values in every
    layer (None: no model, so sizes are in tokens); source: how the budget was chosen; slots:
    the reserving policies' capacity, against which slot occupancy is counted (paging can
    pass 100%: it runs more sequences than the memory has reserved slots); reserve_slots: a
    cap on the reserving policies' running sequences (the slot count's worth: --slots)."""

    blocks: int
    block_size: int
    reserve_output: int
    bytes_per_token: int | None = None
    source: str = ""
    slots: int = 0
    # The most sequences the reserving policies run at once besides what memory allows
    # (None: memory alone; the slot count's worth: --slots).
    reserve_slots: int | None = None

    def budget(self, kv_policy: str) -> KVBudget:
        return KVBudget(self.blocks, self.block_size, kv_policy, self.reserve_output)

    @property
    def block_bytes(self) -> int | None:
        return None if self.bytes_per_token is None else self.block_size * self.bytes_per_token

    @property
    def budget_bytes(self) -> int | None:
        return None if self.block_bytes is None else self.blocks * self.block_bytes


def slot_blocks(setup_block_size: int, longest_prompt: int, reserve_output: int) -> int:
    """Blocks of one slot's worth: the longest prompt and the maximum output."""
    return blocks_for(longest_prompt + reserve_output, setup_block_size)


def policy_slots(name: str, setup: MemorySetup, requests: int) -> int:
    """The scheduler's slots for a policy: memory is its limit (at most one sequence a
    block), and for the reserving policies also setup.reserve_slots when set."""
    slots = max(1, min(requests, setup.blocks))
    if MEMORY_POLICIES[name][1] == RESERVE and setup.reserve_slots is not None:
        slots = max(1, min(slots, setup.reserve_slots))
    return slots


def scheduler_for(name: str, setup: MemorySetup, requests: int, record_tokens: bool = True):
    """The policy's scheduler (its slots: policy_slots)."""
    policy, kv_policy = MEMORY_POLICIES[name]
    slots = policy_slots(name, setup, requests)
    return make_scheduler(policy, slots, record_tokens, kv=setup.budget(kv_policy))


def engine_settings(name: str, setup: MemorySetup, requests: int) -> tuple[str, int, dict]:
    """(policy, slots, settings) for the real engine: the same scheduler as simulated."""
    policy, kv_policy = MEMORY_POLICIES[name]
    return policy, policy_slots(name, setup, requests), {"kv": setup.budget(kv_policy)}


def run(
    requests: Sequence[Request] | Workload,
    setup: MemorySetup,
    step_cost: StepCost | None = None,
    policies: Sequence[str] = tuple(MEMORY_POLICIES),
) -> dict[str, SimResult]:
    """Every policy on the same requests and the same budget, step by step."""
    requests = requests.to_requests() if isinstance(requests, Workload) else list(requests)
    return {
        name: simulate(requests, scheduler_for(name, setup, len(requests)), step_cost)
        for name in policies
    }


def rows(results: dict[str, SimResult], setup: MemorySetup, prompt_tokens: int) -> list[dict]:
    """memory.csv: one row per policy. prompt_tokens: the requests' prompts in all (what
    prefill beyond them recomputed after preemptions)."""
    static = results.get("static-reserve")
    base = static.total_time if static is not None else None
    return [
        {
            **summary(name, r.timeline, r.total_time, setup, prompt_tokens),
            "requests": r.requests,
            "time_unit": "steps" if r.step_end_times is None else "s",
            "speedup_vs_static_reserve": base / r.total_time if base and r.total_time else None,
        }
        for name, r in results.items()
    ]


def summary(name: str, t, total_time: float, setup: MemorySetup, prompt_tokens: int) -> dict:
    """One policy's run from its per-step columns (a Timeline, or an engine's steps read as
    one): running sequences, memory reserved against used, preemptions."""
    steps = len(t.active_slots)
    reserved = sum(t.kv_blocks) * setup.block_size  # token-steps held in blocks
    used = sum(t.kv_tokens)  # token-steps written by running sequences
    peak = max(t.active_slots, default=0)
    useful = sum(t.active_slots)
    row = {
        "policy": name,
        "kv_policy": MEMORY_POLICIES[name][1],
        "block_size": setup.block_size,
        "kv_budget_blocks": setup.blocks,
        "total_steps": steps,
        "total_time": total_time,
        "mean_running": useful / steps if steps else 0.0,
        "peak_running": peak,
        "slot_occupancy": useful / (steps * setup.slots) if steps and setup.slots else None,
        "kv_reserved_mean_tokens": reserved / steps if steps else 0.0,
        "kv_used_mean_tokens": used / steps if steps else 0.0,
        "kv_reserved_peak_tokens": max(t.kv_blocks, default=0) * setup.block_size,
        "fragmentation": 1 - used / reserved if reserved else 0.0,
        "preemptions": sum(t.preempted),
        "recomputed_tokens": sum(t.prefill_tokens) - prompt_tokens,
    }
    if setup.bytes_per_token is not None:
        for key in ("kv_reserved_mean", "kv_used_mean", "kv_reserved_peak"):
            row[f"{key}_gib"] = row[f"{key}_tokens"] * setup.bytes_per_token / GIB
        row["kv_budget_gib"] = setup.budget_bytes / GIB
    return row


def timeline_rows(results: dict[str, SimResult], setup: MemorySetup) -> list[dict]:
    """memory_timeline.csv: per policy and step, running sequences, blocks held, tokens used
    and preemptions (the figure's data)."""
    out = []
    for name, r in results.items():
        t = r.timeline
        for step, (running, blocks, used, out_now) in enumerate(
            zip(t.active_slots, t.kv_blocks, t.kv_tokens, t.preempted, strict=True)
        ):
            out.append(
                {
                    "policy": name,
                    "step": step,
                    "running": running,
                    "kv_reserved_tokens": blocks * setup.block_size,
                    "kv_used_tokens": used,
                    "preempted": out_now,
                }
            )
    return out
