"""Figures drawn from the rows the probes return (the same data as the CSV files).

One module per figure family; each draws with matplotlib's Agg backend (no display).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path: Path) -> None:
    """Write through a temporary name so a half-drawn PNG never replaces a good one; a
    write that fails (a full disk, Ctrl-C) leaves no temporary file, and the figure closed."""
    from benchbatch.distributed import is_writer

    if not is_writer():  # under torchrun rank 0 alone writes
        plt.close(fig)
        return
    tmp = path.with_name(f".{path.name}.tmp.png")
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
