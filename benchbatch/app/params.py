"""The command line made from the options dataclasses: each field becomes one typer option.

`@command(PhasesOptions, ModelOptions, RunOptions)` gives the decorated function a typer
signature with every field's option (help, panel, flag and hidden aliases from the field's
metadata, see benchbatch/core/options.py) and calls it with the options objects built from what
was typed. So an option is declared once for every command; a command picks the fields it
takes (`use(RunOptions, only=...)`) and may set an experiment's own defaults.

A UserError that names a field ("slots") is shown with the command's flag ("--slots").
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from benchbatch.core.optkit import Use, strict_float
from benchbatch.core.units import duration_text, parse_duration
from benchbatch.errors import UserError

LIST_MAX = 2**31 - 1  # a batch, a length or a matrix size: far beyond any memory already


def command(*groups: type | Use):
    """Decorate fn(opts_a, opts_b, ...) into a typer command over their fields."""
    uses = [g if isinstance(g, Use) else Use(g) for g in groups]

    def wrap(fn):
        params, plan = _parameters(uses)
        flags = {f.name: u.flag(f).split("/")[0] for u in uses for f in u.fields()}

        @functools.wraps(fn)
        def run(**typed):
            try:
                return fn(*(_build(u, plan, typed) for u in uses))
            except UserError as e:
                raise _named(e, flags | _typed_aliases(plan, typed)) from None

        run.__signature__ = inspect.Signature(params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__  # typer must read the new signature, not fn's
        run.flags = flags
        return run

    return wrap


def _typed_aliases(plan: dict[str, _Param], typed: dict) -> dict[str, str]:
    """Fields given through an old spelling: errors name the flag the user typed."""
    given = {name for name, value in typed.items() if value is not None and value is not False}
    return {p.field: p.flag for name, p in plan.items() if p.flag and name in given}


def _named(e: UserError, flags: dict[str, str]) -> UserError:
    """A field's name ('max_output') as the flag the user typed ('--max-output')."""
    if e.option.startswith("-") or " " in e.option or e.option.isupper():  # RUN_DIR
        return e
    return UserError(flags.get(e.option, "--" + e.option.replace("_", "-")), e.message)


# --- building the signature ---------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    """How one command-line parameter becomes a field: its own value, or an alias's."""

    field: str
    group: type
    parse: str | None = None
    constant: Any = None  # an alias flag that sets the field to this value
    flag: str | None = None  # an alias's spelling
    bare: str | None = None  # a duration alias's unit of a bare number ('s': the old one)


def _parameters(uses: list[Use]) -> tuple[list[inspect.Parameter], dict[str, _Param]]:
    params, plan = [], {}
    for u in uses:
        hints = typing.get_type_hints(u.cls)
        for f in u.fields():
            params.append(_parameter(f, hints[f.name], u.default(f), u.flag(f), u.help(f)))
            plan[f.name] = _Param(f.name, u.cls, f.metadata.get("parse"))
            for i, alias in enumerate(f.metadata.get("aliases", ())):
                name = f"{f.name}__alias{i}"
                spelling, _, value = alias.partition("=")
                spelling, _, bare = spelling.partition(":")  # '--slo-ttft-s:s': in seconds
                params.append(_alias(name, spelling if bare else alias, hints[f.name], f))
                plan[name] = _Param(f.name, u.cls, f.metadata.get("parse"), value or None,
                                    spelling, bare or None)  # fmt: skip
    return params, plan


def _parameter(f: dataclasses.Field, hint, default, flag: str,
               help: str | None = None) -> inspect.Parameter:  # fmt: skip
    meta = f.metadata
    kind = _cli_type(hint, meta)
    if _is_time(meta.get("parse")) and default is not None:
        default = duration_text(default / TIME_STORED[meta["parse"]])
    elif meta.get("parse") and default is not None:
        default = ",".join(str(v) for v in default)
    if meta.get("argument"):
        default = inspect.Parameter.empty  # a required positional argument
    elif isinstance(default, tuple):
        default = list(default)
    info = _info(f, kind, flag, help)
    annotation = Annotated[kind, info]
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=annotation)  # fmt: skip


def _info(f: dataclasses.Field, kind, flag: str, help: str | None = None) -> Any:
    meta = f.metadata
    help = help or meta["help"]  # the command's own, where it has one
    common = dict(help=help, rich_help_panel=meta.get("panel"), hidden=meta["hidden"])
    if meta.get("argument"):
        return typer.Argument(help=help, metavar=meta.get("metavar"), show_default=False)
    if kind is bool:
        return typer.Option(flag, metavar="", **common)
    extra = {"case_sensitive": False} if meta.get("choices") else {}
    if _is_time(meta.get("parse")):
        extra["metavar"] = "<time>"
    elif meta.get("metavar"):  # the field's own (a list of choices too wide to show)
        extra["metavar"] = f"<{meta['metavar'].lower()}>"
    return typer.Option(flag, **common, **extra, **_strict(kind))


def _alias(name: str, alias: str, hint, f: dataclasses.Field) -> inspect.Parameter:
    """An old spelling: hidden, None unless given. 'FLAG=VALUE' is a flag setting VALUE."""
    if "=" in alias:
        info = typer.Option(alias.split("=")[0], hidden=True, metavar="")
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=False,
                                 annotation=Annotated[bool, info])  # fmt: skip
    kind = _cli_type(hint, f.metadata)
    optional = kind if _allows_none(kind) else kind | None
    info = typer.Option(alias, hidden=True, help=f.metadata["help"], **_strict(kind))
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[optional, info])  # fmt: skip


