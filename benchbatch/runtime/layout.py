"""How the model's projection weights are stored, chosen on each device by measuring.

Three choices that change no value of the model, only how fast a step reads its weights:

- columns: a weight [out, in] stored transposed in memory (each input feature's outputs
  side by side), so a product with few rows streams the weight as the BLAS's non-transposed
  matrix-vector kernel does. On the 2-core AMD EPYC CPU (MKL, fp32) a batch-1 decode
  step's products ran about 25% faster this way; another device may differ.
- split: the fused [q | k | v] and [gate | up] weights multiplied as three and two
  products over row slices of the one weight (views: checkpoints and shards are unchanged);
  at 32 rows some CPU kernels did better on the narrower products.
- packed (a CPU's, where torch has oneDNN and the dtype's kernels): each weight reordered
  once into oneDNN's blocked format and multiplied by its prepacked linear (the kernels
  torch.compile's CPU freezing and vLLM-CPU use). On the 2-core AMD EPYC CPU (fp32, one
  thread, 2026-12-07) the projections of 8 rows ran 1.8x, of 32 1.5x, of 128 1.2x faster
  than any strided layout, and of one row 1.25x slower than columns (oneDNN's call costs;
  a whole cpu-small batch-1 decode step at x0.90 of columns' speed with the floor below).
  Its kernels for the fewest rows can be slower than for a few more: there a packed
  product of 1 to 3 rows took longer than of 4 (a whole cpu-small decode step of 2 rows
  13.4 ms, of 4 10.7), so a product of fewer rows than the layout's `floor` is computed at
  `floor` rows (zero rows added, their outputs dropped): row_floor() measures it.

`choose(model)` times the model's own projections in every layout, alternating (ROUNDS
times each), at one and at 32 rows, once per process for each device, dtype and shape, and
returns the layout with the smallest summed time relative to the best at each row count
(ties keep ROWS, the layout nn.Linear gives); the packed candidate is timed at its floor,
measured first. Every rank of a tensor-parallel group adds up all ranks' scores (and
row_floor's times), so the ranks agree.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class WeightLayout:
    columns: bool = False  # weights stored transposed (in-major)
    split: bool = False  # fused projections run as one product per part
    packed: bool = False  # oneDNN's blocked weights, prepacked products (never columns/split)
    floor: int = 1  # packed: a product of fewer rows is computed at this many (row_floor)

    def __post_init__(self) -> None:
        assert not (self.packed and (self.columns or self.split)), "packed is its own order"
        assert self.floor >= 1 and (self.packed or self.floor == 1), "a floor is packed's"

    @property
    def name(self) -> str:
        if self.packed:
            return "packed (oneDNN)" + (f", rows padded to {self.floor}" if self.floor > 1 else "")
        return ("columns" if self.columns else "rows") + (", split" if self.split else ", fused")


ROWS = WeightLayout()
PACKED = WeightLayout(packed=True)
LAYOUTS = tuple(WeightLayout(c, s) for c in (False, True) for s in (False, True))
# The batch oneDNN blocks a packed weight for: 8 and 128 gave the same speeds at 1 to 128
# rows on the 2-core AMD EPYC CPU (a hint of 1 was 2x slower at 2-8 rows).
PACK_ROWS = 128
_packable: dict[tuple, bool] = {}


def packable(device, dtype) -> bool:
    """Whether this device and dtype have oneDNN's prepacked linear: a CPU, torch built
    with oneDNN, and the dtype's kernels on this CPU (fp16 needs AVX512-FP16 or
    AVX-NE-CONVERT): tried once on a small weight."""
    device = torch.device(device)
    key = (device.type, dtype)
    if key not in _packable:
        ok = device.type == "cpu" and torch.backends.mkldnn.is_available()
        if ok:
            try:
                w = torch.ones(8, 8, dtype=dtype)
                out = packed_linear(torch.ones(2, 8, dtype=dtype), pack(w), None)
                ok = out.shape == (2, 8) and bool((out == 8).all())
            except (RuntimeError, AttributeError):  # no such kernel here, or no such op
                ok = False
        _packable[key] = ok
    return _packable[key]


def candidates(device, dtype, packed: bool = True) -> tuple[WeightLayout, ...]:
    """The layouts to time on this device: the strided four, and PACKED where packable
    (and `packed`: torch.compile takes strided weights)."""
    return LAYOUTS + ((PACKED,) if packed and packable(device, dtype) else ())


def pack(w: torch.Tensor) -> torch.Tensor:
    """A weight [out, in] in oneDNN's blocked format (an opaque tensor; .to_dense() gives
    the values back)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACK_ROWS)


