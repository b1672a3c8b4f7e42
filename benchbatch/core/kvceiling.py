"""How many sequences fit in memory: reserved at the maximum length against paged at the
lengths a workload reaches. Pure arithmetic, no torch (as accounting.py).

Beside the weights (and a tenth of the memory held back for the allocator and the runtime,
as accounting.max_batch does), every running sequence holds its KV cache and its share of a
decode step's workspace. Reserved, a sequence holds the longest prompt plus the maximum
output from the start (a contiguous row, or a reservation); paged, it holds the blocks of
the tokens it reaches (prompt plus output, rounded up to whole blocks). The ratio of the two
ceilings is what paging buys on that memory for that length distribution.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from benchbatch.core import accounting
from benchbatch.core.config import ModelConfig

RESERVE_FRACTION = 0.1  # accounting.max_batch's: memory held back for the runtime
GIB = 2**30


@dataclass(frozen=True)
class Ceiling:
    """Sequences that fit on `memory_bytes` of memory, reserved and paged."""

    where: str
    memory_bytes: int
    kv_room_bytes: int  # left for KV caches and workspace beside the weights
    block_size: int
    reserved_tokens: int  # a sequence's reservation: longest prompt + maximum output
    paged_mean_tokens: float  # mean tokens a sequence reaches, in whole blocks
    reserved_sequences: int
    paged_sequences: int

    @property
    def paging_gain(self) -> float | None:
        if self.reserved_sequences == 0:
            return None
        return self.paged_sequences / self.reserved_sequences

    def row(self) -> dict:
        return {**asdict(self), "paging_gain": self.paging_gain}


def reservation_text(row: dict) -> str:
    """"84 tokens (96 in blocks of 16)": a Ceiling row's reservation as it is held, in whole
    blocks (the count of sequences is of those), the nominal length alone where it fills
    its blocks."""
    tokens, block = int(row["reserved_tokens"]), row.get("block_size")  # older rows: none
    held = in_blocks(tokens, int(block)) if block else tokens
    return f"{tokens:,} tokens" + (f" ({held:,} in blocks of {block})" if held != tokens else "")


def kv_room(cfg: ModelConfig, dtype: str, memory_bytes: int, tp: int = 1) -> int:
    """Bytes left for KV caches beside the weights (with tp, one rank's memory beside its
    shard), a tenth of the memory held back."""
    weights = accounting.weight_bytes(cfg, dtype, tp)
    return max(0, int(memory_bytes * (1 - RESERVE_FRACTION)) - weights)


def in_blocks(tokens: int, block_size: int) -> int:
    """Tokens rounded up to whole blocks."""
    return -(-tokens // block_size) * block_size


def ceiling(
    cfg: ModelConfig,
    dtype: str,
    memory_bytes: int,
    lengths: Iterable[int],
    reserved_tokens: int,
    block_size: int,
    where: str,
    tp: int = 1,
) -> Ceiling:
    """The two ceilings on one memory. lengths: the tokens each request of the workload
    reaches (prompt + output); reserved_tokens: what reservation holds for each; tp: the
    memory is one rank's, beside its shard, each token's KV its share of the heads."""
    lengths = list(lengths)
    if not lengths:
        raise ValueError("a ceiling needs the workload's lengths")
    room = kv_room(cfg, dtype, memory_bytes, tp)
    per_token = accounting.kv_bytes_per_token(cfg, dtype, tp)
    workspace = accounting.step_workspace_bytes(cfg, dtype, 1, tp)
    paged_mean = sum(in_blocks(n, block_size) for n in lengths) / len(lengths)
    reserved_bytes = in_blocks(reserved_tokens, block_size) * per_token + workspace
    paged_bytes = paged_mean * per_token + workspace
    return Ceiling(
        where,
        memory_bytes,
        room,
        block_size,
        reserved_tokens,
        paged_mean,
        room // reserved_bytes,
        int(room // paged_bytes),
    )


def for_workload(
    cfg: ModelConfig,
    dtype: str,
    requests,
    reserve_output: int,
    block_size: int,
    memories: Iterable[tuple[str, int]],
    tp: int = 1,
) -> list[Ceiling]:
    """Both ceilings for the requests' lengths on each (where, bytes) memory: reservation
    holds the longest prompt plus reserve_output (the serving cap), paging what each
    reaches; with tp, each memory one rank's (ceiling). No sequence outgrows the model's
    context (a server caps its output there: vLLM's max_model_len), so neither length
    passes cfg.max_context (clipped_lengths says whether any did)."""
    most = cfg.max_context
    prompts = [int(r.prompt_tokens) for r in requests]
    lengths = [min(most, p + int(r.output_tokens))
               for p, r in zip(prompts, requests, strict=True)]  # fmt: skip
    reserved = min(most, max(prompts) + reserve_output)
    return [ceiling(cfg, dtype, b, lengths, reserved, block_size, where, tp)
            for where, b in memories]  # fmt: skip


def clipped_lengths(cfg: ModelConfig, requests, reserve_output: int) -> bool:
    """Whether for_workload clipped a length at the model's context: a prompt plus its
    output, or the longest prompt plus reserve_output, past cfg.max_context."""
    prompts = [int(r.prompt_tokens) for r in requests]
    longest = max(p + int(r.output_tokens) for p, r in zip(prompts, requests, strict=True))
    return max(longest, max(prompts) + reserve_output) > cfg.max_context


def datasheet_bytes(memory_gib: float) -> int:
    return int(memory_gib * GIB)
