# Signals first (benchbatch/signals.py says why), then the program.
import signal
import sys


def _interrupt(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGINT, _interrupt)
signal.signal(signal.SIGTERM, _interrupt)  # after SIGINT: once SIGTERM is caught, both are
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
    signal.signal(signal.SIGHUP, _interrupt)  # the terminal closed (not under nohup)

try:
    from benchbatch.app.start import main
except KeyboardInterrupt:  # before the entry point could take it: nothing ran yet
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:  # stderr may be gone (a closed terminal)
        sys.stderr.write("interrupted while starting: nothing was run or written\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    import os

    os._exit(130)

try:
    main()
except KeyboardInterrupt:  # on main's first instruction, before its own handlers could take it
    from benchbatch.app.start import interrupted_outside

    interrupted_outside()
