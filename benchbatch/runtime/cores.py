"""Which cores the served model's thread and the HTTP loop run on (`benchbatch serve`): the
CPUs split between them, the least busy ones for the model where another process holds
some (Linux /proc/stat), and the calling thread pinned (os.sched_setaffinity, Linux). No
torch here: runtime/live.py and net/server.py apply the plan."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from benchbatch.core.machine import usable_cpus


@dataclass(frozen=True)
class CorePlan:
    """The model thread's torch threads and cores, the HTTP loop's cores (None: not
    pinned), and why."""

    threads: int
    model_cores: tuple[int, ...] | None
    http_cores: tuple[int, ...] | None
    why: str

    def row(self) -> dict:
        cores = lambda c: None if c is None else list(c)  # noqa: E731
        return {"threads": self.threads, "model_cores": cores(self.model_cores),
                "http_cores": cores(self.http_cores), "pinning": self.why}  # fmt: skip


def cpu_busy(cpus: Sequence[int] | None, seconds: float = 0.3) -> dict[int, float] | None:
    """Each CPU's busy fraction over the next `seconds`, every process's work counted (Linux
    /proc/stat); None where the platform cannot say. On a shared machine another process
    pinned to one core (every benchbatch run pins its compute thread to the last one) makes
    that core the wrong one for the model thread: the issue-26 peer measured the served
    model's steps 2-3x slower there than on the other core."""
    if not cpus:
        return None
    try:
        first = _cpu_ticks()
        time.sleep(seconds)
        last = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        return None
    busy = {}
    for cpu in cpus:
        if cpu not in first or cpu not in last:
            return None
        (b0, t0), (b1, t1) = first[cpu], last[cpu]
        busy[cpu] = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
    return busy


def _cpu_ticks() -> dict[int, tuple[int, int]]:
    """(busy, total) ticks of each CPU so far, from /proc/stat (idle and iowait not busy)."""
    ticks = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                values = [int(v) for v in fields[:8]]
                total = sum(values)
                ticks[int(name[3:])] = (total - values[3] - values[4], total)
    return ticks


def plan_cores(
    threads: int | None,
    pin: bool = True,
    cpus: Sequence[int] | None = None,
    busy: dict[int, float] | None = None,
) -> CorePlan:
    """Split the CPUs (default: the calling thread's): the model thread the last ones (as
    many as its threads, leaving at least one; the system's own work lands on CPU 0 first),
    the HTTP loop the rest. threads: torch's threads on the model thread (default: every
    CPU but the HTTP loop's one). busy (cpu_busy's): the model thread takes the least busy
    CPUs instead (busy fractions rounded to tenths), the first ones among equals: every
    benchbatch run pins its compute thread to the last cores, so on a machine shared with
    others the last are where they come and go (vLLM's CPU worker takes the first cores
    too, leaving the last to its front end). Logical CPUs: two hyperthreads count as two."""
    have = sorted(cpus) if cpus is not None else usable_cpus()
    n = len(have) if have else (os.cpu_count() or 1)
    chosen = threads if threads is not None else max(1, n - 1)
    if not pin:
        return CorePlan(chosen, None, None, "not pinned (--no-pin)")
    if have is None or not hasattr(os, "sched_setaffinity"):
        return CorePlan(chosen, None, None, "not pinned: the platform has no sched_setaffinity")
    if n < 2:
        return CorePlan(chosen, None, None, "not pinned: one CPU to run on")
    k = min(chosen, n - 1)
    order = have
    if busy is not None and all(c in busy for c in have):  # the busiest first, the model last
        order = sorted(have, key=lambda c: (-round(10 * busy[c]), -have.index(c)))
    model, http = tuple(sorted(order[n - k :])), tuple(sorted(order[: n - k]))
    ids = lambda cs: " ".join(map(str, cs))  # noqa: E731
    why = f"model thread on CPU {ids(model)}, HTTP loop on CPU {ids(http)}"
    if order is not have:
        pct = lambda cs: "/".join(f"{100 * busy[c]:.0f}%" for c in cs)  # noqa: E731
        why += f" (the least busy, the first among equals: {pct(model)} against {pct(http)})"
    if chosen > k:
        why += f" ({chosen} torch threads share the model's {k} CPU(s))"
    return CorePlan(chosen, model, http, why)


def pin_this_thread(cores: Collection[int] | None) -> None:
    """Bind the calling thread (pid 0 is the caller on Linux) to these cores."""
    if cores:
        os.sched_setaffinity(0, set(cores))
