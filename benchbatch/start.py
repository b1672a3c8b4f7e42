"""The program's first lines (`benchbatch` and `python -m benchbatch`): before anything heavy
is imported, Ctrl-C and SIGTERM end the process with one line and exit code 130 instead of
a traceback from the middle of an import, and the terminal's encoding can no longer turn a
finished run into a traceback. Kept free of imports beyond the standard library's few.
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


# True once prepare() ran: this process is the command line, not a library user (tests),
# so signals may be ignored for good once the exit code is decided.
AS_PROGRAM = False


def prepare() -> None:
    """Signals and output streams as the command line wants them."""
    global AS_PROGRAM
    AS_PROGRAM = True
    signal.signal(signal.SIGTERM, _raise_interrupt)  # a scheduler's kill, as Ctrl-C
    signal.signal(signal.SIGINT, _raise_interrupt)  # even where the shell ignored it
    if hasattr(signal, "SIGXFSZ"):  # past a file size limit: a failed write, not a core dump
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        try:  # an ASCII-only terminal gets \u escapes, never a UnicodeEncodeError
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass


def main() -> None:
    try:
        prepare()
        from benchbatch.cli import main as run
    except KeyboardInterrupt:
        _ignore()
        sys.stderr.write("interrupted while starting: nothing was run or written\n")
        exit_interrupted()
    try:
        run()
    except KeyboardInterrupt:  # outside the command's own handling (typer building it)
        _ignore()
        from benchbatch.cli import interrupted

        interrupted(None)
        exit_interrupted()


def exit_interrupted() -> None:
    """Exit with code 130 now. Not through sys.exit: CPython 3.11 remembers a Ctrl-C that
    interrupted code run from a string (a dataclass being made, a type hint evaluated), even
    one handled since, and at exit kills itself with SIGINT instead (exit -2, not 130).
    Everything is written by now; the streams are flushed here."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(INTERRUPTED)


def _ignore() -> None:
    """Exiting now: a second Ctrl-C cannot change how."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
