"""A snapshot of an NVIDIA GPU's state through NVML (pynvml, from nvidia-ml-py).

Taken before and after a run so a reader can tell a throttled or hot GPU from a slow one,
and, through ThrottleWatch, after every row. Anything missing (no driver, no pynvml, NVML
failing) yields {"available": False, ...} or "not throttled", never an exception:
telemetry must not stop a measurement.
"""

from __future__ import annotations

import torch

# Clock-event reason bits (nvml.h); these mean the GPU slowed itself down.
SLOWDOWN_REASONS = {
    0x0000000000000002: "applications_clocks_setting",
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}
OTHER_REASONS = {0x0000000000000001: "gpu_idle", 0x0000000000000010: "sync_boost"}
THROTTLING = {
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}


def snapshot(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"available": False, "reason": "not an NVIDIA GPU"}
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "pynvml (nvidia-ml-py) is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError, or a missing libnvidia-ml
        return {"available": False, "reason": f"NVML failed to start: {e}"}
    try:
        return _read(pynvml, _handle(pynvml, device))
    except Exception as e:
        return {"available": False, "reason": f"NVML query failed: {e}"}
    finally:
        _shutdown(pynvml)


def _handle(nvml, device: torch.device):
    """NVML's handle of torch's GPU: by UUID (NVML does not see CUDA_VISIBLE_DEVICES),
    else by index."""
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:
        return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)


def _read(nvml, h) -> dict:
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    return {
        "available": True,
        "name": _text(nvml.nvmlDeviceGetName(h)),
        "driver": _text(nvml.nvmlSystemGetDriverVersion()),
        "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
        "memory_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM),
        "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000,
        "power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        "clock_event_reasons": decode_reasons(reasons),
    }


def decode_reasons(mask: int) -> list[str]:
    names = {**SLOWDOWN_REASONS, **OTHER_REASONS}
    return [name for bit, name in names.items() if mask & bit]


def throttled(snap: dict) -> bool:
    """Did this snapshot catch a thermal or power slowdown?"""
    return bool(THROTTLING & set(snap.get("clock_event_reasons", [])))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# Nanoseconds each slowdown has held the clocks down since the driver loaded (NVML field
# values, drivers 535 and later): a counter that grew during a row means the row was slowed.
SLOWDOWN_COUNTERS = (
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
)


class ThrottleWatch:
    """Did the GPU slow itself down (thermal or power) since the last look? One NVML session
    per run, a few microseconds a look. Not a GPU, or no NVML: every look says False."""

    def __init__(self, device: torch.device):
        self._nvml = self._gpu = self._last = None
        if device.type == "cuda":
            self._open(device)

    def _open(self, device: torch.device) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # ImportError, NVMLError, a missing libnvidia-ml
            return
        try:
            self._gpu = _handle(pynvml, device)
        except Exception:
            _shutdown(pynvml)
            return
        self._nvml = pynvml
        self._last = self._counters()

    def throttled(self) -> bool:
        """A slowdown counter grew since the last look, or a slowdown reason holds now."""
        if self._nvml is None:
            return False
        now = self._counters()
        grew = None not in (now, self._last) and any(
            a > b for a, b in zip(now, self._last, strict=True)
        )
        self._last = now
        return grew or self._slowed_now()

    def _counters(self) -> tuple[int, ...] | None:
        try:
            ids = [getattr(self._nvml, name) for name in SLOWDOWN_COUNTERS]
            values = self._nvml.nvmlDeviceGetFieldValues(self._gpu, ids)
            if any(v.nvmlReturn != 0 for v in values):
                return None  # an older driver: the reasons of the moment will do
            return tuple(int(v.value.ullVal) for v in values)
        except Exception:
            return None

    def _slowed_now(self) -> bool:
        try:
            mask = self._nvml.nvmlDeviceGetCurrentClocksEventReasons(self._gpu)
        except Exception:
            return False
        return throttled({"clock_event_reasons": decode_reasons(mask)})

    def close(self) -> None:
        if self._nvml is not None:
            _shutdown(self._nvml)
            self._nvml = None

    def __enter__(self) -> ThrottleWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass
