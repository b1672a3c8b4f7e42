"""Figures drawn from the rows the probes return (the same data as the CSV files).

One module per figure family; each draws with matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import axis, ticker  # noqa: E402
from matplotlib.category import StrCategoryFormatter  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from benchbatch.signals import signals_held  # noqa: E402


def save(fig, path: Path) -> None:
    """Draw the figure in memory, then write it under a temporary name renamed into place
    (results.atomic_write_bytes), so a half-drawn PNG never replaces a good one; a write
    that fails (a full disk, Ctrl-C) leaves no temporary file, and the figure is closed.
    Text is drawn as given: a `$` in a model name or a label is a dollar, never mathtext."""
    from benchbatch.core.ranks import is_writer
    from benchbatch.output import results

    if not is_writer():  # under torchrun rank 0 alone draws and writes
        plt.close(fig)
        return

    try:
        literal_text(fig)
        buffer = io.BytesIO()
        # Agg's C++ renderer calls back into Python: a Ctrl-C or SIGTERM raised inside a
        # callback came out as "ValueError: Invalid bounding box" (exit 1, a traceback), so
        # the drawing (under a second) holds them; they are delivered once it is done.
        with signals_held():
            fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
        results.atomic_write_bytes(path, buffer.getvalue())
    finally:
        plt.close(fig)


def tight(fig, **kwargs) -> None:
    """fig.tight_layout(), which draws the texts (signals held, as in save()): they are
    made literal first."""
    literal_text(fig)
    with signals_held():
        fig.tight_layout(**kwargs)


def literal_text(fig) -> None:
    """Every text of the figure drawn literally (titles, labels, legends, annotations, and
    tick labels given as text); numeric tick labels keep the mathtext their formatters use
    (10^3 on a log axis)."""
    for text in _texts(fig):
        text.set_parse_math(False)
    for ax in fig.axes:
        for which in (ax.xaxis, ax.yaxis):
            for get, put in ((which.get_major_formatter, which.set_major_formatter),
                             (which.get_minor_formatter, which.set_minor_formatter)):  # fmt: skip
                formatter = get()
                if isinstance(formatter, TEXT_FORMATTERS):
                    put(_Escaped(formatter))


# Formatters of tick labels given as text (set_xticks(x, labels) makes a FuncFormatter,
# bar(categories, ...) a StrCategoryFormatter); numeric ones keep their mathtext.
TEXT_FORMATTERS = (
    ticker.FixedFormatter,
    ticker.FuncFormatter,
    ticker.StrMethodFormatter,
    ticker.FormatStrFormatter,
    StrCategoryFormatter,
)


def _texts(artist):
    """The Text artists under an artist, except tick labels and axis offset texts."""
    for child in artist.get_children():
        if isinstance(child, axis.Tick):
            continue
        if isinstance(child, Text):
            if not _is_offset(child):
                yield child
            continue
        yield from _texts(child)


def _is_offset(text: Text) -> bool:
    return any(text is a.offsetText for a in (getattr(text.axes, "xaxis", None),
                                               getattr(text.axes, "yaxis", None)) if a)  # fmt: skip


class _Escaped(ticker.Formatter):
    """A formatter of text tick labels whose `$` are shown as dollars."""

    def __init__(self, inner: ticker.Formatter):
        self.inner = inner

    def set_axis(self, ax) -> None:
        super().set_axis(ax)
        self.inner.set_axis(ax)

    def __call__(self, x, pos=None) -> str:
        return _escape(self.inner(x, pos))

    def format_ticks(self, values) -> list[str]:
        return [_escape(t) for t in self.inner.format_ticks(values)]


def _escape(text: str) -> str:
    return str(text).replace("$", r"\$")
