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
        signals.ignore()
        try:  # stderr may be gone (a closed terminal)
            sys.stderr.write("interrupted while starting: nothing was run or written\n")
        except (OSError, ValueError, AttributeError):
            pass
        signals.exit_interrupted()
    try:
        run()
    except KeyboardInterrupt:  # outside the command's own handling (typer building it)
        signals.ignore()
        from benchbatch.app.cli import interrupted

        interrupted(None)
        signals.exit_interrupted()


if __name__ == "__main__":  # `python -m benchbatch.app.start`, as `python -m benchbatch`
    main()
