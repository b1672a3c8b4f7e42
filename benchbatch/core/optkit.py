"""How an option is declared and checked: a dataclass field that knows its flag, help and
panel (`opt`), which fields a command takes (`use`), what metadata records (`record`), and
the checks every options object shares (`require`, `check_count`, `check_number`).

No typer and no torch here: benchbatch/app/params.py turns such fields into command-line
options; core/options.py and each experiment's options declare theirs with `opt`. A bad
value is a UserError naming the field (the command line names the flag).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchbatch.errors import UserError

# Numbers on the command line as plain decimals: float() also takes '1_000' and non-ASCII
# digits, which no option does (the integer lists refuse them too).
FLOAT_TEXT = re.compile(
    r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?|nan|inf|infinity)", re.IGNORECASE
)


def strict_float(value):
    """A number option's text as a float, or ValueError for anything but a plain decimal."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not FLOAT_TEXT.fullmatch(text):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ValueError(f"{shown!r} is not a number")
    return float(text)


MODEL, RUN, OUTPUT, WORKLOAD, BATCHING = "Model", "Run", "Output", "Workload", "Batching"
KV = "KV cache"


def opt(
    default: Any,
    help: str,
    *,
    panel: str | None = None,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    hidden: bool = False,
    parse: str | None = None,
    choices: tuple[str, ...] | None = None,
    argument: bool = False,
    metavar: str | None = None,
) -> Any:
    """A dataclass field that knows how it appears on the command line.

    flag: the option's name (default --field-name); aliases: old spellings that still work,
    hidden from --help; parse "ints": a comma-separated list given as text, held as a tuple
    of positive integers ("ints0": zero allowed); parse "time_s" / "time_us" ("time_us0":
    zero allowed): a duration typed with a unit (2s, 200ms, 500us) or as a bare number of
    milliseconds (vLLM's unit), held in seconds / microseconds (core/units.py's
    parse_duration); an alias "--old:s" takes a bare number in seconds (":us": microseconds),
    the old spelling's unit; choices: the allowed values of a str.
    """
    meta = dict(help=help, panel=panel, flag=flag, aliases=aliases, hidden=hidden)
    meta |= dict(parse=parse, choices=choices, argument=argument, metavar=metavar)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def record(*objects) -> dict:
    """The options of a run as metadata records them: every field, paths as text. A name
    two groups share keeps the first's value: the command's own options come first (project's
    --tp, a list of GPU counts, was recorded as RunOptions' unset --tp; reproduce's phases
    --context as the sweep's default, which reproduce does not take)."""
    out: dict = {}
    for obj in objects:
        for k, v in dataclasses.asdict(obj).items():
            out.setdefault(k, _plain(v))
    return out


def _plain(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


# --- which fields a command takes ---------------------------------------------------------


@dataclass(frozen=True)
class Use:
    """Which fields of an options class an experiment takes, and its own defaults for them.
    A name in only, skip or defaults that is no field of the class is refused when the Use
    is made (a typo would otherwise drop or keep an option silently). flags: the command's
    own flag for a field, where it takes two fields of one concept (reproduce's phases and
    sweep batches: --decode-batch and --sweep-batch). helps: the command's own help for a
    field whose shared help would say what this command does not (serve-sweep's --trace
    takes arrival times in seconds, not steps)."""

    cls: type
    only: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()
    defaults: dict | None = None
    flags: dict | None = None
    helps: dict | None = None

    def __post_init__(self) -> None:
        known = {f.name for f in dataclasses.fields(self.cls)}
        named = [*(self.only or ()), *self.skip, *(self.defaults or {}), *(self.flags or {}),
                 *(self.helps or {})]  # fmt: skip
        unknown = [n for n in named if n not in known]
        if unknown:
            raise ValueError(f"{self.cls.__name__} has no field {', '.join(map(repr, unknown))}")

    def fields(self) -> list[dataclasses.Field]:
        out = [f for f in dataclasses.fields(self.cls) if f.name not in self.skip]
        return [f for f in out if self.only is None or f.name in self.only]

    def default(self, f: dataclasses.Field):
        if self.defaults and f.name in self.defaults:
            return self.defaults[f.name]
        if f.default is not dataclasses.MISSING:
            return f.default
        return f.default_factory()  # type: ignore[misc]

    def flag(self, f: dataclasses.Field) -> str:
        """The field's flag in this command (its own, unless `flags` renames it)."""
        return (self.flags or {}).get(f.name) or flag_of(f)

    def help(self, f: dataclasses.Field) -> str:
        """The field's help in this command (its own, unless `helps` says it otherwise)."""
        return (self.helps or {}).get(f.name) or f.metadata["help"]


def use(cls: type, *, only=None, skip=(), defaults=None, flags=None, helps=None) -> Use:
    return Use(cls, tuple(only) if only else None, tuple(skip), defaults, flags, helps)


# --- checks shared by every options object ------------------------------------------------

INT_MAX = 2**63 - 1  # every integer ends in Python ints, torch sizes or numpy seeds


def require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise UserError(name, message)


def check_count(name: str, value: int, least: int = 1, most: int = INT_MAX) -> None:
    """An integer option within [least, most]."""
    require(value >= least, name, f"must be at least {least:,}, got {value:,}")
    require(value <= most, name, f"must be at most {most:,}, got {value:,}")


# The most memory, in GiB, an option may give (about 10^24 bytes): far past any machine, yet
# a byte count of it is still exact arithmetic (1e300 GiB in bytes is infinity).
MOST_GIB = 1e15


def check_number(name: str, value: float, least: float = 0.0, *, open_low: bool = False,
                 most: float | None = None, unit: str = "") -> None:  # fmt: skip
    """A finite real option; open_low: strictly above `least`; most: at most that."""
    require(math.isfinite(value), name, f"must be a finite number, got {value}")
    ok = value > least if open_low else value >= least
    word = "more than" if open_low else "at least"
    require(ok, name, f"must be {word} {least:g}, got {value:g}")
    if most is not None:
        require(value <= most, name, f"must be {word} {least:g} and at most {most:g}{unit}, "
                f"got {value:g}")  # fmt: skip


def check_numbers(values: dict, options: dict[str, str]) -> None:
    """No command takes NaN, infinity or an integer past 64 bits: a UserError naming the
    option. values: a command's parsed parameters; options: their names on the command line."""
    for name, value in values.items():
        option = options.get(name, f"--{name.replace('_', '-')}")
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(option, f"must be a finite number, got {value}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX:
            text = str(value)
            text = text if len(text) <= 40 else text[:40] + "..."
            raise UserError(option, f"{text} is too large (at most {INT_MAX:,})")
