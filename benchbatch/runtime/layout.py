"""How the model's projection weights are stored, chosen on each device by measuring.

Two choices that change no value of the model, only how fast a step reads its weights:

- columns: a weight [out, in] stored transposed in memory (each input feature's outputs
  side by side), so a product with few rows streams the weight as the BLAS's non-transposed
  matrix-vector kernel does. On the 2-core AMD EPYC CPU (MKL, fp32) a batch-1 decode
  step's products ran about 25% faster this way; another device may differ.
- split: the fused [q | k | v] and [gate | up] weights multiplied as three and two
  products over row slices of the one weight (views: checkpoints and shards are unchanged);
  at 32 rows some CPU kernels did better on the narrower products.

`choose(model)` times the model's own projections in every layout, alternating (ROUNDS
times each), at one and at 32 rows, once per process for each device, dtype and shape, and
returns the layout with the smallest summed time relative to the best at each row count
(ties keep ROWS, the layout nn.Linear gives). Every rank of a tensor-parallel group adds up
all ranks' scores, so the ranks agree.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class WeightLayout:
    columns: bool = False  # weights stored transposed (in-major)
    split: bool = False  # fused projections run as one product per part

    @property
    def name(self) -> str:
        return ("columns" if self.columns else "rows") + (", split" if self.split else ", fused")


ROWS = WeightLayout()
LAYOUTS = tuple(WeightLayout(c, s) for c in (False, True) for s in (False, True))
PROBE_BYTES = 256 * 2**20  # at most this much of the model's layers is copied to time
# Timings of each layout at each row count (the median taken). Three were too few: on the
# 2-core Intel VM (cpu-small, one pinned thread) layouts 5-8% apart, columns-fused and
# rows-split, came out 7 to 5 in twelve choices at three rounds, 8 to 0 at nine, and a
# serving run's step costs by batch size follow the layout (a decode step of 2 rows cost
# 12.6 ms in one, 16.4 in the other), so two runs of one command differed by the draw.
ROUNDS = 9
_chosen: dict[tuple, WeightLayout] = {}


def is_columns(w: torch.Tensor) -> bool:
    """A 2-D weight stored transposed: its first index is the contiguous one."""
    return w.dim() == 2 and w.shape[0] > 1 and w.stride(0) == 1 and w.stride(1) == w.shape[0]


def choose(model, rows: tuple[int, ...] = (1, 32), rounds: int = ROUNDS) -> WeightLayout:
    """The measured fastest layout for this model's projections on its device (cached)."""
    from benchbatch.runtime import distributed

    w = model.embed.weight
    cfg = model.local_cfg
    key = (str(w.device), w.dtype, cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.intermediate, rows)
    if key not in _chosen:
        scores = distributed.gather(layout_scores(cfg, w.device, w.dtype, rows, rounds))
        totals = [sum(s[i] for s in scores) for i in range(len(LAYOUTS))]
        ranked = sorted(zip(totals, LAYOUTS, strict=True), key=lambda p: (p[0], p[1] != ROWS))
        _chosen[key] = ranked[0][1]
    return _chosen[key]


def layout_scores(cfg, device, dtype, rows, rounds: int) -> list[float]:
    """Each layout's summed time over the row counts, each relative to the fastest layout."""
    layers = probe_layers(cfg, device, dtype)
    per_rows = []
    for n in rows:
        x = torch.randn(n, cfg.hidden, device=device, dtype=dtype)
        times = alternate([lambda lay=lay, x=x: run_layers(layers[lay.columns], x, cfg, lay.split)
                           for lay in LAYOUTS], device, rounds)  # fmt: skip
        best = min(times)
        per_rows.append([t / best for t in times])
    return [sum(r[i] for r in per_rows) for i in range(len(LAYOUTS))]


def probe_layers(cfg, device, dtype) -> dict[bool, list[list[torch.Tensor]]]:
    """Random copies of the model's projection weights for as many layers as the model has
    (up to PROBE_BYTES), in both memory orders: a probe as large as the model streams
    weights from where the model's own live."""
    shapes = [(cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden), (cfg.hidden, cfg.q_dim),
              (2 * cfg.intermediate, cfg.hidden), (cfg.hidden, cfg.intermediate)]  # fmt: skip
    size = torch.finfo(dtype).bits // 8 * sum(a * b for a, b in shapes)
    count = max(1, min(cfg.layers, PROBE_BYTES // max(1, size)))
    draw = lambda s: torch.randn(s, device=device, dtype=dtype)  # noqa: E731
    rows_first = [[draw(s) for s in shapes] for _ in range(count)]
    columns = [[w.t().contiguous().t() for w in layer] for layer in rows_first]
    return {False: rows_first, True: columns}


@torch.inference_mode()
def run_layers(layers, x: torch.Tensor, cfg, split: bool) -> None:
    """Every probe layer's four products as a step runs them (inputs of the right widths)."""
    q = x.new_zeros(x.shape[0], cfg.q_dim)
    mid = x.new_zeros(x.shape[0], cfg.intermediate)
    for wqkv, wo, w13, w2 in layers:
        if split:
            for part in wqkv.split((cfg.q_dim, cfg.kv_dim, cfg.kv_dim)):
                F.linear(x, part)
            for part in w13.split(cfg.intermediate):
                F.linear(x, part)
        else:
            F.linear(x, wqkv)
            F.linear(x, w13)
        F.linear(q, wo)
        F.linear(mid, w2)


def alternate(fns, device, rounds: int) -> list[float]:
    """Median seconds of each function, timed in turn `rounds` times after one warm-up each:
    a burst of other load hits every layout alike."""
    from benchbatch.runtime.timing import synchronize

    times: list[list[float]] = [[] for _ in fns]
    for i in range(rounds + 1):
        for fn, pooled in zip(fns, times, strict=True):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            if i:
                pooled.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]
