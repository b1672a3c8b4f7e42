"""The occupancy experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.kvblocks import blocks_for
from benchbatch.core.optkit import (
    BATCHING,
    KV,
    MOST_GIB,
    WORKLOAD,
    check_count,
    check_number,
    opt,
    require,
)
from benchbatch.core.units import significant
from benchbatch.errors import UserError
from benchbatch.experiments.fields import (
    block_size_field,
    check_block_size,
    engine_field,
    kv_layout_field,
    step_costs_field,
)


@dataclass(frozen=True)
class OccupancyOptions:
    seeds: int = opt(
        1,
        "Simulate this many seeds (--seed, --seed + 1, ...) and report the spread.",
        panel=WORKLOAD,
    )
    engine: str = engine_field(
        "also run both policies on the model and time them (default model: article on CUDA, "
        "cpu-small on CPU; the model options apply only then)."
    )
    stop_at_eos: bool = opt(
        False,
        "With --engine real and --model: end a request at the model's end-of-sequence token "
        "(--max-output is the cap) and write the lengths that came out to trace_POLICY.csv, "
        "for --trace to replay.",
        panel=BATCHING,
    )
    kv_memory: float | None = opt(
        None,
        "KV-cache memory in GiB shared by the memory policies (static-reserve and "
        "continuous-reserve: each sequence reserves its prompt + --max-output; "
        "continuous-paged: blocks as sequences grow, preempting when short). Default, "
        "simulated: the slot count's worth (--slots sequences of the longest prompt + "
        "--max-output, so reservation runs --slots at once); with --engine real: what the "
        "device has free beside the weights. Given with --engine real, the memory policies "
        "also run on the model, in a paged cache of this size. A token's KV bytes come from "
        "the model options (simulated: the article's model in --dtype, default fp16).",
        panel=KV,
    )
    block_size: int = block_size_field()
    kv_layout: str = kv_layout_field("the real engine's static and continuous runs")
    step_costs: tuple[Path, ...] | None = step_costs_field(
        "to price the memory policies' steps in seconds (a step of many sequences costs "
        "more than one of few). Default: time in steps."
    )

    MAX_SEEDS = 10_000

    def __post_init__(self) -> None:
        check_count("seeds", self.seeds, 1, self.MAX_SEEDS)
        check_block_size(self.block_size)
        if self.kv_memory is not None:
            check_number("kv_memory", self.kv_memory, 0, open_low=True, most=MOST_GIB,
                         unit=" GiB")  # fmt: skip

    def check(self, workload, model) -> None:
        """Options that need others: a fixed trace has no seeds; real prompts and stopping
        at end-of-sequence need the real engine and a checkpoint."""
        if workload.trace is not None and self.seeds > 1:
            raise UserError("seeds", "a --trace is fixed: there is no seed to vary")
        drawn, most = self.seeds * workload.requests, workload.MAX_REQUESTS
        if drawn > most:  # every seed draws and simulates its own workload
            raise UserError(
                "seeds",
                f"{self.seeds:,} seeds of {workload.requests:,} requests simulate {drawn:,} "
                f"requests, more than the {most:,} a run may (fewer --seeds or --requests)",
            )
        for name, given in (("prompts", workload.prompts is not None),
                            ("stop_at_eos", self.stop_at_eos)):  # fmt: skip
            if given and (self.engine != "real" or model.model is None):
                raise UserError(name, "needs --engine real and --model (a checkpoint)")
        if self.kv_layout != "contiguous" and self.engine != "real":
            raise UserError("kv_layout", "is the real engine's cache: needs --engine real")


def check_kv_budget(gib: float, blocks: int, block_size: int, prompt: int, output: int) -> None:
    """A KV budget must hold one request's prompt, and one whole reservation (the reserving
    policies admit a request only with its maximum output reserved)."""
    held = f"{significant(gib, 4)} GiB holds {blocks:,} blocks of {block_size} tokens"
    need = blocks_for(prompt, block_size)
    require(
        blocks >= need,
        "kv_memory",
        f"{held}, less than one {prompt:,}-token prompt ({need:,} blocks)",
    )
    need = blocks_for(prompt + output, block_size)
    require(
        blocks >= need,
        "kv_memory",
        f"{held}, less than one request reserves: a {prompt:,}-token prompt and {output:,} "
        f"output tokens ({need:,} blocks)",
    )
