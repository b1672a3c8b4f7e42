"""A command's --help in at most 60 lines (at 100 columns); --help-all: typer's whole help.

The short help keeps the command's first paragraph and its own options, one row each: the
option's whole help if it fits the lines each row may take (3, 2 or 1, the most that keep
the command within 60 lines), else its first sentence, else that sentence without its
asides in brackets (cut at a word, "...", only past that), always with its default. The
options every command shares (the model, the run, the output) are named once, in one
panel, their help left to --help-all. CUDA-only options are left out where CUDA cannot
be, found without importing torch (--help must start in a fraction of a second): no
NVIDIA device file and no nvidia-smi; BENCHBATCH_SHOW_ALL=1 shows them anyway. Hidden
options (old spellings) never show, in either.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil

from rich.console import Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

# The options of these panels are every command's (ModelOptions, RunOptions): named once.
SHARED_PANELS = ("Model", "Run", "Output")
# Options that do nothing without CUDA (their field names).
CUDA_ONLY = frozenset({"cuda_graphs"})
SHOW_ALL_ENV = "BENCHBATCH_SHOW_ALL"
NVIDIA_DEVICE = "/dev/nvidia0"
OWN_PANEL = "Options"


def cuda_possible() -> bool:
    """Could this machine have CUDA? Cheap, and without torch: the driver's device file or
    nvidia-smi, or BENCHBATCH_SHOW_ALL set (to anything but 0)."""
    if os.environ.get(SHOW_ALL_ENV, "0") not in ("", "0"):
        return True
    return os.path.exists(NVIDIA_DEVICE) or shutil.which("nvidia-smi") is not None


def version_line() -> str:
    """'benchbatch 0.4.0 (torch 2.13.0, Python 3.11.7)', read from the installed packages'
    metadata: torch is not imported."""
    import platform

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"benchbatch {version('benchbatch')} (torch {version('torch')}, "
        f"Python {platform.python_version()})"
    )


def first_sentence(text: str) -> str:
    """The help text up to its first full stop outside brackets that ends a sentence (a
    capital letter follows): what the option is; the rest is --help-all's."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "." and depth <= 0 and text[i + 1 : i + 2] == " ":
            if text[i + 2 : i + 3].isupper():
                return text[: i + 1]
    return text


def without_brackets(text: str) -> str:
    """The text without its asides in brackets: 'Sequences served at once (KV-cache slots)'
    -> 'Sequences served at once'."""
    out, depth = [], 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    text = " ".join("".join(out).split())
    for mark in ",.;:":
        text = text.replace(" " + mark, mark)
    return text


def _fold(metavar: str, width: int) -> str:
    """A list of choices wider than its column, folded after a '|': '<fixed|uniform|' and
    'lognormal>' on two lines."""
    if len(metavar) <= width or "|" not in metavar:
        return metavar
    lines, line = [], ""
    for piece in metavar.replace("|", "|\n").split("\n"):
        if line and len(line) + len(piece) > width:
            lines.append(line)
            line = ""
        line += piece
    return "\n".join([*lines, line])


def shown(param) -> bool:
    if getattr(param, "hidden", False):
        return False
    return param.name not in CUDA_ONLY or cuda_possible()


def _flags(param) -> str:
    if param.param_type_name == "argument":
        return (param.metavar or (param.name or "argument").upper()) + (
            "..." if param.nargs != 1 else ""
        )
    names = [o for o in param.opts if o.startswith("--")] or list(param.opts)
    short = [o for o in param.opts if not o.startswith("--")]
    text = ", ".join([*short, *names])
    if getattr(param, "secondary_opts", None):
        text += "/" + "/".join(param.secondary_opts)
    return text


def _default(param) -> str | None:
    value = getattr(param, "default", None)
    if value is None or value is False or value == "" or callable(value):
        return None
    if getattr(param, "is_flag", False):
        return None if value is False else param.opts[0].lstrip("-")
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or None
    return str(value)


def _metavar(param, ctx) -> str:
    if param.param_type_name == "argument":
        return ""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    if getattr(param, "metavar", None):
        return param.metavar
    try:
        text = param.display_type_rich(ctx=ctx)  # typer's '<int>', '<sim|real>'
    except (AttributeError, TypeError):
        text = None
    return text or ""


MAX_LINES = 60  # a command's --help at most this many lines (at 100 columns)
METAVAR_WIDTH = 18  # a longer type (a list of choices) folds onto a second line
ROW_LINES = (3, 2, 1)  # the lines an option's help may take, the most that still fits


