"""The CUDA backend: every CUDA-only call benchbatch makes (device, streams, events, graphs,
synchronize, memory, L2 flush, the UUID NVML needs), made explicitly on one device.

torch's defaults follow the *current* device, which is device 0 unless someone sets it:
`Event.record()` records on the current device's stream, `torch.cuda.graph` captures on a
side stream it creates once on the current device, `torch.cuda.synchronize()` waits for the
current device. With `--device cuda:1` the work runs on device 1's stream (a tensor's
kernels go to its own device's current stream), so each of those defaults would time or
wait on the wrong device. Here every call names the device or its stream, and everything
runs inside `torch.cuda.device(index)` as well.

`api` is torch.cuda itself; tests pass a fake that records which device and stream each
call used (tests/fake_cuda.py), so this logic runs in CI without a GPU.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from benchbatch.runtime.oom import is_out_of_memory

FLUSH_BYTES = 256 * 2**20  # at least this much (and twice L2): each repeat starts cold
CAPTURE_WARMUP_CALLS = 3  # capture needs the first-call allocations and autotuning done


def avoid_cudnn_attention() -> None:
    """Attention on flash or memory-efficient kernels, never cuDNN's (process-wide; the
    selector's choice is recorded per row, sdpa_backend, and in metadata.json).

    cuDNN's attention builds an execution graph for every new shape before it runs (tens
    to hundreds of ms: sglang#4650, pytorch#155958), and a served step changes shape every
    step (each sequence's context grows by one). On the first H200 run (2026-12-04,
    torch 2.11, results/nvidia-h200) torch picked cuDNN for every kind of call, and the
    engine's calibrated steps took 8-14 ms in some blocks and 50-78 ms in others of the
    same batch and kind (every per-token slope zero, errors to 400%; docs/gpu.md). vLLM
    and SGLang serve on FlashAttention/FlashInfer. A fixed-shape step may lose some speed
    in its attention kernel by this (not yet measured: docs/gpu.md); one choice for every
    command keeps the engine's steps and the timed ones on the same kernels."""
    torch.backends.cuda.enable_cudnn_sdp(False)


