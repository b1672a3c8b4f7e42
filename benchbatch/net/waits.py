"""How long a thread waited for a core: runnable, not running, as Linux's schedstat counts it.

A client's stamps are only as early as its thread: on a machine whose cores a server and other
processes keep busy, the thread may wait for a core while chunks sit in its socket, then read
them together. net/client.py reads this around each request and over each run, so the
stamps say how late they may be, measured by the kernel. Elsewhere than Linux: NaN.
"""

from __future__ import annotations

import math
import os
import threading

from benchbatch.errors import UserError

# This thread's nanoseconds on a CPU, waiting runnable for one, and timeslices (Linux).
SCHEDSTAT = "/proc/thread-self/schedstat"
# --client-realtime: the client's thread under SCHED_FIFO at this priority (1-99; low: it
# sleeps on its sockets, and the kernel keeps 5% of each second for the rest by default).
REALTIME_PRIORITY = 10


def realtime(option: str = "client_realtime") -> None:
    """Put the calling thread under SCHED_FIFO (REALTIME_PRIORITY): it then runs as soon as
    a chunk wakes it, ahead of every ordinary process. A UserError naming the option where
    the OS does not have it or does not allow it (Linux: root or CAP_SYS_NICE)."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_FIFO"):
        raise UserError(option, "needs Linux's real-time scheduling (SCHED_FIFO)")
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    except OSError as e:
        raise UserError(
            option,
            f"cannot set real-time priority here ({e.strerror}): run as root, or give "
            "python CAP_SYS_NICE (setcap cap_sys_nice+ep), or leave the option out",
        ) from None


def check_realtime(option: str = "client_realtime") -> None:
    """realtime() tried on a thread of its own, which then ends: the UserError before a run,
    not in its middle."""
    failed: list[UserError] = []

    def attempt() -> None:
        try:
            realtime(option)
        except UserError as e:
            failed.append(e)

    t = threading.Thread(target=attempt, name="benchbatch-realtime-check")
    t.start()
    t.join()
    if failed:
        raise failed[0]


class CoreWaits:
    """The calling thread's time waiting for a core so far (seconds, runnable but not
    running: the second field of its SCHEDSTAT), one pread a reading (the file opened once,
    on the thread it measures); NaN where the OS does not say."""

    def __init__(self, path: str = SCHEDSTAT):
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self.fd = None

    def now(self) -> float:
        if self.fd is None:
            return math.nan
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return math.nan

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
