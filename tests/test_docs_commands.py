"""Every benchbatch command line the README and docs/ show (in code blocks and inline code)
names a command that exists and options it takes, as typed: each is parsed by the command
line itself (click's make_context: option names, flags, counts and types), never run. A
renamed or removed option fails here, not in a reader's terminal."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from benchbatch.app.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
START = re.compile(
    r"(?:^|&& |\| )(?:benchbatch|python3 -m benchbatch|torchrun(?: \S+)*? -m benchbatch) (.*)$"
)


def _lines(path: Path) -> list[str]:
    text = path.read_text()
    blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S)
    inline = re.findall(r"`((?:benchbatch|torchrun|python3 -m benchbatch)[^`]*)`", text)
    return [line for block in blocks for line in block.splitlines()] + inline


def commands() -> list[tuple[str, str, list[str]]]:
    """(file, line, its arguments after `benchbatch`) for every command line shown."""
    found = []
    for path in DOCS:
        for line in _lines(path):
            line = re.split(r"\s+#\s", line)[0].strip()  # a trailing comment
            m = START.search(line)
            if not m or "..." in m.group(1):  # "torchrun ... -m benchbatch ...": a pattern
                continue
            args = [a for a in shlex.split(m.group(1)) if a not in (">", "2>&1")]
            if args and not args[0].startswith("-"):  # `benchbatch --help`: the app's own
                found.append((path.name, line, args))
    return found


FOUND = commands()


def test_the_docs_show_commands():
    assert len(FOUND) >= 40  # the extraction still finds them
    names = {args[0] for _, _, args in FOUND}
    assert {"phases", "sweep", "occupancy", "reproduce", "serve-sweep", "serve"} <= names


@pytest.mark.parametrize(("where", "line", "args"), FOUND, ids=[f"{f}:{a[0]}" for f, _, a in FOUND])
def test_each_documented_command_line_parses(where, line, args):
    group = typer.main.get_command(app)
    command = group.commands.get(args[0])
    assert command is not None, f"{where}: {line!r} names no command {args[0]!r}"
    try:  # typer's own click (typer._click) raises its own classes: told apart by name
        command.make_context(args[0], args[1:])
    except Exception as e:  # noqa: BLE001
        if type(e).__name__ != "Exit":  # --help, --version
            said = e.format_message() if hasattr(e, "format_message") else repr(e)
            pytest.fail(f"{where}: {line!r}: {said}")