def packed_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  floor: int = 1) -> torch.Tensor:  # fmt: skip
    """F.linear(x, weight, bias) of a packed weight; x of fewer than `floor` rows (its
    leading dimensions flattened) computed at `floor` rows, the added rows zeros and their
    outputs dropped."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if 0 < rows < floor:
        flat = F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, floor - rows))
        out = torch.ops.mkldnn._linear_pointwise(flat, w, bias, "none", [], "")
        return out[:rows].reshape(*x.shape[:-1], out.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An nn.Linear whose weight is packed (oneDNN's blocked format, the same values): what
    the PACKED layout puts in each projection's place; unpacked() gives the nn.Linear back."""

    def __init__(self, linear: nn.Linear, floor: int = 1) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(pack(linear.weight.detach()), requires_grad=False)
        self.bias = linear.bias
        self.floor = floor  # the layout's: fewer rows are computed at this many

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias, self.floor)

    def unpacked(self) -> nn.Linear:
        w = self.weight.to_dense()
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device="meta", dtype=w.dtype)  # fmt: skip
        linear.weight = nn.Parameter(w, requires_grad=False)
        linear.bias = self.bias
        return linear


def repack(model: nn.Module, packed: bool, keep: nn.Module | None = None,
           floor: int = 1) -> None:  # fmt: skip
    """Every nn.Linear of `model` packed (packed) or every PackedLinear unpacked, in place,
    one weight at a time; `keep` (a head tied to the embedding) stays as it is. Packed
    products get the row floor `floor`."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if packed and isinstance(child, nn.Linear) and child is not keep:
                setattr(parent, name, PackedLinear(child, floor))
            elif packed and isinstance(child, PackedLinear):
                child.floor = floor
            elif not packed and isinstance(child, PackedLinear):
                setattr(parent, name, child.unpacked())


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


def choose(model, rows: tuple[int, ...] = (1, 32), rounds: int = ROUNDS,
           packed: bool = True) -> WeightLayout:  # fmt: skip
    """The measured fastest layout for this model's projections on its device (cached);
    packed=False: of the strided ones only (torch.compile's)."""
    from benchbatch.runtime import distributed

    w = model.embed.weight
    cfg = model.local_cfg
    layouts = candidates(w.device, w.dtype, packed)
    key = (str(w.device), w.dtype, cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.intermediate, rows,
           layouts)  # fmt: skip
    if key not in _chosen:
        if PACKED in layouts:  # timed and chosen at its floor
            floor = row_floor(cfg, w.device, w.dtype, rounds)
            layouts = tuple(WeightLayout(packed=True, floor=floor) if lay == PACKED else lay
                            for lay in layouts)  # fmt: skip
        scores = distributed.gather(layout_scores(cfg, w.device, w.dtype, rows, rounds, layouts))
        totals = [sum(s[i] for s in scores) for i in range(len(layouts))]
        ranked = sorted(zip(totals, layouts, strict=True), key=lambda p: (p[0], p[1] != ROWS))
        _chosen[key] = ranked[0][1]
    return _chosen[key]


# The row counts a packed product's floor is chosen among; how much faster than one row the
# floor must be timed to be kept (a product padded for less is not worth its rows); and
# how near the fastest a smaller row count may be and be taken (on the 2-core AMD EPYC
# CPU, cpu-small's projections took 4.5, 4.8, 4.0, 3.6, 3.5, 3.5, 4.3, 4.5 ms at 1 to 8
# rows: 4, 5 and 6 rows are one speed, and the draw should not pick among them).
FLOOR_ROWS = tuple(range(1, 9))
FLOOR_GAIN = 0.05
FLOOR_TIE = 0.05


def row_floor(cfg, device, dtype, rounds: int = ROUNDS) -> int:
    """The packed layout's floor on this device: of FLOOR_ROWS, the row count at which the
    model's packed projections (probe layers, as layout_scores times them) take least time,
    every rank's times summed (pick_floor). Padding fewer rows up to it costs at most
    FLOOR_TIE more than their own time (it is timed within that of the fastest)."""
    from benchbatch.runtime import distributed

    layers = probe_layers(cfg, device, dtype, packed=True)["packed"]
    xs = [torch.randn(n, cfg.hidden, device=device, dtype=dtype) for n in FLOOR_ROWS]
    times = alternate([lambda x=x: run_layers(layers, x, cfg, PACKED) for x in xs], device,
                      rounds)  # fmt: skip
    return pick_floor([sum(t) for t in zip(*distributed.gather(times), strict=True)])


def pick_floor(times: list[float]) -> int:
    """The floor of FLOOR_ROWS' times (one per row count): the fewest rows timed within
    FLOOR_TIE of the fastest, if FLOOR_GAIN faster than one row; else 1 (no padding)."""
    fastest = min(times)
    best = next(i for i, t in enumerate(times) if t <= (1 + FLOOR_TIE) * fastest)
    return FLOOR_ROWS[best] if times[best] < (1 - FLOOR_GAIN) * times[0] else 1


def layout_scores(cfg, device, dtype, rows, rounds: int,
                  layouts: tuple[WeightLayout, ...] = LAYOUTS) -> list[float]:  # fmt: skip
    """Each layout's summed time over the row counts, each relative to the fastest layout."""
    layers = probe_layers(cfg, device, dtype, any(lay.packed for lay in layouts))
    per_rows = []
    for n in rows:
        x = torch.randn(n, cfg.hidden, device=device, dtype=dtype)
        times = alternate([lambda lay=lay, x=x: run_layers(layers[_order(lay)], x, cfg, lay)
                           for lay in layouts], device, rounds)  # fmt: skip
        best = min(times)
        per_rows.append([t / best for t in times])
    return [sum(r[i] for r in per_rows) for i in range(len(layouts))]


def _order(lay: WeightLayout) -> str:
    return "packed" if lay.packed else "columns" if lay.columns else "rows"


def probe_layers(cfg, device, dtype, packed: bool = False) -> dict[str, list[list[torch.Tensor]]]:
    """Random copies of the model's projection weights for as many layers as the model has
    (up to PROBE_BYTES), in each memory order (rows, columns, and packed if asked): a probe
    as large as the model streams weights from where the model's own live."""
    shapes = [(cfg.q_dim + 2 * cfg.kv_dim, cfg.hidden), (cfg.hidden, cfg.q_dim),
              (2 * cfg.intermediate, cfg.hidden), (cfg.hidden, cfg.intermediate)]  # fmt: skip
    size = torch.finfo(dtype).bits // 8 * sum(a * b for a, b in shapes)
    count = max(1, min(cfg.layers, PROBE_BYTES // max(1, size)))
    draw = lambda s: torch.randn(s, device=device, dtype=dtype)  # noqa: E731
    rows_first = [[draw(s) for s in shapes] for _ in range(count)]
    columns = [[w.t().contiguous().t() for w in layer] for layer in rows_first]
    out = {"rows": rows_first, "columns": columns}
    if packed:
        out["packed"] = [[pack(w) for w in layer] for layer in rows_first]
    return out


@torch.inference_mode()
def run_layers(layers, x: torch.Tensor, cfg, lay: WeightLayout) -> None:
    """Every probe layer's four products as a step runs them (inputs of the right widths)."""
    q = x.new_zeros(x.shape[0], cfg.q_dim)
    mid = x.new_zeros(x.shape[0], cfg.intermediate)
    product = (lambda a, w: packed_linear(a, w, None, lay.floor)) if lay.packed else F.linear
    for wqkv, wo, w13, w2 in layers:
        if lay.split:
            for part in wqkv.split((cfg.q_dim, cfg.kv_dim, cfg.kv_dim)):
                F.linear(x, part)
            for part in w13.split(cfg.intermediate):
                F.linear(x, part)
        else:
            product(x, wqkv)
            product(x, w13)
        product(q, wo)
        product(mid, w2)


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
