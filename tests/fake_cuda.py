"""A fake torch.cuda for CPU tests of benchbatch's CUDA backend (benchbatch/runtime/cuda.py).

It runs no GPU code, but keeps torch's documented semantics for every call the backend
makes, and records which device and stream each call used:

- a current device (device(i) sets it inside a block, set_device for good) and a current
  stream per device; Stream(None), Event.record(None), synchronize(None) and the side
  stream torch.cuda.graph makes when given none all follow the *current* device;
- each device has a clock (ms of work it has run); `launch(ms, device)` is a kernel on
  that device, whatever device is current (torch runs a tensor's kernels on its own
  device), and inside `kernels_on(device, ms)` every aten op the CPU runs is a kernel of
  `ms` on that device (the model's work, as the GPU would see it); an event reads the
  clock of the device it was recorded on, and elapsed_time refuses events that device
  has not been synchronized past ("device not ready");
- the host has a clock of its own (`host_clock`, seconds; `host_work(ms)` is the host
  busy enqueueing): nothing starts on a device before the host has launched it, so a
  device whose host is slower than its kernels idles, as a starved GPU does;
- graph capture records the aten ops the captured call runs (a TorchDispatchMode), refuses
  host reads of device values while capturing, and a replay runs the recorded ops again
  on the same tensors, with every Python-side value frozen, as a CUDA graph replays its
  kernels. Unlike a real capture, the capture pass also runs the ops once;
- like a real CUDAGraph, a graph owns only the memory its capture allocated (its pool):
  the tensors the captured call reads or writes that were made outside the capture (a KV
  cache, tokens) are held by weak references, so a replay after they died raises, as a
  real replay reads freed memory (an illegal address, or another tensor's bytes);
- inside `kernels_on`, every tensor an op allocates goes through a caching allocator: a
  freed tensor's block is kept (reserved) and handed to the next allocation that fits,
  and `empty_cache` gives back the blocks nothing owns (`memory_allocated`,
  `memory_reserved`, `reused` count them).
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten
# Ops that read a device value on the host: a CUDA stream being captured refuses them.
HOST_READS = {
    aten.item.default,
    aten._local_scalar_dense.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
}


class FakeCuda:
    OutOfMemoryError = torch.cuda.OutOfMemoryError

    def __init__(self, devices: int = 2, l2_bytes: int = 1 << 20, uuids=None):
        self.count, self.l2_bytes = devices, l2_bytes
        self.uuids = uuids or [f"{i:08x}-0000-0000-0000-000000000000" for i in range(devices)]
        self.free_bytes, self.total_bytes = 3 << 30, 4 << 30
        self.calls: list[tuple] = []  # (call, device index, stream name)
        self.clock = [0.0] * devices
        self.replay_ms = 0.0  # device time one replay takes
        self.fail_captures: set[int] = set()  # capture numbers (1 = first) that run out
        self.captures: list[SimpleNamespace] = []  # number, device, ops: no tensors kept
        self._current = 0
        self._names = itertools.count(1)
        self._streams = [FakeStream(i, f"default{i}") for i in range(devices)]
        self._capture_stream: FakeStream | None = None  # torch.cuda.graph's own, made once
        self._recorded = [0] * devices
        self._done = [0] * devices
        self.allocated = self.reserved = 0  # bytes of live tensors; of blocks held
        self.cached: list[int] = []  # sizes of freed blocks the allocator keeps
        self.reused = 0  # allocations served from a freed block
        self.host_ms = 0.0  # the host's own clock (advanced by host_work and records)
        self.record_ms = 0.0  # host time an Event.record costs (a real one: microseconds)

    # --- devices and streams ---------------------------------------------------------------

    def _index(self, device) -> int:
        if device is None:
            return self._current
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            return self._current if device.index is None else device.index
        return int(device)

    def current_device(self) -> int:
        return self._current

    def set_device(self, device) -> None:
        self._current = self._index(device)
        self.calls.append(("set_device", self._current, None))

    @contextlib.contextmanager
    def device(self, device):
        previous, self._current = self._current, self._index(device)
        self.calls.append(("device", self._current, None))
        try:
            yield
        finally:
            self._current = previous

    def current_stream(self, device=None) -> FakeStream:
        return self._streams[self._index(device)]

    def Stream(self, device=None, priority: int = 0) -> FakeStream:  # noqa: N802 (torch's name)
        s = FakeStream(self._index(device), f"side{next(self._names)}")
        self.calls.append(("Stream", s.index, s.name))
        return s

    @contextlib.contextmanager
    def stream(self, s: FakeStream):
        """torch.cuda.stream: s is its device's current stream, and its device current."""
        previous_device, previous_stream = self._current, self._streams[s.index]
        self._current, self._streams[s.index] = s.index, s
        self.calls.append(("stream", s.index, s.name))
        try:
            yield
        finally:
            self._current, self._streams[s.index] = previous_device, previous_stream

    def synchronize(self, device=None) -> None:
        i = self._index(device)
        self._done[i] = self._recorded[i]
        self.host_ms = max(self.host_ms, self.clock[i])  # the host waited for the device
        self.calls.append(("synchronize", i, None))

    # --- events, graphs, memory ------------------------------------------------------------

    def Event(self, enable_timing: bool = False, **kwargs) -> FakeEvent:  # noqa: N802
        return FakeEvent(self, enable_timing)

    def CUDAGraph(self) -> FakeGraph:  # noqa: N802
        return FakeGraph(self)

    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        return FakeCapture(self, cuda_graph, stream)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        self.calls.append(("mem_get_info", self._index(device), None))
        return self.free_bytes, self.total_bytes

    def get_device_properties(self, device):
        i = self._index(device)
        return SimpleNamespace(
            name=f"Fake GPU {i}", L2_cache_size=self.l2_bytes, uuid=self.uuids[i]
        )

    def empty_cache(self) -> None:
        """Give back every cached block: the ones no live tensor owns."""
        self.reserved -= sum(self.cached)
        self.cached.clear()
        self.calls.append(("empty_cache", self._current, None))

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def memory_reserved(self, device=None) -> int:
        return self.reserved

    def _allocate(self, t: torch.Tensor) -> None:
        """A new tensor's block: a freed one that fits when there is one (the allocator
        hands freed memory back out), else a new one; freed when the tensor dies."""
        size = t.untyped_storage().nbytes()
        fits = [b for b in self.cached if b >= size]
        if fits:
            block = min(fits)
            self.cached.remove(block)
            self.reused += 1
        else:
            block = size
            self.reserved += block
        self.allocated += block
        weakref.finalize(t, self._free, block)

    def _free(self, block: int) -> None:
        self.allocated -= block
        self.cached.append(block)

    # --- work ------------------------------------------------------------------------------

    def launch(self, ms: float, device: int) -> None:
        """A kernel running `ms` on `device`, once the device is free and the host has
        launched it (an idle device waits for the host)."""
        self.clock[device] = max(self.clock[device], self.host_ms) + ms

    def host_work(self, ms: float) -> None:
        """The host spends `ms` (enqueueing, Python) before its next launch."""
        self.host_ms += ms

    def host_clock(self) -> float:
        """The host's time in seconds: CudaBackend(host_clock=...) times enqueues by it."""
        return self.host_ms / 1e3

    @contextlib.contextmanager
    def kernels_on(self, device: int, ms: float):
        """Every aten op run inside the block is a kernel of `ms` on `device`."""
        with _OpClock(self, device, ms):
            yield

    def called(self, name: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == name]


