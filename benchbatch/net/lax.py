"""A request's scalar fields read as vLLM reads them: its request models are pydantic's in
lax mode, which takes 5.0 and "5" for an integer, "true", "yes", "on" and 1 for true, "0"
for a float. A client that computes max_tokens as a float (numpy, some JSON writers) is
served by vLLM; so it is here. Each function returns the value, or raises ValueError where
pydantic refuses it (5.5 or "1e2" as an integer, 2 as a boolean). Pure Python."""

from __future__ import annotations

import math

TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def as_int(value) -> int:
    """An integer: an int (a bool as 0 or 1), a float with no fraction, or a string of
    either ("5", "5.0"; not "1e2")."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value):
            return int(value)
        raise ValueError(f"{value!r} is not a whole number")
    if isinstance(value, str):
        text = value.strip()
        whole, dot, fraction = text.partition(".")
        digits = whole.lstrip("+-")
        if digits.isdigit() and digits.isascii() and (not dot or set(fraction) <= {"0"}):
            return int(whole)
        raise ValueError(f"{value!r} is not a whole number")
    raise ValueError(f"{value!r} is not a whole number")


def as_bool(value) -> bool:
    """A boolean: a bool, 0 or 1, or one of TRUE or FALSE's words in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE | FALSE:
        return value.strip().lower() in TRUE
    raise ValueError(f"{value!r} is not true or false")


def as_float(value) -> float:
    """A number: an int, a float or a bool, or a string of one ("0", "0.5")."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a number")
