"""Rich tables of result rows: the terminal's view of what the CSV holds."""

from __future__ import annotations

import math

from rich.table import Table


def fmt(value) -> str:
    """Numbers to 3-4 significant figures; big counts with thousands separators."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "", None: "-"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1e4:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    return str(value)


def rows_table(rows: list[dict], columns: dict[str, str], title: str | None = None) -> Table:
    """columns maps a row key to its header; numbers are right-aligned."""
    table = Table(title=title, title_justify="left")
    first = rows[0] if rows else {}
    for key, header in columns.items():
        numeric = isinstance(first.get(key), int | float) and not isinstance(first.get(key), bool)
        table.add_column(header, justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(fmt(row.get(key)) for key in columns))
    return table
