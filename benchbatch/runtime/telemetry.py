"""A snapshot of an NVIDIA GPU's state through NVML (pynvml, from nvidia-ml-py).

Taken before and after a run so a reader can tell a throttled or hot GPU from a slow one,
and, through ThrottleWatch, after every row. Anything missing (no driver, no pynvml, NVML
failing) yields {"available": False, ...} or "not slowed", never an exception: telemetry
must not stop a measurement. Each field is read on its own: a field this GPU or driver
does not support (NotSupported, an older driver without the call) is left out and named
in "missing", and the rest is still reported.

Two kinds of slowdown are told apart. Software power capping (the board holds its power
limit) is routine on Hopper under matmul load: rows measured meanwhile are `power_capped`.
Thermal slowdowns and hardware slowdowns (power brake, HW slowdown) are not routine: those
rows are `throttled`.

EnergyMeter (runtime/energy_meter.py) reads NVML's total-energy counter through the same
handles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from benchbatch.runtime import backend

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
POWER_CAPPING = {"sw_power_cap"}
THROTTLING = {
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}
# The reasons call was renamed in driver 535 (nvidia-ml-py 12.535); older drivers and
# bindings only have the throttle-reasons name, which returns the same bits.
REASON_CALLS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)


@dataclass(frozen=True)
class Slowdown:
    """What one look saw: a thermal or hardware slowdown, software power capping."""

    throttled: bool = False
    power_capped: bool = False

    def __or__(self, other: Slowdown) -> Slowdown:
        return Slowdown(self.throttled or other.throttled, self.power_capped or other.power_capped)


def snapshot(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"available": False, "reason": "not an NVIDIA GPU"}
    try:
        nvml = backend.of(device).nvml()
    except ImportError:
        return {"available": False, "reason": "pynvml (nvidia-ml-py) is not installed"}
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError, or a missing libnvidia-ml
        return {"available": False, "reason": f"NVML failed to start: {e}"}
    try:
        own, board = handles(nvml, device)
    except Exception as e:
        return {"available": False, "reason": f"NVML query failed: {e}"}
    else:
        return _read(nvml, own, board)
    finally:
        shutdown(nvml)


def handles(nvml, device: torch.device) -> tuple[object, object]:
    """NVML's handle of torch's device, and of the board whose clocks and power it shares
    (the same handle, or a MIG instance's parent GPU). Found by UUID: NVML numbers every
    GPU of the machine in PCI order and ignores CUDA_VISIBLE_DEVICES, while torch's
    cuda:N is the N-th visible device (fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID).
    """
    own = _own_handle(nvml, device)
    try:
        if _value(nvml.nvmlDeviceIsMigDeviceHandle(own)):
            return own, nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(own)
    except Exception:  # no MIG support in this driver or binding: a whole GPU
        pass
    return own, own


def _own_handle(nvml, device: torch.device):
    index = device.index or 0
    for uuid in _uuids(device, index):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:
            continue
    visible = _visible_devices()
    if visible is not None:
        if index >= len(visible) or not visible[index].isdigit():
            raise LookupError(f"cannot tell which GPU {device} is (CUDA_VISIBLE_DEVICES)")
        index = int(visible[index])
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _uuids(device: torch.device, index: int) -> list[str]:
    """UUIDs NVML may know this device by: torch's (a GPU's, or a MIG instance's), then
    the CUDA_VISIBLE_DEVICES entry it was picked by (GPU-... or MIG-...)."""
    found = []
    try:
        raw = backend.of(device).uuid()
    except Exception:  # no CUDA here, or a torch without the property
        raw = None
    if raw:
        bare = raw.removeprefix("GPU-").removeprefix("MIG-")
        order = ("MIG-", "GPU-") if _mig_visible() else ("GPU-", "MIG-")
        found += [prefix + bare for prefix in order]
    visible = _visible_devices()
    if visible is not None and index < len(visible):
        if visible[index].startswith(("GPU-", "MIG-")):
            found.append(visible[index])
    return found


def _visible_devices() -> list[str] | None:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _mig_visible() -> bool:
    return any(v.startswith("MIG-") for v in _visible_devices() or [])


def _read(nvml, own, board) -> dict:
    """Every field on its own: what fails is named in "missing", the rest is kept."""
    fields = {
        "name": lambda: _text(nvml.nvmlDeviceGetName(own)),
        "driver": lambda: _text(nvml.nvmlSystemGetDriverVersion()),
        "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(board, nvml.NVML_CLOCK_SM),
        "memory_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(board, nvml.NVML_CLOCK_MEM),
        "max_sm_clock_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(board, nvml.NVML_CLOCK_SM),
        "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(board) / 1000,
        "power_limit_w": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(board) / 1000,
        "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(board, nvml.NVML_TEMPERATURE_GPU),
        "clock_event_reasons": lambda: decode_reasons(reason_mask(nvml, board)),
    }
    snap: dict = {"available": True, "mig": own is not board}
    missing = {}
    for name, read in fields.items():
        try:
            snap[name] = read()
        except Exception as e:  # NotSupported, a call this driver lacks, ...
            snap[name], missing[name] = None, str(e) or type(e).__name__
    if missing:
        snap["missing"] = missing
    return snap


def reason_mask(nvml, handle) -> int:
    """The clock-event reasons bit mask, through whichever call this driver has."""
    error: Exception = LookupError("no clock-event reasons call in this pynvml")
    for name in REASON_CALLS:
        call = getattr(nvml, name, None)
        if call is None:
            continue
        try:
            return int(call(handle))
        except Exception as e:  # FunctionNotFound on a driver older than the new name
            error = e
    raise error


def decode_reasons(mask: int) -> list[str]:
    names = {**SLOWDOWN_REASONS, **OTHER_REASONS}
    return [name for bit, name in names.items() if mask & bit]


def throttled(snap: dict) -> bool:
    """Did this snapshot catch a thermal or hardware slowdown?"""
    return bool(THROTTLING & set(snap.get("clock_event_reasons") or []))


def power_capped(snap: dict) -> bool:
    """Did this snapshot catch software power capping?"""
    return bool(POWER_CAPPING & set(snap.get("clock_event_reasons") or []))


# Nanoseconds each slowdown has held the clocks down since the driver loaded (NVML field
# values): a counter that grew during a row means the row was slowed. The names NVML gave
# them, newest first; a binding or driver without one leaves that counter out.
SLOWDOWN_COUNTERS = {
    "sw_power_cap": (
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
        "NVML_FI_DEV_PERF_POLICY_POWER",
    ),
    "sw_thermal_slowdown": (
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
        "NVML_FI_DEV_PERF_POLICY_THERMAL",
    ),
    "hw_thermal_slowdown": ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",),
    "hw_power_brake_slowdown": ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",),
}
# nvmlValueType_t -> the member of nvmlValue_t that holds the value
VALUE_MEMBERS = dict(enumerate(("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")))


class ThrottleWatch:
    """Did the GPU slow itself down since the last look? One NVML session per run, a few
    microseconds a look. Not a GPU, or no NVML: every look sees no slowdown.

    look() tells thermal and hardware slowdowns (`throttled`) from software power capping
    (`power_capped`); throttled() is look().throttled. Each look consumes the counters'
    growth, so call one of them once per row."""

    def __init__(self, device: torch.device):
        self._nvml = self._gpu = None
        self._ids: dict[str, int] = {}
        self._last: dict[str, int] = {}
        if device.type == "cuda":
            self._open(device)

    def _open(self, device: torch.device) -> None:
        try:
            nvml = backend.of(device).nvml()
            nvml.nvmlInit()
        except Exception:  # ImportError, NVMLError, a missing libnvidia-ml
            return
        try:
            _own, self._gpu = handles(nvml, device)
        except Exception:
            shutdown(nvml)
            return
        self._nvml = nvml
        self._ids = self._answered_ids()
        self._last = self._counters()

    def _answered_ids(self) -> dict[str, int]:
        """Each counter's field id: the binding's constant for its newest name that this
        driver answers (a driver older than the binding refuses the new ids, 269-271, and
        answers the old PERF_POLICY ones, 74-75); counters no name of answers are left out."""
        ids = {}
        for reason, names in SLOWDOWN_COUNTERS.items():
            for field_id in (getattr(self._nvml, n) for n in names if hasattr(self._nvml, n)):
                if self._read(field_id) is not None:
                    ids[reason] = field_id
                    break
        return ids

    def _read(self, field_id: int) -> int | float | None:
        try:
            [field] = self._nvml.nvmlDeviceGetFieldValues(self._gpu, [field_id])
        except Exception:
            return None
        return field_value(field) if field.nvmlReturn == 0 else None

    def look(self) -> Slowdown:
        """A slowdown counter grew since the last look, or a slowdown reason holds now."""
        if self._nvml is None:
            return Slowdown()
        now = self._counters()
        grew = {r for r, ns in now.items() if r in self._last and ns > self._last[r]}
        self._last = now
        seen = grew | self._reasons_now()
        return Slowdown(bool(seen & THROTTLING), bool(seen & POWER_CAPPING))

    def throttled(self) -> bool:
        """A thermal or hardware slowdown since the last look (power capping is not)."""
        return self.look().throttled

    def _counters(self) -> dict[str, int]:
        """Each counter read on its own: one this GPU does not support drops only itself."""
        values = {}
        for reason, field_id in self._ids.items():
            value = self._read(field_id)
            if value is not None:
                values[reason] = value
        return values

    def _reasons_now(self) -> set[str]:
        try:
            return set(decode_reasons(reason_mask(self._nvml, self._gpu)))
        except Exception:
            return set()

    def close(self) -> None:
        if self._nvml is not None:
            shutdown(self._nvml)
            self._nvml = None

    def __enter__(self) -> ThrottleWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def field_value(field) -> int | float:
    """An nvmlFieldValue_t's value, read from the union member its valueType names."""
    member = VALUE_MEMBERS.get(getattr(field, "valueType", 3), "ullVal")
    return getattr(field.value, member)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _value(x):
    """A ctypes number's value (some pynvml calls return the ctypes object itself)."""
    return getattr(x, "value", x)


def shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass
