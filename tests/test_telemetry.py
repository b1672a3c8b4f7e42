"""NVML telemetry on a CPU, through a fake pynvml: each field read on its own, the old
throttle-reasons call on old drivers, torch's device found by UUID (CUDA_VISIBLE_DEVICES,
MIG), and software power capping told apart from throttling."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pynvml  # nvidia-ml-py, a runtime dependency: its constants are the truth here
import pytest
import torch
from fake_cuda import FakeCuda

from benchbatch.runtime import backend, telemetry
from benchbatch.runtime.cuda import CudaBackend

CPU = torch.device("cpu")
NOT_SUPPORTED = 3


class NVMLError(Exception):
    pass


class FakeNvml:
    """Two GPUs, NVML's order (PCI) the reverse of CUDA's, and a MIG instance on the second.
    `fail` names calls that raise NotSupported; `counters_fail` field ids that do."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 2, 0
    # The field ids are the installed binding's own (nvidia-ml-py), never typed-in numbers.
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP = (
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
    )
    NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = (
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    )
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = (
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    )
    NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = (
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
    )
    NVML_FI_DEV_PERF_POLICY_POWER = pynvml.NVML_FI_DEV_PERF_POLICY_POWER
    NVML_FI_DEV_PERF_POLICY_THERMAL = pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL

    def __init__(self, fail=(), old_driver=False):
        self.fail, self.old_driver = set(fail), old_driver
        self.by_uuid = {"GPU-gpu-b": "B", "GPU-gpu-a": "A", "MIG-mig-1": "B/mig1"}
        self.by_index = ["B", "A"]
        self.reasons = {"A": 0, "B": 0}
        self.ns = {"A": {}, "B": {}}
        self.counters_fail: set[int] = set()

    def _call(self, name, value):
        if name in self.fail:
            raise NVMLError("Not Supported")
        return value

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.by_uuid:
            raise NVMLError("Not Found")
        return self.by_uuid[uuid]

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.by_index[index]

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return self._call("nvmlDeviceIsMigDeviceHandle", int("/" in h))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        return h.split("/")[0]

    def nvmlDeviceGetName(self, h):
        return self._call("nvmlDeviceGetName", f"GPU {h}".encode())

    def nvmlSystemGetDriverVersion(self):
        return self._call("nvmlSystemGetDriverVersion", "570.1")

    def nvmlDeviceGetClockInfo(self, h, clock):
        if clock == self.NVML_CLOCK_MEM:
            return self._call("nvmlDeviceGetClockInfo(MEM)", 2619)
        return self._call("nvmlDeviceGetClockInfo(SM)", {"A": 1980, "B": 1755}[h])

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._call("nvmlDeviceGetMaxClockInfo", 1980)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._call("nvmlDeviceGetPowerUsage", 350_000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._call("nvmlDeviceGetEnforcedPowerLimit", 700_000)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._call("nvmlDeviceGetTemperature", 61)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", self.reasons[h])

    def __getattr__(self, name):
        if name == "nvmlDeviceGetCurrentClocksEventReasons" and not self.old_driver:
            return lambda h: self._call(name, self.reasons[h])
        raise AttributeError(name)

    def nvmlDeviceGetFieldValues(self, h, ids):
        return [
            SimpleNamespace(
                nvmlReturn=NOT_SUPPORTED if i in self.counters_fail else 0,
                valueType=3,
                value=SimpleNamespace(ullVal=self.ns[h].get(i, 0)),
            )
            for i in ids
        ]


REASON_CALLS = {
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
}
FIELDS = {  # the snapshot's field, the calls that fail it, its value on GPU "A"
    "name": ({"nvmlDeviceGetName"}, "GPU A"),
    "driver": ({"nvmlSystemGetDriverVersion"}, "570.1"),
    "sm_clock_mhz": ({"nvmlDeviceGetClockInfo(SM)"}, 1980),
    "memory_clock_mhz": ({"nvmlDeviceGetClockInfo(MEM)"}, 2619),
    "max_sm_clock_mhz": ({"nvmlDeviceGetMaxClockInfo"}, 1980),
    "power_w": ({"nvmlDeviceGetPowerUsage"}, 350.0),
    "power_limit_w": ({"nvmlDeviceGetEnforcedPowerLimit"}, 700.0),
    "temperature_c": ({"nvmlDeviceGetTemperature"}, 61),
    "clock_event_reasons": (REASON_CALLS, []),  # both names fail: the field is missing
}


def on_gpu(monkeypatch, nvml: FakeNvml, index: int = 1, uuid: str | None = "gpu-a"):
    """torch's cuda:index is the fake CUDA device with this UUID; pynvml is `nvml`."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    cuda = FakeCuda(devices=2, uuids=[uuid, uuid])
    b = CudaBackend(torch.device("cuda", index), api=cuda, alloc_device=CPU)
    return backend.use(b)


@pytest.fixture(autouse=True)
def no_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.parametrize("field", FIELDS)
def test_one_field_failing_leaves_the_rest(monkeypatch, field):
    nvml = FakeNvml(fail=FIELDS[field][0])
    with on_gpu(monkeypatch, nvml):
        snap = telemetry.snapshot(torch.device("cuda", 1))
    assert snap["available"] is True and snap[field] is None
    assert snap["missing"] == {field: "Not Supported"}
    for other, (_, value) in FIELDS.items():
        if other != field:
            assert snap[other] == value, other


def test_every_field_failing_still_gives_a_snapshot(monkeypatch):
    every_call = set().union(*(calls for calls, _ in FIELDS.values()))
    with on_gpu(monkeypatch, FakeNvml(fail=every_call)):
        snap = telemetry.snapshot(torch.device("cuda", 1))
    assert snap["available"] is True and set(snap["missing"]) == set(FIELDS)
    assert telemetry.throttled(snap) is False and telemetry.power_capped(snap) is False


@pytest.mark.parametrize("why", ["binding without the new name", "driver without it"])
def test_old_drivers_use_the_throttle_reasons_call(monkeypatch, why):
    if why == "binding without the new name":
        nvml = FakeNvml(old_driver=True)
    else:  # the binding has the name, the driver (before 535) not the function
        nvml = FakeNvml(fail={"nvmlDeviceGetCurrentClocksEventReasons"})
    nvml.reasons["A"] = 0x40 | 0x4
    with on_gpu(monkeypatch, nvml):
        snap = telemetry.snapshot(torch.device("cuda", 1))
        with telemetry.ThrottleWatch(torch.device("cuda", 1)) as watch:
            look = watch.look()
    assert snap["clock_event_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert "missing" not in snap
    assert telemetry.throttled(snap) and telemetry.power_capped(snap)
    assert look == telemetry.Slowdown(throttled=True, power_capped=True)


def test_the_device_is_found_by_uuid_not_by_index(monkeypatch):
    """cuda:1 is GPU "A", which NVML numbers 1 in PCI order... and 0 is "B": by index,
    cuda:0 would read the wrong GPU. Its UUID finds it whatever the orders."""
    with on_gpu(monkeypatch, FakeNvml(), index=0, uuid="gpu-a"):
        assert telemetry.snapshot(torch.device("cuda", 0))["name"] == "GPU A"


def test_cuda_visible_devices_names_the_gpu_when_torch_gives_no_uuid(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-gpu-a,GPU-gpu-b")
    with on_gpu(monkeypatch, FakeNvml(), index=0, uuid=None):
        assert telemetry.snapshot(torch.device("cuda", 0))["name"] == "GPU A"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # indices are NVML's (PCI) numbers
    with on_gpu(monkeypatch, FakeNvml(), index=0, uuid=None):
        assert telemetry.snapshot(torch.device("cuda", 0))["name"] == "GPU A"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-gpu-c")  # a prefix NVML cannot look up
    with on_gpu(monkeypatch, FakeNvml(), index=0, uuid=None):
        snap = telemetry.snapshot(torch.device("cuda", 0))
    assert snap["available"] is False and "CUDA_VISIBLE_DEVICES" in snap["reason"]


def test_a_mig_instance_reads_its_parent_gpus_clocks(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-mig-1")
    nvml = FakeNvml()
    nvml.reasons["B"] = 0x20  # the parent GPU slows down for heat
    with on_gpu(monkeypatch, nvml, index=0, uuid="mig-1"):
        snap = telemetry.snapshot(torch.device("cuda", 0))
        with telemetry.ThrottleWatch(torch.device("cuda", 0)) as watch:
            assert watch.throttled() is True
    assert snap["mig"] is True and snap["name"] == "GPU B/mig1"
    assert snap["sm_clock_mhz"] == 1755 and snap["clock_event_reasons"] == ["sw_thermal_slowdown"]


COUNTERS = {  # field id, and what its growth means
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: telemetry.Slowdown(power_capped=True),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: telemetry.Slowdown(throttled=True),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: telemetry.Slowdown(throttled=True),
    pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: telemetry.Slowdown(
        throttled=True
    ),
}


def test_every_counter_and_reason_name_is_in_the_installed_binding():
    """The newest name of each counter is a constant of the installed nvidia-ml-py (the
    ids are looked up by name, so a renamed constant would silently drop a counter), and
    the reason bits are the binding's own."""
    for reason, names in telemetry.SLOWDOWN_COUNTERS.items():
        assert all(hasattr(pynvml, name) for name in names), (reason, names)
    bits = {name: bit for bit, name in telemetry.SLOWDOWN_REASONS.items()}
    assert bits["sw_power_cap"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert bits["hw_slowdown"] == pynvml.nvmlClocksEventReasonHwSlowdown
    assert bits["sw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert bits["hw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert bits["hw_power_brake_slowdown"] == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown


def test_a_driver_older_than_the_binding_is_watched_through_the_old_counter_ids(monkeypatch):
    """The binding knows SW_THERM_SLOWDOWN (a new id) but the driver refuses it: the
    thermal counter is read through its old id, PERF_POLICY_THERMAL, not dropped."""
    nvml = FakeNvml()
    new = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    old = pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL
    nvml.counters_fail = {new}
    with on_gpu(monkeypatch, nvml):
        with telemetry.ThrottleWatch(torch.device("cuda", 1)) as watch:
            nvml.ns["A"][old] = 5_000_000
            assert watch.look() == telemetry.Slowdown(throttled=True)
            assert watch.look() == telemetry.Slowdown()


@pytest.mark.parametrize("broken", COUNTERS)
def test_one_counter_failing_leaves_the_others_watched(monkeypatch, broken):
    nvml = FakeNvml()
    nvml.counters_fail = {broken}
    with on_gpu(monkeypatch, nvml):
        with telemetry.ThrottleWatch(torch.device("cuda", 1)) as watch:
            for field, meaning in COUNTERS.items():
                nvml.ns["A"][field] = nvml.ns["A"].get(field, 0) + 1_000_000
                assert watch.look() == (telemetry.Slowdown() if field == broken else meaning)
            assert watch.look() == telemetry.Slowdown()  # nothing grew since