def _help_cell(param, console, width: int, lines: int) -> Text:
    """The option's help within `lines` lines of `width`: the whole of it, else its first
    sentence, else that sentence cut at a word ("..."), with its default after it."""
    whole = " ".join((param.help or "").split())
    default = _default(param)
    tail = Text(f" [default: {default}]", style="dim") if default is not None else Text("")

    def cell(words: str) -> Text:
        return Text(words).append_text(tail)

    def fits(text: Text) -> bool:
        return len(text.wrap(console, width)) <= lines

    short = without_brackets(first_sentence(whole))
    for words in (whole, first_sentence(whole), short):
        if fits(cell(words)):
            return cell(words)
    words = short.split()
    while len(words) > 1 and not fits(cell(" ".join(words) + "...")):
        words.pop()
    return cell(" ".join(words) + "...")


def _panel(name: str, params: list, ctx, console, lines: int) -> Panel:
    flags = [_flags(p) for p in params]
    metavars = [_metavar(p, ctx) for p in params]
    c1 = max(map(len, flags))
    c2 = min(max(map(len, metavars)), METAVAR_WIDTH)
    # the panel's border and padding (4), the gaps between the columns (2 each)
    width = max(20, console.width - 4 - c1 - c2 - 4)
    table = Table(show_header=False, box=None, padding=(0, 1), pad_edge=False, expand=False)
    table.add_column(width=c1, no_wrap=True, style="bold cyan")
    table.add_column(width=c2, overflow="fold", style="yellow")
    table.add_column(width=width)
    for param, flag, metavar in zip(params, flags, metavars, strict=True):
        table.add_row(flag, _fold(metavar, c2), _help_cell(param, console, width, lines))
    return Panel(table, title=name, title_align="left", border_style="dim")


def _panels(command, ctx) -> tuple[dict[str, list], dict[str, list]]:
    own: dict[str, list] = {}
    shared: dict[str, list] = {}
    for param in command.get_params(ctx):
        if not shown(param):
            continue
        panel = getattr(param, "rich_help_panel", None) or (
            "Arguments" if param.param_type_name == "argument" else OWN_PANEL
        )
        (shared if panel in SHARED_PANELS else own).setdefault(panel, []).append(param)
    return own, shared


def _description(command) -> tuple[str, bool]:
    text = (command.help or "").split("\f")[0].strip()
    first, *rest = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()] or [""]
    return first, bool(rest)


# The tries, from the roomiest: lines per option's help, and compact (no blank line above
# the usage, the description's first sentence only, --help-all and --version named in the
# shared panel).
TRIES = (*((lines, False) for lines in ROW_LINES), (1, True))
ANSWERS = ("help_all", "version")  # the options that answer and exit, beside --help


def render_short(command, ctx, console) -> None:
    """Print the short help of one command on typer's console: the roomiest try that keeps
    the whole within MAX_LINES (click ends the help with one more, empty, line)."""
    for lines, compact in TRIES:
        parts = _short_parts(command, ctx, console, lines, compact)
        with console.capture() as captured:
            for part in parts:
                console.print(part)
        if len(captured.get().splitlines()) <= MAX_LINES - 1:
            break
    for part in parts:
        console.print(part)


def _short_parts(command, ctx, console, lines: int, compact: bool = False) -> list:
    usage = Text(command.get_usage(ctx), style="bold")
    parts: list = [Padding(usage, (0, 1, 1, 1) if compact else 1)]
    first, more = _description(command)
    if compact and first_sentence(first) != first:
        first, more = first_sentence(first), True
    if first:
        text = Text(first)
        if more:
            text.append(" More in --help-all.", style="dim")
        parts.append(Padding(text, (0, 1, 1, 1)))
    own, shared = _panels(command, ctx)
    if compact:
        answers = [p for p in own.get(OWN_PANEL, []) if p.name in ANSWERS]
        own[OWN_PANEL] = [p for p in own[OWN_PANEL] if p.name not in ANSWERS]
        shared["Help"] = answers
    order = ["Arguments", *[p for p in own if p not in ("Arguments", OWN_PANEL)], OWN_PANEL]
    parts += [_panel(name, own[name], ctx, console, lines) for name in order if name in own]
    if shared:
        parts.append(_shared_panel(shared))
    return parts


def _shared_panel(shared: dict[str, list]) -> Panel:
    table = Table(show_header=False, box=None, padding=(0, 1), expand=True, pad_edge=False)
    table.add_column(no_wrap=True, style="bold")
    table.add_column(ratio=1, style="cyan")
    for name in (*SHARED_PANELS, "Help"):
        if shared.get(name):
            table.add_row(name, "  ".join(_flags(p) for p in shared[name]))
    title = "Shared by the commands (--help-all: what each does)"
    return Panel(Group(table), title=title, title_align="left", border_style="dim")
