"""The program's entry point (`benchbatch` and `python -m benchbatch`): signals first
(benchbatch/signals.py says why), then the command line, imported only once a Ctrl-C can
no longer land in the middle of it unanswered."""

from __future__ import annotations

import sys

from benchbatch import signals


def main() -> None:
    try:
        signals.prepare()
        from benchbatch.app.cli import main as run
    except KeyboardInterrupt:
        interrupted_outside()
    try:
        run()
    except KeyboardInterrupt:  # outside the command's own handling (typer building it)
        interrupted_outside()


def interrupted_outside() -> None:
    """A Ctrl-C or SIGTERM no command's handling took: while the command line was imported,
    while typer built the command, or on main's first instruction (where Python checks for
    one before any `try` of main's). One line, exit code 130, never a traceback."""
    signals.ignore()
    cli = sys.modules.get("benchbatch.app.cli")
    if cli is not None and hasattr(cli, "interrupted"):  # a run may be open: it says where
        cli.interrupted(None)
    else:
        try:  # stderr may be gone (a closed terminal)
            sys.stderr.write("interrupted while starting: nothing was run or written\n")
        except (OSError, ValueError, AttributeError):
            pass
    signals.exit_interrupted()


if __name__ == "__main__":  # `python -m benchbatch.app.start`, as `python -m benchbatch`
    main()
