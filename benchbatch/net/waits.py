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
# --client-priority realtime (and auto, where allowed): the client's thread under SCHED_FIFO
# at this priority (1-99; low: it sleeps on its sockets, and the kernel keeps 5% of each
# second for the rest by default).
REALTIME_PRIORITY = 10
PRIORITIES = ("auto", "realtime", "normal")


def _fifo() -> str | None:
    """The calling thread put under SCHED_FIFO (REALTIME_PRIORITY): None, or why not."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_FIFO"):
        return "no SCHED_FIFO on this OS"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    except OSError as e:
        return e.strerror or str(e)
    return None


def realtime(option: str = "client_priority") -> None:
    """Put the calling thread under SCHED_FIFO (REALTIME_PRIORITY): it then runs as soon as
    a chunk wakes it, ahead of every ordinary process. A UserError naming the option where
    the OS does not have it or does not allow it (Linux: root or CAP_SYS_NICE)."""
    why = _fifo()
    if why is not None:
        raise UserError(option, _refused(why))


def _refused(why: str) -> str:
    return (
        f"cannot set real-time priority here ({why}): run as root, or give python "
        "CAP_SYS_NICE (setcap cap_sys_nice+ep), or ask for auto or normal"
    )


def priority(asked: str, option: str = "client_priority") -> tuple[str, str | None]:
    """The client's priority for `asked` (one of PRIORITIES), tried on a thread of its own
    that then ends (the caller's priority untouched; a refusal before a run, not in its
    middle): ("realtime", None) where realtime or auto was asked for and allowed; ("normal",
    why) where auto was refused, why the OS's reason; ("normal", None) for normal. realtime
    refused: a UserError naming the option."""
    if asked == "normal":
        return "normal", None
    why: list[str | None] = []
    t = threading.Thread(target=lambda: why.append(_fifo()), name="benchbatch-realtime-check")
    t.start()
    t.join()
    if why[0] is None:
        return "realtime", None
    if asked == "realtime":
        raise UserError(option, _refused(why[0]))
    return "normal", why[0]


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
