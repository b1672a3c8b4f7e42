"""Which device and dtype to run on, and what the machine is: names, memory, threads."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from benchbatch.core.machine import cpu_model
from benchbatch.errors import UserError
from benchbatch.runtime import backend
from benchbatch.runtime.oom import OUT_OF_MEMORY_TEXTS, is_out_of_memory  # noqa: F401

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

CPU_DTYPE_NOTICE = (
    "running in fp32 on the CPU: CPUs without fp16 units run fp16 matmuls hundreds of times "
    "slower (about 0.4 against 165 GFLOP/s fp32 on the 2-core VMs benchbatch is built "
    "on); "
    "pass --dtype to override"
)


@dataclass(frozen=True)
class Target:
    device: torch.device
    dtype_name: str
    notice: str | None = None
    world: object = None  # distributed.World under torchrun (ranks, tensor-parallel group)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    @property
    def tp(self) -> int:
        """Ranks the model is sharded over (1: the whole model on this device)."""
        return 1 if self.world is None else self.world.tp


def resolve(device: str = "auto", dtype: str | None = None) -> Target:
    """The device (auto: CUDA when present) and dtype (fp16 on CUDA, fp32 on CPU)."""
    dev = resolve_device(device)
    if dtype is not None:
        if dtype not in DTYPES:
            raise UserError("--dtype", f"unknown dtype {dtype!r} (choose fp16, bf16 or fp32)")
        return Target(dev, dtype)
    if dev.type == "cuda":
        return Target(dev, "fp16")
    return Target(dev, "fp32", CPU_DTYPE_NOTICE)


def resolve_device(spec: str) -> torch.device:
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise UserError(
            "--device", f"unknown device {spec!r} (auto, cpu, cuda or cuda:N)"
        ) from None
    if dev.type not in ("cpu", "cuda"):
        raise UserError("--device", f"unsupported device {spec!r} (auto, cpu, cuda or cuda:N)")
    if dev.type == "cuda":
        _check_cuda(dev)
        # Libraries and torch defaults (events, graphs, synchronize, empty_cache) follow
        # the current device: make it this one, not device 0.
        backend.of(dev).make_current()
    return dev


def _check_cuda(dev: torch.device) -> None:
    if not torch.cuda.is_available():
        why = "this torch has no CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise UserError("--device", f"CUDA is not available ({why}); use --device cpu")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise UserError("--device", f"{dev} does not exist: this machine has {count} GPU(s)")


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return cpu_model()


def cpu_info() -> dict:
    return {
        "model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def free_memory_bytes(dev: torch.device) -> int:
    """Memory a run could still take: free GPU memory, or on the CPU this process's share
    of the available RAM (the ranks torchrun started on this machine share it: it was
    counted once per rank, each rank's ceiling as if it had the machine's RAM alone)."""
    free = backend.of(dev).free_memory()
    if dev.type == "cpu":
        from benchbatch.core import ranks

        free //= ranks.local_world_size()
    return free


def measured_or_oom(measure, dev: torch.device):
    """(measure(), "ok"), or (None, "oom") when the step does not fit in memory: running out
    is a row's status, not a crash; whatever the step held is given back either way."""
    try:
        return measure(), "ok"
    except (RuntimeError, MemoryError) as e:
        if not is_out_of_memory(e):
            raise
        return None, "oom"
    finally:
        release_memory(dev)


def release_memory(dev: torch.device) -> None:
    """Give back what a failed or finished step held, so the next one starts clean."""
    backend.of(dev).release()


@dataclass(frozen=True)
class Threads:
    """The compute threads a run uses, why, and the CPUs its compute thread is pinned to:
    metadata.json's "threads"."""

    threads: int
    chosen: str  # "--threads", or "default" (machine.choose_threads)
    reason: str  # one line, said as a note
    cores: int  # physical cores this process may use
    load_average: float | None  # the 1-minute load when the run started
    load_class: str  # "quiet", "busy" or "unknown" (machine.load_class)
    pinned: tuple[int, ...] | None  # logical CPUs of the compute thread; None: not pinned
    before: tuple[int, tuple[int, ...] | None] = (0, None)  # (torch threads, affinity) to restore

    def to_dict(self) -> dict:
        return {
            "threads": self.threads,
            "chosen": self.chosen,
            "reason": self.reason,
            "physical_cores": self.cores,
            "load_average": self.load_average,
            "load_class": self.load_class,
            "pinned_cpus": None if self.pinned is None else list(self.pinned),
            # The CPUs the process had before the pin (a server splits these between threads).
            "usable_cpus": None if self.before[1] is None else list(self.before[1]),
        }

    def restore(self) -> None:
        """Give the process back the threads and CPUs it had before the run."""
        threads, cpus = self.before
        if threads:
            torch.set_num_threads(threads)
        if cpus is not None:
            _set_affinity(cpus)


def apply_threads(dev: torch.device, threads: int | None, pin: bool = True) -> Threads:
    """Set the run's compute threads and pin the calling (compute) thread: --threads N, else
    on a CPU machine.choose_threads (one on a small or busy machine); on CUDA torch's own
    count, unpinned (the host thread only launches work). A thread count past the cores
    this process may use is not pinned, nor is anything with pin False (several ranks on
    one machine would all take the same core)."""
    from benchbatch.core import machine

    load = machine.load_average()
    one_minute = load[0] if load else None
    cores = machine.physical_cores()
    count = max(1, len(cores))
    before = (torch.get_num_threads(), _affinity())
    if threads is not None:
        n, chosen = threads, "--threads"
        reason = f"threads: {n} (--threads; {count} physical cores, load {one_minute})"
    elif dev.type == "cpu":
        chosen = "default"
        n, reason = machine.choose_threads(count, one_minute)
    else:
        n, chosen = torch.get_num_threads(), "default"
        reason = f"threads: {n} (torch's default; the GPU does the compute)"
    torch.set_num_threads(n)
    pinned = _pin(cores, n) if pin and dev.type == "cpu" and n <= count else None
    klass = machine.load_class(one_minute, count)
    return Threads(n, chosen, reason, count, one_minute, klass, pinned, before)


def _pin(cores: dict, n: int) -> tuple[int, ...] | None:
    """The calling thread onto n physical cores (one logical CPU of each, the last cores
    first: the system's own work lands on CPU 0 first); None where the platform refuses."""
    chosen = tuple(sorted(cpus[0] for cpus in list(cores.values())[-n:]))
    return chosen if _set_affinity(chosen) else None


def _affinity() -> tuple[int, ...] | None:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return None


def _set_affinity(cpus) -> bool:
    try:
        os.sched_setaffinity(0, set(cpus))
    except (AttributeError, OSError, ValueError):
        return False
    return True
