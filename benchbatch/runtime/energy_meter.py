"""EnergyMeter: NVML's total-energy counter (or a CPU's RAPL counters) read around a span,
for the joules per token of the rows measured in it (benchbatch/core/energy.py: the
arithmetic; runtime/telemetry.py: the NVML handles)."""

from __future__ import annotations

import time

import torch

from benchbatch.core import energy
from benchbatch.runtime import backend
from benchbatch.runtime.telemetry import handles, shutdown


class EnergyMeter:
    """A cumulative energy counter read before and after a span: on an NVIDIA GPU NVML's
    total energy (millijoules since the driver loaded, of the whole board: a MIG instance
    reads its parent GPU's), on a CPU the kernel's RAPL package counters when this process
    may read them. Neither: every span's reading is "not available" and says why. Never
    raises: a counter failing mid-run makes that span's reading unavailable.

    with meter.span() as span: ...  then span.reading (a core.energy.Reading)."""

    def __init__(self, device: torch.device, rapl_root=energy.RAPL_ROOT):
        self._nvml = self._gpu = None
        self._zones: list[energy.RaplZone] = []
        self.reason = ""
        if device.type == "cuda":
            self._open_nvml(device)
            self.source = f"NVML total energy ({device})"
        else:
            self._zones, why = energy.rapl_zones(rapl_root)
            names = ", ".join(z.name for z in self._zones)
            self.source = f"RAPL {names}" if self._zones else ""
            self.reason = why or ""
        if self.reason:
            self.source = energy.unavailable(self.reason)

    def _open_nvml(self, device: torch.device) -> None:
        try:
            nvml = backend.of(device).nvml()
            nvml.nvmlInit()
        except ImportError:
            self.reason = "pynvml (nvidia-ml-py) is not installed"
            return
        except Exception as e:  # NVMLError, a missing libnvidia-ml
            self.reason = f"NVML failed to start: {e}"
            return
        try:
            _own, self._gpu = handles(nvml, device)
            nvml.nvmlDeviceGetTotalEnergyConsumption(self._gpu)  # Volta and later only
        except Exception as e:
            shutdown(nvml)
            self.reason = f"this GPU or driver has no total-energy counter ({e})"
            return
        self._nvml = nvml

    @property
    def available(self) -> bool:
        return not self.reason

    def _snapshot(self):
        """The counter now: NVML's in joules (its zero is arbitrary: only differences
        count), or each RAPL zone's microjoules (each wraps on its own)."""
        if self._nvml is not None:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._gpu) / 1e3
        return energy.read_rapl_uj(self._zones)

    def _joules(self, before, after) -> float:
        if self._nvml is not None:
            return after - before  # NVML's 64-bit millijoule counter does not wrap
        return energy.rapl_joules(self._zones, before, after)

    def span(self) -> _Span:
        return _Span(self)

    def start(self) -> None:
        """Start a lap: the next lap() reads from now."""
        self._lap = (self._safe_snapshot(), _Span.clock())

    def lap(self) -> energy.Reading:
        """The reading since start() or the last lap(); the next lap starts now (for runs
        that follow one another, as serve-sweep's real engine points do)."""
        if not hasattr(self, "_lap"):
            self.start()
        before, t0 = self._lap
        after, t1 = self._safe_snapshot(), _Span.clock()
        self._lap = (after, t1)
        return self.reading(before, after, t1 - t0)

    def _safe_snapshot(self):
        if not self.available:
            return None
        try:
            return self._snapshot()
        except Exception:  # a read failing mid-run: that span has no energy
            return None

    def reading(self, before, after, seconds: float) -> energy.Reading:
        """A span's Reading from the counter's values at its ends (None: not read)."""
        if before is None or after is None:
            why = "the counter could not be read" if self.available else self.reason
            return energy.Reading(None, seconds, energy.unavailable(why))
        try:
            return energy.Reading(self._joules(before, after), seconds, self.source)
        except ValueError as e:  # a counter reset mid-span
            return energy.Reading(None, seconds, energy.unavailable(str(e)))

    def describe(self) -> dict:
        """For metadata: which counter, or why none."""
        return {"available": self.available, "source": self.source}

    def close(self) -> None:
        if self._nvml is not None:
            shutdown(self._nvml)
            self._nvml = None


class _Span:
    """One measured span of an EnergyMeter: its reading once the `with` block ends."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, meter: EnergyMeter):
        self.meter = meter
        self.reading: energy.Reading | None = None

    def __enter__(self) -> _Span:
        self._before = self.meter._safe_snapshot()
        self._start = self.clock()
        return self

    def __exit__(self, *exc) -> None:
        seconds = self.clock() - self._start
        self.reading = self.meter.reading(self._before, self.meter._safe_snapshot(), seconds)
