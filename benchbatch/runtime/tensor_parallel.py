"""One rank of a tensor-parallel group: the collectives its model makes and its weights.

The layout (which rows and columns of every weight a rank holds) is benchbatch/core/sharding.py;
here it becomes tensors. The model calls `all_reduce` after wo and after w2 and
`gather_vocab` after the LM head (benchbatch/runtime/model.py). Both are torch's functional
collectives, called as their ops (`_c10d_functional`): plain tensors in and out, no host
synchronisation, so a decode step with them is captured in a CUDA graph on NCCL like any
other step.

Sharded by hand rather than with torch's DTensor `parallelize_module`: the two give the same
logits, and scripts/bench_tp.py measures both side by side at decode (README, "Several
GPUs": the DTensor path's per-step overhead was the larger on this machine).

Random weights are the whole model's, drawn tensor by tensor in the whole model's order
with its seed, each rank keeping its slices: a model sharded over any number of ranks is the
same model as on one, which the tests check logit for logit.
"""

from __future__ import annotations

import torch

from benchbatch.core import sharding
from benchbatch.core.config import ModelConfig

_ops = torch.ops._c10d_functional


class TensorParallel:
    """Rank `rank` of `size` ranks that shard one model over process group `group`."""

    def __init__(self, rank: int, size: int, group):
        self.rank, self.size, self.group = rank, size, group
        self.group_name = group.group_name

    def __repr__(self) -> str:
        return f"TensorParallel(rank={self.rank}, size={self.size})"

    # --- shapes ----------------------------------------------------------------------------

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        return sharding.local_config(cfg, self.size)

    def head_rows(self, cfg: ModelConfig) -> int:
        return sharding.vocab_per_rank(cfg, self.size)

    def piece(self, name: str, cfg: ModelConfig) -> sharding.Piece:
        return sharding.piece(name, cfg, self.size, self.rank)

    # --- collectives -----------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial x (a row-parallel projection's output)."""
        return _ops.wait_tensor(_ops.all_reduce(x, "sum", self.group_name))

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Every rank's slice of the vocabulary [rows, per] into the full logits [rows, vocab]
        (the padding past the vocabulary dropped)."""
        rows, per = logits.shape
        whole = _ops.wait_tensor(
            _ops.all_gather_into_tensor(logits.contiguous(), self.size, self.group_name)
        )
        return whole.view(self.size, rows, per).permute(1, 0, 2).reshape(rows, -1)[:, :vocab]

    # --- weights ---------------------------------------------------------------------------

    @torch.no_grad()
    def randomize(self, model, seed: int) -> None:
        """The whole model's seeded draws (Transformer.randomize's order), this rank's slices
        kept: one whole tensor in memory at a time."""
        from benchbatch.runtime.model import Transformer

        cfg, w = model.cfg, model.embed.weight
        mine = dict(model.named_parameters())
        whole_model = Transformer(cfg, "meta", w.dtype, init=False)
        gen = torch.Generator(device=w.device).manual_seed(seed)
        for name, p in whole_model.named_parameters():
            if name.endswith("norm.weight"):
                mine[name].fill_(1.0)
                continue
            whole = torch.empty(p.shape, device=w.device, dtype=w.dtype)
            whole.normal_(0.0, 0.02, generator=gen)
            place(mine[name], whole, self.piece(name, cfg))
            if name == "embed.weight" and cfg.tie_embeddings:  # the head is a slice of it
                place(mine["lm_head.weight"], whole, self.piece("lm_head.weight", cfg))


def place(dest: torch.Tensor, whole: torch.Tensor, piece: sharding.Piece) -> None:
    """Copy this rank's piece of a whole parameter into its own."""
    if piece.zero:
        dest.zero_()
        return
    if piece.dim is None:
        dest.copy_(whole)
        return
    parts = [whole.narrow(piece.dim, a, b - a) for a, b in piece.spans]
    if piece.pad:
        shape = list(whole.shape)
        shape[piece.dim] = piece.pad
        parts.append(whole.new_zeros(shape))
    dest.copy_(torch.cat(parts, dim=piece.dim))


def write_piece(dest: torch.Tensor, piece: sharding.Piece, span, tensor: torch.Tensor):
    """A checkpoint tensor that fills rows `span` of a whole parameter (None: all of it):
    this rank's part of it into `dest`. Returns what was written (for the fp16 range check)."""
    if span is None or piece.dim != 0:
        place(dest, tensor, piece)
        return dest
    written = []
    for local, source, n in sharding.overlap(piece, *span):
        written.append(dest[local : local + n].copy_(tensor[source : source + n]))
    return torch.cat(written) if written else dest.new_zeros(0)


def of(world) -> TensorParallel | None:
    """This rank's place in its tensor-parallel group, or None on a single rank."""
    if world is None or world.tp == 1:
        return None
    return TensorParallel(world.tp_rank, world.tp, world.tp_group)


def tp_of(model) -> int:
    """Ranks the model is sharded over (1: whole)."""
    shard = getattr(model, "shard", None)
    return 1 if shard is None else shard.size
