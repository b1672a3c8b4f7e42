"""The sweep experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.optkit import KV, check_number, opt, require
from benchbatch.experiments.fields import (
    block_size_field,
    check_block_fits,
    check_block_size,
    check_context,
    check_price_per_hour,
    context_field,
    kv_layout_field,
    price_per_hour_field,
)

CPU_BATCHES = (1, 8, 32, 64, 128)


CUDA_BATCHES = (1, 8, 32, 128, 256)


@dataclass(frozen=True)
class SweepOptions:
    batch: tuple[int, ...] | None = opt(
        None,
        "Decode batch sizes (sequences per step), comma-separated. Default: 1,8,32,128,256 "
        "(the article's); 1,8,32,64,128 on a CPU.",
        parse="ints",
        flag="--decode-batch",  # as phases, piggyback and project name it; --batch the old
        aliases=("--batch",),
    )
    context: tuple[int, ...] = context_field()
    knee_threshold: float = opt(
        0.25,
        "The knee is the first batch whose step time exceeds the smallest batch's by more "
        "than this fraction (0.25: 25%).",
    )
    try_oom: bool = opt(
        False,
        "Also run batches over the predicted memory ceiling (out of memory is recorded as oom; "
        "on a CPU the operating system may kill the process instead).",
    )
    kv_layout: str = kv_layout_field("the timed steps")
    block_size: int = block_size_field()
    gpu: str | None = opt(
        None,
        "Also give the memory ceiling of the workload's lengths on this GPU's datasheet "
        "memory (h100, a100, l4, rtx 4090, ...): sequences that fit reserved at the maximum "
        "length against paged at the lengths they reach.",
        panel=KV,
    )
    price_per_hour: float | None = price_per_hour_field()

    def __post_init__(self) -> None:
        check_number("knee_threshold", self.knee_threshold, 0, open_low=True)
        check_price_per_hour(self.price_per_hour)
        check_block_size(self.block_size)
        if self.gpu is not None:
            self.datasheet()

    def datasheet(self):
        """The named GPU's datasheet entry (a UserError if unknown or its memory is)."""
        from benchbatch.core import peaks

        peak = peaks.lookup(self.gpu or "")
        known = [n for n in peaks.names() if peaks.lookup(n).memory_gib]
        require(
            peak is not None and peak.memory_gib is not None,
            "gpu",
            f"no datasheet memory for {self.gpu!r}; known: {', '.join(known)}",
        )
        return peak

    def batches(self, target) -> tuple[int, ...]:
        if self.batch is not None:
            return self.batch
        return CUDA_BATCHES if target.device.type == "cuda" else CPU_BATCHES

    def check(self, cfg) -> None:
        check_context(cfg, self.context)
        check_block_fits(cfg, self.kv_layout, self.block_size)
