"""A snapshot of an NVIDIA GPU's state through NVML (pynvml, from nvidia-ml-py).

Taken before and after a run so a reader can tell a throttled or hot GPU from a slow one.
Anything missing (no driver, no pynvml, NVML failing) yields {"available": False, ...}
and never an exception: telemetry must not stop a measurement.
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
        return _read(pynvml, device.index or 0)
    except Exception as e:
        return {"available": False, "reason": f"NVML query failed: {e}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _read(nvml, index: int) -> dict:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
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
