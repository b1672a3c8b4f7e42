"""The machine itself, without torch: the CPU's name, its load, its memory, installed versions.

A simulation-only run records these too, without paying for importing torch.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from importlib import metadata


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load: another process on the cores slows every step."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def available_ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def version(package: str) -> str | None:
    """An installed package's version: the imported module's own (torch's keeps its build,
    2.13.0+cpu or 2.14.1+cu130, which some wheels' metadata drops), else read without
    importing it."""
    module = sys.modules.get(package)
    found = getattr(module, "__version__", None)
    if isinstance(found, str) and found:
        return found
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# A core is busy when the load average, per physical core, passes this: on the 2-core
# machines here two compute threads then measured 2-10x slower than one (issue 28).
BUSY_LOAD_PER_CORE = 0.5


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def core_of(cpu: int) -> tuple[str, str]:
    """(package, core) of a logical CPU, from sysfs; the CPU itself where sysfs is silent."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as f:
            package = f.read().strip()
        with open(base + "core_id") as f:
            return package, f.read().strip()
    except OSError:
        return "?", str(cpu)


def physical_cores(cpus: list[int] | None = None) -> dict[tuple[str, str], list[int]]:
    """Each physical core among `cpus` (default: this process's) and its logical CPUs:
    two hyperthreads of one core share its units, so threads are counted per core."""
    cores: dict[tuple[str, str], list[int]] = {}
    for cpu in usable_cpus() if cpus is None else cpus:
        cores.setdefault(core_of(cpu), []).append(cpu)
    return cores


def core_count() -> int:
    return max(1, len(physical_cores()))


def load_class(load: float | None, cores: int, own_threads: int = 0) -> str:
    """The load class: "busy" when other processes' load per physical core passes
    BUSY_LOAD_PER_CORE (the run's own threads, own_threads, taken off the load), "quiet"
    otherwise; "unknown" without a load average. Ceilings measured under one class are not
    used under another."""
    if load is None:
        return "unknown"
    return "busy" if max(0.0, load - own_threads) / cores > BUSY_LOAD_PER_CORE else "quiet"


# Past this, per physical core, other processes hold every core: "saturated", the busy
# class's upper part, which a calibration's conditions tell apart (a run with a core to
# spare and one with none price their steps differently).
SATURATED_LOAD_PER_CORE = 1.0


def load_level(load: float | None, cores: int, own_threads: int = 0) -> str:
    """load_class, with its "busy" split where other processes' load reaches a whole core
    per core ("saturated"): the one rule, finer, that calibrations record. "unknown"
    without a load average (None or not a number)."""
    if load is None or not math.isfinite(load):
        return "unknown"
    klass = load_class(load, cores, own_threads)
    if klass == "busy" and max(0.0, load - own_threads) / cores >= SATURATED_LOAD_PER_CORE:
        return "saturated"
    return klass


def choose_threads(cores: int, load: float | None) -> tuple[int, str]:
    """The compute threads a CPU run uses by default, and why, in one line: one on a machine
    of at most two cores or whose load says the cores are busy (one pinned thread measures
    best on a shared machine), else one per physical core the load leaves free."""
    shown = "unknown" if load is None else f"{load:.1f}"
    why = f"{cores} core{'s' if cores != 1 else ''}, load {shown}"
    tail = "--threads N to choose"
    if cores <= 2 or load_class(load, cores) == "busy":
        return 1, f"threads: 1 ({why}: one thread measures best on a shared machine; {tail})"
    free = max(1, cores - math.ceil(load or 0.0))
    return free, f"threads: {free} ({why}: one per physical core the load leaves free; {tail})"


def busy_warning(load: float | None, cores: int, threads: int, own_threads: int = 0,
                 cpu_clock: bool = True):  # fmt: skip
    """A warning when other processes compete for the cores (None when they do not), with
    what helps. With one compute thread the probes time it on its own CPU clock
    (runtime/backend.py, HostTimer), which the other processes' turns on its core do not
    stretch (their use of the caches and memory bus can); the real engine's steps and
    latencies are wall-clock and do slow down. cpu_clock False: the run's steps are on the
    wall clock all the same (several ranks on one machine)."""
    if load_class(load, cores, own_threads) != "busy":
        return None
    head = (
        f"the machine is busy: load average {load:.1f} on {cores} physical cores ("
        f"{max(0.0, load - own_threads) / cores:.1f} per core from other processes): "
    )
    if threads == 1 and not cpu_clock:
        return head + (
            "this run's steps are timed on the wall clock (several ranks share the machine, "
            "none pinned), so other processes' turns on the cores stretch them; close other "
            "work, and read each row's noise (cv, p10-p90) before trusting a difference"
        )
    if threads == 1:
        return head + (
            "timed steps count the compute thread's own CPU time, which other processes' "
            "turns on its core do not stretch (wall_ms and core_share beside them say how "
            "long it waited), though their use of the shared caches and memory bus still "
            "can (the small, memory-bound batches most); the real engine's steps and "
            "latencies are wall-clock and "
            "slower than on a quiet machine; close other work for those, and read each "
            "row's noise (cv, p10-p90) before trusting a difference"
        )
    return head + (
        "every step is slower and noisier than on a quiet machine; close other work; "
        "--threads 1 measures best on a shared machine, and read each row's noise (cv, "
        "p10-p90) before trusting a difference"
    )
