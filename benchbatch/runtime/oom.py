"""Running out of memory, recognised wherever it is raised: a row's status (`oom`), never a
crash. Below the backends (benchbatch/runtime/cuda.py asks it while capturing a graph)."""

from __future__ import annotations

import torch

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
