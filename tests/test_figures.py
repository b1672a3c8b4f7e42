"""Numbers as people read them (core/units.py's figure and significant, render.fmt): the
digits Python's own `g` format gives wherever it writes them out, never its e-notation,
and 1,000 and over whole with thousands separators."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from benchbatch.core.units import figure, significant
from benchbatch.output.render import fmt

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(finite, st.integers(min_value=1, max_value=5))
def test_significant_has_the_digits_of_g_and_never_an_exponent(value, digits):
    said = significant(value, digits)
    assert "e" not in said and "E" not in said
    # the same number as Python's g format rounds it to (its own digits, written out)
    assert float(said) == float(f"{value:.{digits}g}")


@given(finite)
def test_figure_is_three_digits_below_a_thousand_and_whole_above(value):
    said = figure(value)
    assert "e" not in said
    if abs(value) >= 1e3:
        assert said == f"{value:,.0f}"
    else:
        assert float(said) == float(f"{value:.3g}")


def test_the_cases_a_user_sees():
    assert [significant(v, 2) for v in (330.2, 0.0088123, 1e-9, 0.5, 100.0)] == [
        "330", "0.0088", "0.000000001", "0.5", "100"]  # fmt: skip
    assert [figure(v) for v in (9.0612, 662.4, 1142.3, 3350.0, 0.0, -0.000123456)] == [
        "9.06", "662", "1,142", "3,350", "0", "-0.000123"]  # fmt: skip
    assert significant(math.nan, 2) == "nan" and figure(math.inf) == "inf"
    assert significant(7, 3) == "7"  # an int, as a CSV's cell can be


def test_a_table_cell_says_each_kind_of_value():
    assert [fmt(v) for v in (True, False, None, 12345, math.nan, 1234.5, 0.000012345)] == [
        "yes", "", "-", "12,345", "-", "1,234", "0.0000123"]  # fmt: skip


def test_a_table_too_wide_for_the_terminal_folds_a_number_never_cuts_it():
    """At 80 columns a cell read "0.0000…" (occupancy's slots%, project's GiB/GPU): a
    number too wide for its column folds onto a second line, every digit kept."""
    from rich.console import Console

    from benchbatch.output.render import rows_table

    value = 4.01e-9
    rows = [{"policy": "continuous-reserve", "wide": "x" * 30, "slots": value}]
    console = Console(width=40, record=True, color_system=None, soft_wrap=True)  # out_console
    console.print(rows_table(rows, {"policy": "policy", "wide": "wide", "slots": "slots%"}))
    text = console.export_text()
    assert "…" not in text
    digits = "".join(ch for ch in text if ch.isdigit() or ch == ".")
    assert fmt(value) in digits  # every digit there, in order, whatever the fold


def test_a_number_or_a_headers_word_is_never_split_across_lines():
    """Piped at 80 columns, phases' p10-p90 "1.12-1.82" printed as "1.12-1" over ".82"
    (read as 1.12-1) and headers as "contex" over "t": a column is as wide as its longest
    unbroken cell and header word, and a table that needs more runs past the width."""
    from rich.console import Console

    from benchbatch.output.render import rows_table

    rows = [{"step": "decode b=1", "context": 100, "spread": "1.12-1.82", "wide": "y" * 30,
             "ms": 0.000012345}]  # fmt: skip
    columns = {"step": "step", "context": "context", "spread": "p10-p90", "wide": "wide",
               "ms": "GFLOP/s"}  # fmt: skip
    console = Console(width=40, record=True, color_system=None, soft_wrap=True)  # out_console
    console.print(rows_table(rows, columns))
    lines = console.export_text().splitlines()
    for whole in ("1.12-1.82", "0.0000123", "context", "p10-p90", "GFLOP/s", "y" * 30):
        assert any(whole in line for line in lines), (whole, lines)
