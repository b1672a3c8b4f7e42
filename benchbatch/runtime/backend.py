"""The device-specific calls timing makes, behind one small object chosen by the device.

A backend makes a device current, synchronizes it, times calls (device time and the host's
time to enqueue them), flushes L2, captures CUDA graphs, reports free memory and releases
cached memory. `of(device)` gives the CUDA backend (benchbatch/runtime/cuda.py) or the CPU one
below; a test installs a fake with `use(backend)`, so the logic that drives a backend runs
on a CPU exactly as it would on a GPU.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from benchbatch.core.machine import available_ram_bytes


class Timer(Protocol):
    count: int

    def time(self, fn: Callable[[], object]) -> None: ...
    def read(self) -> tuple[list[float], list[float]]: ...


class Backend(Protocol):
    """What timing, the probes and device.py need of a device (CudaBackend, CpuBackend)."""

    device: torch.device
    graphs: bool  # can capture a CUDA graph
    queued: bool  # the host enqueues work and runs ahead of the device
    flush_error: str | None

    def activate(self) -> contextlib.AbstractContextManager: ...
    def make_current(self) -> None: ...
    def synchronize(self) -> None: ...
    def timer(self) -> Timer: ...
    def flusher(self) -> Callable[[], object] | None: ...
    def capture(self, fn: Callable[[], object]) -> Callable[[], object]: ...  # owns fn
    def free_memory(self) -> int: ...
    def release(self) -> None: ...
    def uuid(self) -> str | None: ...
    def nvml(self): ...


_backends: dict[torch.device, Backend] = {}
_override: Backend | None = None


def of(device: torch.device) -> Backend:
    """The backend of this device, one per device (it keeps the L2-flush buffer)."""
    if _override is not None:
        return _override
    if device.type == "cuda":
        device = torch.device("cuda", _current_index() if device.index is None else device.index)
    if device not in _backends:
        # Imported here: the CPU-only paths never load the CUDA backend.
        from benchbatch.runtime.cuda import CudaBackend

        _backends[device] = CudaBackend(device) if device.type == "cuda" else CpuBackend(device)
    return _backends[device]


@contextlib.contextmanager
def use(backend: Backend) -> Iterator[Backend]:
    """Every device gets `backend` inside the block (tests: a fake CUDA on the CPU)."""
    global _override
    previous, _override = _override, backend
    try:
        yield backend
    finally:
        _override = previous


def release_calls(calls) -> None:
    """A timing group is done: each replay among its calls frees its graph and the tensors
    it kept alive for it (benchbatch.runtime.cuda.Replay); eager calls free theirs when dropped."""
    for call in calls:
        release = getattr(call, "release", None)
        if callable(release):
            release()


def _current_index() -> int:
    """'cuda' without an index means torch's current device."""
    try:
        return torch.cuda.current_device()
    except (AssertionError, RuntimeError):  # a torch without CUDA: nothing runs there anyway
        return 0


class CpuBackend:
    """The host runs the work itself: its clock is the device clock, nothing is queued,
    and there is no graph to capture or cache to flush between repeats."""

    graphs = False
    queued = False
    flush_error = None

    def __init__(self, device: torch.device):
        self.device = device

    def activate(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def make_current(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def timer(self) -> HostTimer:
        return HostTimer()

    def flusher(self) -> Callable[[], object] | None:
        return None

    def capture(self, fn: Callable[[], object]) -> Callable[[], object]:
        raise RuntimeError("CUDA graphs need a CUDA device")

    def free_memory(self) -> int:
        """Available RAM."""
        return available_ram_bytes()

    def release(self) -> None:
        gc.collect()

    def uuid(self) -> str | None:
        return None

    def nvml(self):
        raise ImportError("not an NVIDIA GPU")


def host_clock(threads: int, alone: bool) -> str:
    """The clock of a CPU's timed calls (HostTimer): "cpu", the calling thread's CPU time,
    with one compute thread and one rank; else "wall"."""
    return "cpu" if threads == 1 and alone else "wall"


class HostTimer:
    """The host runs the work itself (CPU): each call is timed on two clocks, the wall clock
    and the CPU clock of the thread that runs it.

    With one compute thread torch runs a call's work inline, in the calling thread, so that
    thread's CPU time is what a core spent on the call: the device's time, as CUDA events
    time a GPU's work and not the host's. The wall clock counts besides the time the thread
    waited for a core another process held: on the 2-core machines here, with three other
    processes running, a decode step took 2.2x its quiet wall time and 1.0-1.1x its quiet
    CPU time (docs/guarantees.md). With several compute threads their CPU times overlap and
    OpenMP's idle threads spin, so the wall clock is the device time there (`clock` says
    which: "cpu" or "wall"). `wall()` gives the wall times either way."""

    def __init__(self):
        self._ms: list[float] = []  # the device time of each call
        self._wall: list[float] = []
        ranks = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.clock = host_clock(torch.get_num_threads(), alone=not ranks)

    @property
    def count(self) -> int:
        return len(self._ms)

    def time(self, fn) -> None:
        if self.clock != "cpu":
            t0 = time.perf_counter()
            fn()
            self._wall.append((time.perf_counter() - t0) * 1e3)
            self._ms.append(self._wall[-1])
            return
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        c1, w1 = time.thread_time(), time.perf_counter()
        self._ms.append((c1 - c0) * 1e3)
        self._wall.append((w1 - w0) * 1e3)

    def read(self) -> tuple[list[float], list[float]]:
        """(device ms, host ms) of each call: the host's is its wall time here."""
        return list(self._ms), self.wall()

    def wall(self) -> list[float]:
        return list(self._wall)
