"""The CUDA-only pieces, kept thin: event timing, L2 flush, CUDA graph capture.

Nothing here runs without CUDA; the rest of benchbatch calls it only on CUDA devices.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class EventTimer:
    """CUDA events around each call; read once at the end so timing never stalls the queue."""

    def __init__(self):
        self._pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def count(self) -> int:
        return len(self._pairs)

    def time(self, fn) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        self._pairs.append((start, end))

    def elapsed_ms(self) -> list[float]:
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in self._pairs]


def l2_flusher(device: torch.device) -> Callable[[], None]:
    """Overwrite a buffer larger than L2 so each repeat starts with a cold cache."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    size = max(256 * 2**20, 2 * l2)
    buf = torch.empty(size // 4, dtype=torch.int32, device=device)
    return lambda: buf.fill_(0)


def capture_graph(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """Record fn's kernels once and return a replay: one launch instead of hundreds.

    fn must use static shapes and tensors that stay alive; it is warmed up on a side stream
    first, as capture requires.
    """
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
