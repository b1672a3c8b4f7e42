"""The phases experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.optkit import opt
from benchbatch.experiments.fields import (
    block_size_field,
    check_block_fits,
    check_block_size,
    check_context,
    check_lengths,
    context_field,
    decode_batch_field,
    kv_layout_field,
)


@dataclass(frozen=True)
class PhasesOptions:
    prefill: tuple[int, ...] = opt(
        (512, 2048), "Prompt lengths to prefill (one sequence each), comma-separated.",
        parse="ints",
    )  # fmt: skip
    decode_batch: tuple[int, ...] = decode_batch_field()
    context: tuple[int, ...] = context_field()
    kv_layout: str = kv_layout_field("the timed steps")
    block_size: int = block_size_field()

    def __post_init__(self) -> None:
        check_block_size(self.block_size)

    def check(self, cfg) -> None:
        check_context(cfg, self.context)
        check_block_fits(cfg, self.kv_layout, self.block_size)
        check_lengths(cfg, "prefill", self.prefill)
