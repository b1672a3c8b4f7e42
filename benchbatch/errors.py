class UserError(Exception):
    """A mistake in the user's input: shown as one line naming the option, exit code 2. The
    message is made one line: a newline quoted from a file or a path is shown as \\n."""

    def __init__(self, option: str, message: str):
        message = one_line(message)
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


def one_line(text: str) -> str:
    """Text with its control characters and line separators escaped (\\n, \\r, \\x00): a
    value from a file or a path printed on a line stays on that line."""
    text = str(text)
    if not any(c in _BREAKS or c < " " or c == "\x7f" for c in text):
        return text
    return "".join(c.encode("unicode_escape").decode("ascii") if c < " " or c in _BREAKS
                   or c == "\x7f" else c for c in text)  # fmt: skip


_BREAKS = frozenset("\x85\u2028\u2029")


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run: every measured row is on disk and metadata.json says
    'interrupted'; the command line exits with code 130 (its line says what was kept)."""

    def __init__(self, folder):
        super().__init__(f"interrupted: the run's folder is {folder}")
        self.folder = folder


class WriteFailed(Exception):
    """A result file could not be written (a full disk, a file size limit, a folder gone
    read-only): one line naming the file and the bytes it needed; the run ends as failed."""

    def __init__(self, path, needed: int, error: OSError):
        self.path, self.needed = path, needed
        self.reason = error.strerror or str(error) or type(error).__name__
        super().__init__(
            f"cannot write {path}: {self.reason} ({_size(needed)} to write{_free(path)})"
        )


class OutputFailed(Exception):
    """stdout could not be written (a full disk behind `> file`, a device that refuses it):
    the run's folder is whole; the command line says so in one line and exits 1."""

    def __init__(self, error: OSError):
        self.reason = error.strerror or str(error) or type(error).__name__
        super().__init__(f"cannot write the output to stdout: {self.reason}")


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


def _free(path) -> str:
    """', N free' on the file's disk, when it can be told."""
    import shutil
    from pathlib import Path

    try:
        return f", {_size(shutil.disk_usage(Path(path).parent).free)} free"
    except OSError:
        return ""
