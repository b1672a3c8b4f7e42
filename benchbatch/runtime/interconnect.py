"""The interconnect's ceiling: all-reduce time and bus bandwidth between the ranks.

Tensor parallelism adds two all-reduces to every layer of every step, each over the step's
tokens x hidden values. Their cost is the ranks' link: NVLink or PCIe between GPUs, shared
memory or the network for gloo on CPUs. Two measurements, through the one timing harness
(every rank makes the same calls: timing.py agrees on their count):

- `sweep`: all-reduces of growing messages, the roof: bus bandwidth as nccl-tests computes
  it, busbw = algbw x 2 (n - 1) / n (algbw = message bytes over the time), so numbers are
  comparable whatever the rank count; small messages are latency-bound, large ones reach
  the link's bandwidth;
- `step_collectives`: one step's own collectives on their own, at its message sizes (its
  2 x layers all-reduces, and the gather of the logits), timed exactly as the step is (in a
  CUDA graph when the step is), so a decode step's all-reduce share is measured, not
  assumed, and its bus bandwidth sits under the roof.

Rows are the probe's shape (kind "allreduce": label, size, step_ms, gbps = busbw, ...).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from benchbatch.core import accounting
from benchbatch.core.config import DTYPE_BYTES
from benchbatch.core.units import significant
from benchbatch.runtime import backend, timing
from benchbatch.runtime.timing import Measurement, TimingOptions, measure

KiB, MiB = 2**10, 2**20
# Message sizes of the sweep: decode steps' (a few KiB to a MiB) up to the link's plateau.
SIZES = {
    "cpu": tuple(256 * 4**i for i in range(9)),  # 256 B .. 16 MiB
    "cuda": tuple(KiB * 4**i for i in range(10)),  # 1 KiB .. 256 MiB
}

_ops = torch.ops._c10d_functional


def plan(dev: torch.device, sizes: tuple[int, ...] | None = None) -> list[int]:
    """Message bytes of the sweep (this kind of device's, unless given)."""
    return sorted(set(sizes or SIZES["cuda" if dev.type == "cuda" else "cpu"]))


def allreduces(group, numel: int, count: int, dev, dtype: torch.dtype, seed: int = 0):
    """A call that runs `count` all-reduces of `numel` values, one after the other as a
    step's are (each waited for before the next), on random values made once."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    buf = torch.randn(numel, device=dev, dtype=dtype, generator=gen)
    name = group.group_name

    def run() -> None:
        for _ in range(count):
            _ops.wait_tensor(_ops.all_reduce(buf, "sum", name))

    return run


def gather(group, size: int, rows: int, per: int, dev, dtype: torch.dtype):
    """A call that gathers every rank's [rows, per] slice of the logits, as a step does."""
    part = torch.randn(rows, per, device=dev, dtype=dtype)
    name = group.group_name
    return lambda: _ops.wait_tensor(_ops.all_gather_into_tensor(part, size, name))


def time_call(fn, dev, opts: TimingOptions, cuda_graphs: bool) -> Measurement:
    """Timed like a step: replayed from a CUDA graph when steps are."""
    b = backend.of(dev)
    timing.prepare(dev, opts)
    with torch.inference_mode():
        return measure(b.capture(fn) if cuda_graphs and b.graphs else fn, dev, opts)


def sweep(
    world, dev: torch.device, dtype: str, opts: TimingOptions, sizes: list[int], graphs: bool
) -> Iterator[dict]:
    """One row per message size: an all-reduce over every rank of the world."""
    dt = _torch_dtype(dtype)
    for size in sizes:
        numel = max(1, size // DTYPE_BYTES[dtype])
        fn = allreduces(world_group(), numel, 1, dev, dt)
        m = time_call(fn, dev, opts, graphs)
        yield row(m, numel * DTYPE_BYTES[dtype], world.size, dtype)


def row(m: Measurement, message_bytes: int, ranks: int, dtype: str, count: int = 1) -> dict:
    """A probe row of one all-reduce: time, algorithm and bus bandwidth (nccl-tests')."""
    stats = m.summary()
    seconds = stats.pop("step_ms") / 1e3 / count
    busbw = accounting.bus_bytes(message_bytes, ranks) / seconds / 1e9
    label = f"all-reduce {_size(message_bytes)}"
    return {
        "kind": "allreduce",
        "label": label,
        "size": message_bytes,
        "dtype": dtype,
        "ranks": ranks,
        "step_ms": seconds * 1e3,
        "algbw_gbps": message_bytes / seconds / 1e9,
        "gbps": busbw,
        "tflops": 0.0,
        "flops": 0,
        "bytes": accounting.bus_bytes(message_bytes, ranks),
        "arithmetic_intensity": 0.0,
        **stats,
        "status": "ok",
    }


def step_collectives(model, dtype: str, rows: int, logit_rows: int, opts, graphs: bool) -> dict:
    """A step's collectives on their own: allreduce_ms (its 2 x layers all-reduces of
    rows x hidden), allgather_ms (its logits), on this rank."""
    shard, cfg = model.shard, model.cfg
    dev, dt = model.embed.weight.device, model.embed.weight.dtype
    count = accounting.allreduces_per_step(cfg, shard.size)
    numel = rows * cfg.hidden
    reduce_m = time_call(allreduces(shard.group, numel, count, dev, dt), dev, opts, graphs)
    per = shard.head_rows(cfg)
    gather_m = time_call(gather(shard.group, shard.size, logit_rows, per, dev, dt), dev, opts,
                         graphs)  # fmt: skip
    return {"allreduce_ms": reduce_m.median_ms, "allgather_ms": gather_m.median_ms}


def _size(n: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{significant(n / scale, 4)} {unit}"
    return f"{n} B"


def world_group():
    import torch.distributed as dist

    return dist.group.WORLD


def _torch_dtype(dtype: str) -> torch.dtype:
    from benchbatch.runtime.device import DTYPES

    return DTYPES[dtype]