class CudaBackend:
    """One CUDA device. `alloc_device` is where tensors are made (the device itself; a
    test's fake puts them on the CPU)."""

    graphs = True  # can replay a step from a CUDA graph
    queued = True  # the host enqueues work and returns before the device has run it

    def __init__(
        self,
        device: torch.device,
        api=None,
        alloc_device: torch.device | None = None,
        min_flush_bytes: int = FLUSH_BYTES,
        host_clock: Callable[[], float] = time.perf_counter,
    ):
        assert device.type == "cuda" and device.index is not None, device
        self.device, self.api = device, api if api is not None else torch.cuda
        self.alloc_device = alloc_device or device
        self.min_flush_bytes = min_flush_bytes
        self.host_clock = host_clock  # seconds; a test's fake host has its own clock
        self._flush: Callable[[], object] | None = None
        self.flush_bytes: int | None = None  # the L2-flush buffer, once it is allocated
        self.flush_error: str | None = None  # why there is no L2 flush, if there is none
        avoid_cudnn_attention()

    def activate(self) -> AbstractContextManager:
        """This device is the current one inside the block (and the previous one after)."""
        return self.api.device(self.device.index)

    def make_current(self) -> None:
        self.api.set_device(self.device.index)

    def stream(self):
        """The stream this device's work goes to: its current stream."""
        return self.api.current_stream(self.device)

    def synchronize(self) -> None:
        self.api.synchronize(self.device)

    def timer(self) -> EventTimer:
        return EventTimer(self)

    def flusher(self) -> Callable[[], object] | None:
        """A call that overwrites a buffer larger than L2. The buffer is made once per
        device, the first time a step asks, before that step allocates its own tensors;
        if even that fails (the device is full), repeats run without a flush rather than
        turn the step into an out-of-memory row."""
        if self._flush is None and self.flush_error is None:
            props = self.api.get_device_properties(self.device)
            size = max(self.min_flush_bytes, 2 * (getattr(props, "L2_cache_size", 0) or 0))
            try:
                buf = torch.empty(size // 4, dtype=torch.int32, device=self.alloc_device)
            except (RuntimeError, MemoryError) as e:
                if not is_out_of_memory(e):
                    raise
                self.flush_error = f"no memory for a {size / 2**20:.0f} MiB L2-flush buffer"
                return None
            self._flush, self.flush_bytes = (lambda: buf.fill_(0)), size
        return self._flush

    def capture(self, fn: Callable[[], object]) -> Replay:
        """Record fn's kernels once and return a replay: one launch instead of hundreds.

        fn must use static shapes and no host reads of device values. It is warmed up on a
        side stream of this device, and the graph is captured on that same stream (torch's
        own default would be a stream of the current device). The replay keeps fn, and so
        every tensor fn's closure holds, alive: a CUDAGraph owns only its own pool, and
        the tensors it read or wrote outside it would otherwise be freed (and handed out
        again) while the graph still replays into them.
        """
        api = self.api
        with self.activate():
            side = api.Stream(self.device)
            side.wait_stream(self.stream())
            with api.stream(side):
                for _ in range(CAPTURE_WARMUP_CALLS):
                    fn()
            self.stream().wait_stream(side)
            graph = api.CUDAGraph()
            with api.graph(graph, stream=side):
                fn()
        return Replay(graph, fn)

    def free_memory(self) -> int:
        free, _total = self.api.mem_get_info(self.device)
        return int(free)

    def release(self) -> None:
        """Give back what a failed or finished step held, so the next one starts clean."""
        gc.collect()
        with self.activate():
            self.api.empty_cache()

    def uuid(self) -> str | None:
        """The device's UUID as CUDA reports it (no GPU- or MIG- prefix), if it does."""
        value = getattr(self.api.get_device_properties(self.device), "uuid", None)
        return None if value is None else str(value)

    def nvml(self):
        """The pynvml module (nvidia-ml-py); ImportError when it is not installed."""
        import pynvml

        return pynvml


class Replay:
    """A captured graph and the call it was captured from, which owns the graph's inputs
    (the KV cache, tokens, lengths): both live as long as the replay, and `release` frees
    them (the timing group is done) so the allocator can give their memory back."""

    def __init__(self, graph, fn: Callable[[], object]):
        self._graph, self._fn = graph, fn

    def __call__(self) -> None:
        if self._graph is None:
            raise RuntimeError("replay of a released graph")
        self._graph.replay()

    def release(self) -> None:
        """Drop the graph (its pool) and its inputs; replaying afterwards raises."""
        graph, self._graph, self._fn = self._graph, None, None
        if graph is not None and hasattr(graph, "reset"):
            graph.reset()


class EventTimer:
    """CUDA events on the device's own stream around each call, read once at the end so
    timing never stalls the queue; the host's time to enqueue each call is kept beside."""

    def __init__(self, backend: CudaBackend):
        self._backend = backend
        self._pairs: list[tuple[object, object]] = []
        self._host_ms: list[float] = []

    @property
    def count(self) -> int:
        return len(self._pairs)

    def time(self, fn) -> None:
        api, stream = self._backend.api, self._backend.stream()
        start, end = api.Event(enable_timing=True), api.Event(enable_timing=True)
        clock = self._backend.host_clock
        start.record(stream)
        t0 = clock()
        fn()
        host = clock() - t0
        end.record(stream)
        self._pairs.append((start, end))
        self._host_ms.append(host * 1e3)

    def read(self) -> tuple[list[float], list[float]]:
        """(device ms, host enqueue ms) of each call; waits for this device first."""
        self._backend.synchronize()
        return [s.elapsed_time(e) for s, e in self._pairs], list(self._host_ms)