def _strict(kind) -> dict:
    """A number option parsed as strictly as the lists are: plain ASCII digits, no '1_000'
    or '١٢' (int() and float() take both, as different numbers than the user may think)."""
    base = _strip_none(kind)
    if base is int:
        return {"parser": strict_int}
    if base is float:
        return {"parser": strict_float}
    if base is Path or base == list[Path]:
        return {"parser": strict_path}
    return {}


def strict_path(value):
    """A path as given; an empty one refused ('' is no folder: it was read as '.', the
    current one, and written into with --force)."""
    if isinstance(value, str) and not value.strip():
        raise ValueError("an empty path names no file or folder")
    return Path(value) if isinstance(value, str) else value


def strict_int(value):
    if not isinstance(value, str):
        return value  # a default
    number = _int_or_none(value.strip())
    if number is None:
        raise ValueError(f"{_short(value)!r} is not an integer")
    return number


def _cli_type(hint, meta):
    """What typer parses: lists as text (parsed here), choices as a Literal."""
    nullable = _allows_none(hint)
    if meta.get("parse"):
        base: Any = str
    elif meta.get("choices"):
        base = Literal[meta["choices"]]  # type: ignore[valid-type]
    else:
        base = _strip_none(hint)
    return base | None if nullable else base


def _allows_none(hint) -> bool:
    return type(None) in typing.get_args(hint)


def _strip_none(hint):
    """int | None -> int; tuple[Path, ...] -> list[Path] (a repeatable option)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is tuple:
        return list[typing.get_args(hint)[0]]
    return hint


# --- calling the command ------------------------------------------------------------------


def _build(u: Use, plan: dict[str, _Param], typed: dict):
    """The options object of one group from the typed values (aliases win when given)."""
    values = {f.name: u.default(f) for f in dataclasses.fields(u.cls) if _has_default(u, f)}
    for name, p in plan.items():
        if p.group is not u.cls or name not in typed:
            continue
        value = typed[name]
        if p.constant is not None:
            if value:
                values[p.field] = p.constant
            continue
        if name != p.field and value is None:
            continue  # an alias not given
        values[p.field] = _parse(value, p, name)
    return u.cls(**values)


def _has_default(u: Use, f: dataclasses.Field) -> bool:
    given = u.defaults and f.name in u.defaults
    return (
        bool(given)
        or f.default is not dataclasses.MISSING
        or (
            f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
        )
    )


def _parse(value, p: _Param, name: str):
    if _is_time(p.parse) and isinstance(value, str):
        seconds = parse_duration(value, p.field, p.bare or "ms", zero=p.parse.endswith("0"),
                                 small=p.parse.startswith("time_us"))  # fmt: skip
        return seconds * TIME_STORED[p.parse]
    if p.parse == "words" and isinstance(value, str):
        return parse_words(value, p.field)
    if p.parse and isinstance(value, str):
        return tuple(parse_int_list(value, p.field, minimum=0 if p.parse == "ints0" else 1))
    if isinstance(value, list):
        return tuple(value)
    return value


# A duration option ('200ms', '2s' or a bare number of milliseconds) held in seconds
# ("time_s") or microseconds ("time_us"; "time_us0": zero allowed): how many of the held
# unit one second is.
TIME_STORED = {"time_s": 1.0, "time_us": 1e6, "time_us0": 1e6}


def _is_time(parse: str | None) -> bool:
    return parse in TIME_STORED


def parse_words(text: str, option: str) -> tuple[str, ...]:
    """'static, continuous' -> ('static', 'continuous'); an empty item between commas is a
    malformed list, as in the integer lists (an empty text is no item: the option says)."""
    words = tuple(w.strip(" \t") for w in text.split(","))
    if words == ("",):
        return ()
    if "" in words:
        raise UserError(option, f"{_short(text)!r} has an empty item between commas")
    return words


def parse_int_list(text: str, option: str, maximum: int = LIST_MAX, minimum: int = 1) -> list:
    """'512,2048' -> [512, 2048]: integers of at least `minimum`, duplicates dropped, sorted."""
    values = set()
    for item in text.split(","):
        item = item.strip(" \t")  # spaces around a value, nothing stranger
        value = _int_or_none(item)
        if value is None:
            raise UserError(
                option,
                f"{_short(text)!r} is not a comma-separated list of integers "
                f"({_short(item, 20)!r} is not an integer)",
            )
        if value < minimum:
            word = "positive" if minimum == 1 else f"at least {minimum}"
            raise UserError(option, f"every value must be {word}, got {_short(item)}")
        if value > maximum:
            raise UserError(option, f"{_short(item)} is too large (at most {maximum:,})")
        values.add(value)
    return sorted(values)


def _int_or_none(item: str) -> int | None:
    """Plain decimal digits with an optional sign: no '1_000', no '١٢' (int() takes both)."""
    digits = item[1:] if item[:1] in "+-" else item
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 4000:
        return None
    return int(item)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["Use", "command", "parse_int_list", "Path"]
