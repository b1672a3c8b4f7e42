"""The machine itself, without torch: the CPU's name, its load, its memory, installed versions.

A simulation-only run records these too, without paying for importing torch.
"""

from __future__ import annotations

import os
import platform
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
    """An installed package's version, read without importing it."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
