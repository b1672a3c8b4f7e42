# Signals first (benchbatch.signals says why), then the program.
import signal


def _interrupt(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, _interrupt)
signal.signal(signal.SIGINT, _interrupt)

from benchbatch.app.start import main  # noqa: E402

main()
