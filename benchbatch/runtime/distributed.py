"""Several processes, one measurement: the world torchrun launches, and what its ranks agree on.

`torchrun --nproc-per-node N -m benchbatch phases ...` starts N copies of the command with
RANK, LOCAL_RANK and WORLD_SIZE set (across machines torchrun's --nnodes and --rdzv-*
options add the other machines' ranks). `start` joins them into one process group (NCCL on
GPUs, each rank on cuda:LOCAL_RANK; gloo on CPUs) and groups them by --tp ranks that shard
one model (default: all of them; fewer makes world / tp replicas measured side by side).

Every rank runs the same command: the same checks, the same plans, the same steps, so the
collectives inside a step always meet. Rank 0 alone writes the run folder and prints
(results.py and the plots write only where `is_writer`; render's consoles are quiet on the
other ranks). What the ranks must agree on goes through a gloo group on the host (also on
NCCL runs, so agreeing never queues behind the GPU's work): an error found on any rank
(`together`: every rank raises it, so none is left waiting at a collective), repeat counts
(timing.py), the slowest rank's time (`slowest`), per-rank records (`gather`).

Without torchrun all of this is the identity: one process, rank 0, no process group. The
functions that only read torchrun's environment import no torch.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from benchbatch.core.ranks import (  # noqa: F401  (the world as torchrun set it)
    ENVIRONMENT,
    LAUNCH,
    env_int,
    is_writer,
    launched,
    rank,
    resolve_tp,
    world_size,
)
from benchbatch.errors import UserError

# A collective waits this long for a late rank. Rank 0 alone draws plots and writes files
# between steps (seconds), so it is generous; torchrun stops the others when a rank fails.
TIMEOUT_S = 600

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the ranks. tp_group: the ranks it shards the model with;
    control: a gloo group for agreements on the host."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    tp: int = 1
    backend: str | None = None
    tp_group: Any = None
    control: Any = None

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def replicas(self) -> int:
        return self.size // self.tp


_world = World()


def current() -> World:
    return _world


def device_spec(spec: str) -> str:
    """Under torchrun each rank takes its own GPU, cuda:LOCAL_RANK ('auto' and 'cuda' mean
    that); naming one GPU for every rank is refused."""
    if not launched():
        return spec
    text = spec.strip().lower()
    if text.startswith("cuda:"):
        raise UserError(
            "device", f"under torchrun every rank uses cuda:LOCAL_RANK; pass --device cuda "
            f"(or auto), not {spec}"
        )  # fmt: skip
    if text == "cuda" or (text == "auto" and _cuda_available()):
        return f"cuda:{env_int('LOCAL_RANK')}"
    return spec


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def start(device, tp: int | None) -> World:
    """Join torchrun's ranks (once per process) and split them into groups of tp."""
    global _world
    tp = resolve_tp(tp)
    if not launched() or world_size() == 1:
        return _world
    if _world.distributed:
        return _world
    import datetime

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    dist.init_process_group(
        backend, timeout=timeout, device_id=device if device.type == "cuda" else None
    )
    # Agreements get a group of their own (gloo, on the host): never mixed up with a step's
    # collectives, even on a CPU where both are gloo.
    control = dist.new_group(backend="gloo", timeout=timeout)
    size = dist.get_world_size()
    mesh = init_device_mesh(device.type, (size // tp, tp), mesh_dim_names=("replica", "tp"))
    _world = World(
        rank=dist.get_rank(),
        size=size,
        local_rank=env_int("LOCAL_RANK"),
        tp=tp,
        backend=backend,
        tp_group=mesh.get_group("tp"),
        control=control,
    )
    return _world


def stop() -> None:
    """Leave the process group (after a run that went well)."""
    global _world
    if _world.distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
        _world = World()


# --- agreeing --------------------------------------------------------------------------------


def gather(obj: T) -> list[T]:
    """Every rank's obj, in rank order, on every rank."""
    w = _world
    if not w.distributed:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * w.size
    dist.all_gather_object(out, obj, group=w.control)
    return out


def together(fn: Callable[[], T]) -> T:
    """fn() on every rank; a UserError on any rank is raised on all of them (the lowest
    rank's), so a check that fails on one rank (its folder, its memory) stops every rank
    at once instead of leaving the others waiting at the next collective."""
    if not _world.distributed:
        return fn()
    try:
        result, error = fn(), None
    except UserError as e:
        result, error = None, (e.option, e.message)
    first = next((e for e in gather(error) if e is not None), None)
    if first is not None:
        raise UserError(*first)
    return result


def _reduce_max(values: list[float]) -> list[float]:
    w = _world
    if not w.distributed:
        return list(values)
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=w.control)
    return t.tolist()


def each(*values: float) -> list[tuple[float, ...]]:
    """Every rank's values, in rank order (one all-gather of a few floats)."""
    w = _world
    if not w.distributed:
        return [tuple(values)]
    import torch
    import torch.distributed as dist

    mine = torch.tensor(values, dtype=torch.float64)
    out = [torch.empty_like(mine) for _ in range(w.size)]
    dist.all_gather(out, mine, group=w.control)
    return [tuple(t.tolist()) for t in out]


def slowest(*seconds: float) -> list[float]:
    """Each value's largest over the ranks (a step ends when its slowest rank ends)."""
    return _reduce_max(list(seconds))


def least(n: int) -> int:
    """The smallest n over the ranks (free memory: the tightest rank bounds them all)."""
    return -int(_reduce_max([-float(n)])[0])


def agree_max(n: int) -> int:
    """The largest n over the ranks: every rank then runs as many calls (a collective inside
    a call needs every rank to make it)."""
    return int(_reduce_max([float(n)])[0])


def agree_any(flag: bool) -> bool:
    """True on every rank if it is true on any."""
    return bool(_reduce_max([1.0 if flag else 0.0])[0])


def describe(device) -> dict:
    """This rank, as metadata records it: its host and device."""
    from benchbatch.runtime import device as devices

    w = _world
    return {
        "rank": w.rank,
        "local_rank": w.local_rank,
        "host": socket.gethostname(),
        "device": str(device),
        "device_name": devices.device_name(device),
    }


def metadata(device) -> dict | None:
    """world size, backend, tp and every rank's host and device (None on one process)."""
    w = _world
    if not w.distributed:
        return None
    ranks = gather(describe(device))
    return {
        "world_size": w.size,
        "backend": w.backend,
        "tp": w.tp,
        "replicas": w.replicas,
        "ranks": ranks,
    }
