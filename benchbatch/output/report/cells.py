"""Table cells from rows as the CSV files hold them: a number when there is a finite one,
else what the row says instead (its status, '-')."""

from __future__ import annotations

import math
from collections.abc import Iterable

from benchbatch.core.units import figure
from benchbatch.output.render import fmt


def ok_rows(rows: Iterable[dict]) -> list[dict]:
    """The rows that were measured (not skipped, not out of memory)."""
    return [r for r in rows if r.get("status", "ok") == "ok"]


def number(row: dict | None, key: str) -> float | None:
    """A finite number from a row (CSV cells come back as text or NaN), else None."""
    if row is None:
        return None
    value = row.get(key)
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def status_of(row: dict | None) -> str:
    return "not measured" if row is None else str(row.get("status", "-"))


def measured_cell(row: dict | None, key: str) -> str:
    if row is None:
        return "-"
    value = number(row, key)
    return fmt(value) if value is not None else status_of(row)


def article_number(value: float) -> str:
    """An article's number as the article gives it (1.955, 318.9: fmt's three figures made
    them 1.96 and 319 beside a claim quoting 318.9); one computed from them, as fmt."""
    if value == float(f"{value:.4g}"):
        return f"{value:,g}"
    return fmt(value)


def pair(article: float | None, measured: float | None, suffix: str = "") -> str:
    a = f"{article_number(article)}{suffix}" if article is not None else "-"
    m = f"{fmt(measured)}{suffix}" if measured is not None else "-"
    return f"{a} / {m}"


def pair_percent(article: float | None, measured: float | None) -> str:
    return f"{percent(article)} / {percent(measured)}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{figure(value)}x"


def percent(value: float | None) -> str:
    """A fraction as the report and the terminal both say it: one decimal (7.3%, 79.2%),
    two significant digits under 0.1% (0.042%), "-" for none."""
    if value is None or value != value:
        return "-"
    if 0 < abs(value) < 0.001:
        return f"{value * 100:.2g}%"
    return f"{value:.1%}"
