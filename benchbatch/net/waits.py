"""How long a thread waited for a core: runnable, not running, as Linux's schedstat counts it.

A client's stamps are only as early as its thread: on a machine whose cores a server and other
processes keep busy, the thread may wait for a core while chunks sit in its socket, then read
them together. net/client.py reads this around each request and over each run, so the
stamps say how late they may be, measured by the kernel. Elsewhere than Linux: NaN.
"""

from __future__ import annotations

import math
import os

# This thread's nanoseconds on a CPU, waiting runnable for one, and timeslices (Linux).
SCHEDSTAT = "/proc/thread-self/schedstat"


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
