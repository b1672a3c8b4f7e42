"""Files given by the user, read the same careful way everywhere: --config, --trace,
--step-costs, --ceilings, --prompts, a checkpoint's JSON files, the folders compare reads.

A path must name a regular file (a FIFO or a device would be read forever, a folder not at
all) of a sane size; text is UTF-8 with or without a byte-order mark (spreadsheets write
one); JSON may not nest without end nor hold integers of thousands of digits. Numbers read
from a file are checked here too: finite and within the range the caller gives. Every
problem is a UserError naming the option and the file: one line, exit code 2. No torch,
no pandas.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from benchbatch.errors import UserError

MiB = 2**20
# Beyond these a file is not what the option reads (a config.json is kilobytes, a trace of
# ten million requests about 200 MB).
MAX_JSON_BYTES = 64 * MiB
MAX_TEXT_BYTES = 1024 * MiB
MAX_INT_DIGITS = 30  # every integer benchbatch reads fits 64 bits: 19 digits
BOM = "\ufeff"


# The longest name of one file or folder, and of a whole path, the system takes (Linux's
# NAME_MAX and PATH_MAX, in bytes): past them every look at the path fails with "File name
# too long", so such a path is refused by name before anything looks.
NAME_MAX = 255
PATH_MAX = 4096


def path_problem(path: str | Path) -> str | None:
    """What makes a path unusable whatever the disk holds (too long, a NUL), or None."""
    text = os.fspath(path)
    if "\0" in text:
        return "the path holds a NUL character"
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX:
        return f"the path is {len(raw):,} bytes long; a path may have at most {PATH_MAX - 1:,}"
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            name = short(os.fsdecode(part))
            return (f"the name {name!r} in the path is {len(part):,} bytes long; a file or "
                    f"folder name may have at most {NAME_MAX}")  # fmt: skip
    return None


def check_path(path: str | Path, option: str) -> None:
    problem = path_problem(path)
    if problem is not None:
        raise UserError(option, problem)


def check_paths(values: dict, options: dict[str, str]) -> None:
    """Every path among a command's parsed parameters (lists of them too) usable: a
    UserError naming the option otherwise. options: their names on the command line."""
    for name, value in values.items():
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, Path):
                check_path(item, options.get(name, f"--{name.replace('_', '-')}"))


def regular_file(path: str | Path, option: str, limit: int = MAX_TEXT_BYTES) -> Path:
    """The path if it names a regular file of at most `limit` bytes, else a UserError."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(option, f"cannot read {path}: no such file") from None
    except (OSError, ValueError) as e:
        raise UserError(option, f"cannot read {path}: {reason(e)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(option, f"cannot read {path}: a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise UserError(option, f"cannot read {path}: not a regular file (a pipe or a device?)")
    if info.st_size > limit:
        raise UserError(
            option, f"{path} is {info.st_size / MiB:,.0f} MiB, more than the {limit / MiB:,.0f} "
            "MiB such a file may hold",
        )  # fmt: skip
    return path


def read_bytes(path: str | Path, option: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """A regular file's bytes (never blocks on a FIFO: it is refused before it is opened)."""
    path = regular_file(path, option, limit)
    try:
        # O_NONBLOCK: should the file be swapped for a FIFO after the check, open returns.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UserError(option, f"{path} is not a regular file")
            data = f.read(limit + 1)
    except OSError as e:
        raise UserError(option, f"cannot read {path}: {reason(e)}") from None
    if len(data) > limit:
        raise UserError(option, f"{path} grew past {limit / MiB:,.0f} MiB while it was read")
    return data


def read_text(path: str | Path, option: str, limit: int = MAX_TEXT_BYTES) -> str:
    """A regular file's text: UTF-8, a leading byte-order mark dropped."""
    return decode(read_bytes(path, option, limit), path, option)


def decode(data: bytes, path: str | Path, option: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(
            option, f"cannot read {path}: not UTF-8 text (byte {e.start + 1:,} is not)"
        ) from None


def read_json(path: str | Path, option: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of a file (any type: callers check what they need)."""
    return parse_json(read_text(path, option, limit), path, option)


def parse_json(text: str, path: str | Path, option: str, where: str = "") -> Any:
    """JSON text to a value; NaN and Infinity stay floats (callers refuse them by name)."""
    try:
        return json.loads(text.removeprefix(BOM), parse_int=_integer)
    except _TooLong as e:
        raise UserError(option, f"{path}{where}: an integer of {e.args[0]:,} digits") from None
    except RecursionError:
        raise UserError(option, f"{path}{where}: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError is one
        raise UserError(option, f"{path}{where} is not valid JSON: {first_line(e)}") from None


def read_json_object(path: str | Path, option: str) -> dict:
    value = read_json(path, option)
    if not isinstance(value, dict):
        raise UserError(option, f"{path} does not hold a JSON object")
    return value


class _TooLong(ValueError):
    pass


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _TooLong(digits)
    return int(text)


def number(
    value: Any, lo: float, hi: float, *, low_open: bool = False, integer: bool = False
) -> str | None:
    """None if value is a finite number within [lo, hi] ((lo, hi] with low_open; an integer
    with integer=True), else what is wrong with it, for the caller's error line."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {short(repr(value))}"
    if integer and not isinstance(value, int):
        return f"must be an integer, got {short(repr(value))}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if value < lo or (low_open and value == lo) or value > hi:
        left = "(" if low_open else "["
        return f"must be in {left}{lo:g}, {hi:g}], got {short(f'{value:g}')}"
    return None


def numeric(column):
    """A CSV column as numbers, NaN where a cell is not one: pandas.to_numeric(errors=
    "coerce"), which raises OverflowError instead on an integer of hundreds of digits (no
    float holds it; such a cell becomes NaN here, for the caller's range check to name)."""
    import pandas as pd

    try:
        numbers = pd.to_numeric(column, errors="coerce")
    except OverflowError:
        return column.map(_float_or_nan).astype(float)
    infinite = numbers.abs() == math.inf  # written "inf", or digits past a float's range
    if infinite.any():
        numbers = numbers.where(~infinite, column[infinite].map(_float_or_nan).astype(float))
    return numbers


def _float_or_nan(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    spelled = str(value).strip().lower().lstrip("+-")
    if math.isinf(number) and spelled not in ("inf", "infinity"):
        return math.nan  # digits past a float's range, not a written infinity
    return number


def short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def reason(e: BaseException) -> str:
    return getattr(e, "strerror", None) or first_line(e)


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def cut_short(data: bytes) -> str | None:
    """Whether a CSV's bytes end in a line cut short (a copy or a run stopped mid-write):
    a last line with fewer fields than the header, or one cut just after its last comma
    (no newline to end it, its last field empty). The reason ("line N has K of its
    header's M fields: the file was cut short"), or None for a whole file."""
    import csv

    text = data.decode("utf-8", errors="replace")
    lines = text.rstrip("\r\n").splitlines()
    if len(lines) < 2:
        return None
    try:
        header, last = (next(csv.reader([line]), []) for line in (lines[0], lines[-1]))
    except csv.Error:  # a field past csv's limit (a 200,000-digit number): not a cut;
        return None  # the reader that parses the file says what is wrong with it
    unended = not text.endswith("\n") and lines[-1].endswith(",")
    if len(last) < len(header) or (len(last) == len(header) and unended):
        return (f"line {len(lines)} has {len(last) - unended} of its header's {len(header)} "
                "fields: the file was cut short")  # fmt: skip
    return None
