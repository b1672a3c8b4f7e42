"""Rich tables of result rows: the terminal's view of what the CSV holds."""

from __future__ import annotations

import math

from rich import box
from rich.table import Table


def fmt(value) -> str:
    """Numbers to 3 significant figures; big counts with thousands separators."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "", None: "-"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1e3:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def rows_table(rows: list[dict], columns: dict[str, str], title: str | None = None) -> Table:
    """columns maps a row key to its header; numbers are right-aligned."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    first = rows[0] if rows else {}
    for i, (key, header) in enumerate(columns.items()):
        numeric = isinstance(first.get(key), int | float) and not isinstance(first.get(key), bool)
        table.add_column(header, justify="right" if numeric else "left", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(fmt(row.get(key)) for key in columns))
    return table
