"""The program's first lines (`benchbatch` and `python -m benchbatch`): before anything heavy
is imported, Ctrl-C, SIGTERM and SIGHUP end the process with one line and exit code 130 instead of
a traceback from the middle of an import, and the terminal's encoding can no longer turn a
finished run into a traceback. Kept free of imports beyond the standard library's few.

Two places where Python itself would lose a Ctrl-C. torch, numpy, pandas and matplotlib
are imported with Ctrl-C and SIGTERM held (delivered the moment the import is done):
torch's C extension imports numpy and, when that import fails, warns and carries on, so a
KeyboardInterrupt raised inside numpy's import was lost and numpy left half-imported (the
run then failed later with `module 'numpy' has no attribute 'matrix'`, exit 1), and
pandas' turns one into an ImportError. And one that lands where Python cannot
raise it (a weakref callback) is sent again a millisecond later instead of printed as
'Exception ignored' and dropped.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import signal
import sys
import threading

INTERRUPTED = 130


# True once Ctrl-C or SIGTERM came: the exit is then made with os._exit (exit_now says why).
SIGNALLED = False


def raise_interrupt(signum, frame):
    global SIGNALLED
    SIGNALLED = True
    raise KeyboardInterrupt


# True once prepare() ran: this process is the command line, not a library user (tests),
# so signals may be ignored for good once the exit code is decided.
AS_PROGRAM = False


# The signals that end a run as Ctrl-C does: SIGTERM (a scheduler's kill, `timeout`) and
# SIGHUP (the terminal closed), where the platform has them. A SIGHUP that the process was
# started ignoring (nohup) stays ignored.
ENDING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
HELD = (signal.SIGINT, *ENDING)
# Imported with HELD signals held: their own code swallows an exception raised inside them,
# or turns it into another. torch's; and a C extension of pandas' that imports numpy's C API
# turns a KeyboardInterrupt inside that import into "ImportError: numpy._core.multiarray
# failed to import" (a SIGTERM at the wrong instant of `phases` did, exit 1 and a traceback);
# numpy and matplotlib load C extensions the same way.
HELD_IMPORTS = ("torch", "numpy", "pandas", "matplotlib")


@contextlib.contextmanager
def signals_held():
    """Hold Ctrl-C and SIGTERM back for something that must finish (a few milliseconds of
    writing, an import): one that comes meanwhile is delivered as soon as it is done, not
    lost. Outside the main thread (where no handler can be set) nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    saved = {s: signal.signal(s, lambda n, f: pending.append(n)) for s in HELD}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    """builtins.__import__, with HELD_IMPORTS' first import made with signals held: a signal
    that came meanwhile is raised by the import statement once the module is whole (raised
    inside the module's own code, the import machinery would drop the half-run module)."""
    root = name.partition(".")[0]
    if level == 0 and root in HELD_IMPORTS and root not in sys.modules:
        with signals_held():
            try:
                return _IMPORT(name, globals, locals, fromlist, level)
            except ValueError as e:  # torch refuses a TORCH_LOGS it cannot parse, at import
                if "TORCH_LOGS" not in str(e) or "TORCH_LOGS" not in os.environ:
                    raise
                from benchbatch.errors import UserError

                raise UserError("TORCH_LOGS", f"torch refuses {os.environ['TORCH_LOGS'][:80]!r} "
                                "(a comma-separated list of its log names; TORCH_LOGS=help "
                                "lists them)") from None  # fmt: skip
    return _IMPORT(name, globals, locals, fromlist, level)


_IMPORT = builtins.__import__


def _unraisable(info) -> None:
    """sys.unraisablehook: an exception Python cannot raise where it happened (a weakref
    callback, a __del__, the garbage collector) is printed as 'Exception ignored' and
    dropped. A Ctrl-C or SIGTERM that landed there would be lost (the run going on to the
    end) and print a traceback; it is sent again a millisecond later instead, where the
    program can take it (through whatever handler then holds: raise, held, ignored)."""
    main = threading.current_thread() is threading.main_thread()
    if isinstance(info.exc_value, KeyboardInterrupt) and main and hasattr(signal, "setitimer"):
        signal.signal(signal.SIGALRM, _again)
        signal.setitimer(signal.ITIMER_REAL, 0.001)
        return
    sys.__unraisablehook__(info)


def _again(signum, frame) -> None:
    signal.raise_signal(signal.SIGINT)


def prepare() -> None:
    """Signals, heavy imports and output streams as the command line wants them."""
    global AS_PROGRAM
    AS_PROGRAM = True
    for sig in ENDING:  # a scheduler's kill, a closed terminal: as Ctrl-C
        ending(sig)
    signal.signal(signal.SIGINT, raise_interrupt)  # even where the shell ignored it
    builtins.__import__ = _import
    sys.unraisablehook = _unraisable
    if hasattr(signal, "SIGXFSZ"):  # past a file size limit: a failed write, not a core dump
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        try:  # an ASCII-only terminal gets \u escapes, never a UnicodeEncodeError
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass


def ending(sig: int):
    """Make `sig` raise KeyboardInterrupt; returns the handler it had. A SIGHUP ignored
    from the start (nohup) is left ignored: the user asked the run to outlive its terminal."""
    previous = signal.getsignal(sig)
    if sig == getattr(signal, "SIGHUP", None) and previous == signal.SIG_IGN:
        return previous
    signal.signal(sig, raise_interrupt)
    return previous


def exit_interrupted() -> None:
    exit_now(INTERRUPTED)


def exit_now(code: int) -> None:
    """Exit with `code` now, once a signal came. Not through sys.exit: CPython 3.11 remembers
    a Ctrl-C that interrupted code run from a string (a dataclass being made, a type hint
    evaluated), even one handled since, and at exit kills itself with SIGINT instead (exit
    -2, not 130; and -2 after a run that went on to complete, when the Ctrl-C was lost).
    Everything is written by now; the streams are flushed here."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def ignore() -> None:
    """Exiting now: a second Ctrl-C cannot change how."""
    for sig in HELD:
        signal.signal(sig, signal.SIG_IGN)