class FakeStream:
    def __init__(self, index: int, name: str):
        self.index, self.name = index, name
        self.device = torch.device("cuda", index)
        self.waited_for: list[str] = []

    def wait_stream(self, other: FakeStream) -> None:
        self.waited_for.append(other.name)


class FakeEvent:
    def __init__(self, api: FakeCuda, enable_timing: bool):
        self.api, self.enable_timing = api, enable_timing
        self.stream: FakeStream | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        api = self.api
        stream = stream if stream is not None else api.current_stream()
        if self.stream is not None and self.stream.index != stream.index:
            raise RuntimeError("an event is recorded by streams of one device only")
        api._recorded[stream.index] += 1
        api.host_ms += api.record_ms
        self.stream, self.seq = stream, api._recorded[stream.index]
        # The device reaches the event once its queue is done and the host has recorded it.
        api.clock[stream.index] = max(api.clock[stream.index], api.host_ms)
        self.at = api.clock[stream.index]
        api.calls.append(("record", stream.index, stream.name))

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("events were created without enable_timing")
        if self.stream is None or end.stream is None:
            raise RuntimeError("an event was not recorded")
        if self.stream.index != end.stream.index:
            raise RuntimeError("events of two devices")
        if self.api._done[end.stream.index] < max(self.seq, end.seq):
            raise RuntimeError("CUDA error: device not ready")
        return end.at - self.at


class FakeGraph:
    def __init__(self, api: FakeCuda):
        self.api, self.ops, self.number, self.index = api, [], None, None

    def replay(self) -> None:
        if self.number is None:
            raise RuntimeError("replay of a graph that was never captured")
        self.api.calls.append(("replay", self.index, f"graph{self.number}"))
        with torch.inference_mode():
            for func, args, kwargs, out in self.ops:
                args, kwargs, out = _resolve((args, kwargs, out))
                _write_back(out, func(*args, **kwargs), tree_leaves((args, kwargs)))
        self.api.clock[self.index] += self.api.replay_ms

    def reset(self) -> None:
        """CUDAGraph.reset: the graph and its pool are gone."""
        self.ops, self.number = [], None


