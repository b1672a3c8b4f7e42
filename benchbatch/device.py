"""Which device and dtype to run on, and what the machine is: names, memory, threads."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from benchbatch import backend
from benchbatch.errors import UserError
from benchbatch.machine import cpu_model

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

CPU_DTYPE_NOTICE = (
    "running in fp32 on the CPU: CPUs without fp16 units run fp16 matmuls hundreds of times "
    "slower (about 0.4 against 165 GFLOP/s measured on the 2-core machines here); "
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
    """Memory a run could still take: free GPU memory, or available RAM on the CPU."""
    return backend.of(dev).free_memory()


OUT_OF_MEMORY_TEXTS = (
    "out of memory",
    "can't allocate memory",
    "Storage size calculation overflowed",  # more bytes than a 64-bit size can count
    # cuBLAS and cuDNN allocate their handles and workspaces outside torch's allocator:
    # on a full device they fail with their own status (a RuntimeError), not torch's OOM.
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # cuDNN 9's name for it
)


def is_out_of_memory(error: BaseException | None) -> bool:
    """CUDA's OutOfMemoryError, cuBLAS's or cuDNN's failure to allocate, the CPU
    allocator's failure, or a size no memory holds;
    also an error raised while handling one (a graph capture that ran out of memory fails
    again when it is closed, and that second error is the one raised)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, torch.cuda.OutOfMemoryError | MemoryError):
            return True
        if any(text in str(error) for text in OUT_OF_MEMORY_TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


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
