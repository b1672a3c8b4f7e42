"""The piggyback experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.optkit import check_count, check_number, opt
from benchbatch.experiments.fields import (
    check_context,
    check_lengths,
    context_field,
    decode_batch_field,
)


@dataclass(frozen=True)
class PiggybackOptions:
    decode_batch: tuple[int, ...] = decode_batch_field()
    context: tuple[int, ...] = context_field()
    piggyback_tokens: tuple[int, ...] = opt(
        (16, 32, 64, 128, 256, 512),
        "Prefill tokens (one prompt's chunk) riding on the decode step, comma-separated; the "
        "decode step alone is measured too.",
        parse="ints",
        aliases=("--prefill",),
    )
    threshold: float = opt(
        0.10,
        "A mixed step within this fraction of the decode-only step (0.1: 10%) counts as "
        "carrying its prefill tokens nearly free.",
    )
    chunk_prompt: int = opt(2048, "Prompt tokens prefilled in chunks for the chunk-size sweep.")
    chunks: tuple[int, ...] = opt(
        (128, 256, 512, 2048),
        "Chunk sizes, comma-separated (one prefill of the whole prompt is added).",
        parse="ints",
    )
    tiles: tuple[int, ...] = opt(
        (256, 257), "Prefill step lengths that show tile effects, comma-separated.", parse="ints"
    )

    def __post_init__(self) -> None:
        check_number("threshold", self.threshold, most=10)  # 1,000%: past it nothing is "free"
        check_count("chunk_prompt", self.chunk_prompt, 1)

    def whole_chunks(self) -> str | None:
        """A note where some --chunks are not shorter than --chunk-prompt: each is the one
        whole prefill (measured once), not a chunk size of its own."""
        whole = [c for c in self.chunks if c >= self.chunk_prompt]
        if not whole or whole == [self.chunk_prompt]:  # the default's 2048: the whole, as said
            return None
        sizes = ", ".join(map(str, whole))
        return (
            f"--chunks {sizes}: not shorter than the {self.chunk_prompt}-token --chunk-prompt, "
            "so one whole prefill, measured once (a longer --chunk-prompt chunks it)"
        )

    def check(self, cfg) -> None:
        check_context(cfg, self.context)
        check_lengths(cfg, "piggyback_tokens", self.piggyback_tokens)
        check_lengths(cfg, "chunk_prompt", (self.chunk_prompt,))
        check_lengths(cfg, "tiles", self.tiles)