class _Weak:
    """A tensor the captured call used that the graph does not own: a weak reference to
    the tensor it was (or, for a view made while capturing, the tensor owning its memory)
    and where it lies in that tensor's storage."""

    def __init__(self, owner: torch.Tensor, t: torch.Tensor):
        self.owner = weakref.ref(owner)
        self.same = owner is t
        self.where = (t.size(), t.stride(), t.storage_offset())

    def get(self) -> torch.Tensor:
        owner = self.owner()
        if owner is None:
            raise RuntimeError(
                "CUDA error: an illegal memory access was encountered "
                "(a replayed graph's input was freed after capture)"
            )
        if self.same:
            return owner
        with _no_modes():
            return owner.as_strided(*self.where)


def _no_modes():
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def _resolve(tree):
    """The recorded values with every weak tensor looked up (raises if one died)."""
    return tree_map(lambda x: x.get() if isinstance(x, _Weak) else x, tree,
                    is_leaf=lambda x: isinstance(x, _Weak))  # fmt: skip


def _write_back(recorded, fresh, inputs) -> None:
    """Put a replayed op's results where the capture's outputs live (a graph's outputs stay
    at their addresses); views and in-place results are already there."""
    for old, new in zip(tree_leaves(recorded), tree_leaves(fresh), strict=True):
        if not isinstance(old, torch.Tensor):
            continue
        storage = old.untyped_storage().data_ptr()
        if not any(
            isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == storage
            for t in inputs
        ):
            old.copy_(new)


class _OpClock(TorchDispatchMode):
    def __init__(self, api: FakeCuda, device: int, ms: float):
        super().__init__()
        self.api, self.device, self.ms = api, device, ms

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.api.clock[self.device] += self.ms
        out = func(*args, **(kwargs or {}))
        used = {_storage(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            # Only a result in memory no input has is an allocation (not a view or in-place).
            if isinstance(t, torch.Tensor) and t._base is None and _storage(t) not in used:
                if t.untyped_storage().nbytes() > 0:
                    self.api._allocate(t)
        return out


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Recorder(TorchDispatchMode):
    """Records each op; tensors in memory made outside the capture are kept weakly (the
    graph does not own them), tensors the capture allocated strongly (its pool)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.outside: dict[int, weakref.ref] = {}  # storage address: a tensor owning it
        self.pool: set[int] = set()  # storages the capture allocated

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise RuntimeError("operation not permitted when stream is capturing")
        out = func(*args, **kwargs)
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and _storage(t) not in self.pool:
                self.outside.setdefault(_storage(t), weakref.ref(t))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and _storage(t) not in self.outside:
                self.pool.add(_storage(t))
        self.ops.append((func, *self._weak((args, kwargs, out))))
        return out

    def _weak(self, tree):
        def weak(t):
            if not isinstance(t, torch.Tensor) or _storage(t) == 0:
                return t  # no memory to lose
            owner = self.outside.get(_storage(t))
            owner = owner() if owner is not None else None
            return t if owner is None else _Weak(owner, t)

        return tree_map(weak, tree)


class FakeCapture:
    """torch.cuda.graph(g, stream=...): synchronize, empty the cache, capture on `stream`
    (or on a side stream made once on the current device)."""

    def __init__(self, api: FakeCuda, graph: FakeGraph, stream: FakeStream | None):
        if stream is None:
            if api._capture_stream is None:
                api._capture_stream = api.Stream()
            stream = api._capture_stream
        self.api, self.graph, self.stream = api, graph, stream

    def __enter__(self):
        api = self.api
        api.synchronize()
        api.empty_cache()
        self._stream = api.stream(self.stream)
        self._stream.__enter__()
        self.graph.number, self.graph.index = len(api.captures) + 1, self.stream.index
        api.captures.append(SimpleNamespace(number=self.graph.number, device=self.graph.index))
        api.calls.append(("capture", self.stream.index, self.stream.name))
        self._recorder = _Recorder()
        self._recorder.__enter__()

    def __exit__(self, *exc):
        self._recorder.__exit__(*exc)
        self._stream.__exit__(*exc)
        self.graph.ops = self._recorder.ops
        self.api.captures[-1].ops = len(self.graph.ops)
        if exc[0] is None and self.graph.number in self.api.fail_captures:
            # A capture that runs out of memory fails again when it ends; that second
            # error is the one torch raises.
            try:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
            except torch.cuda.OutOfMemoryError:
                raise RuntimeError(  # noqa: B904 (the chain is what torch gives)
                    "CUDA error: operation failed due to a previous error during capture"
                )
        return False
