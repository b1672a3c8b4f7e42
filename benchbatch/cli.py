"""The command line: a thin typer app. Each command lives in benchbatch/commands/."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def _matplotlib_config_dir() -> None:
    """With a read-only home, matplotlib warns and rebuilds its font cache in a new temporary
    folder on every run: give it one stable folder instead (before it is imported)."""
    if os.environ.get("MPLCONFIGDIR"):
        return
    try:
        home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        (home / "matplotlib").mkdir(parents=True, exist_ok=True)
        if os.access(home / "matplotlib", os.W_OK):
            return
    except (OSError, RuntimeError):
        pass
    user = os.getuid() if hasattr(os, "getuid") else "user"
    fallback = Path(tempfile.gettempdir()) / f"benchbatch-matplotlib-{user}"
    try:
        fallback.mkdir(mode=0o700, exist_ok=True)
        mine = not hasattr(os, "getuid") or fallback.stat().st_uid == os.getuid()
    except OSError:
        return  # matplotlib makes its own temporary folder
    if mine and os.access(fallback, os.W_OK):  # not a folder another user left in /tmp
        os.environ["MPLCONFIGDIR"] = str(fallback)


_matplotlib_config_dir()

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

from benchbatch.commands import (  # noqa: E402
    ablation,
    compare,
    occupancy,
    phases,
    piggyback,
    probe,
    reproduce,
    sweep,
)
from benchbatch.commands.common import check_numbers  # noqa: E402
from benchbatch.errors import Interrupted, UserError  # noqa: E402
from benchbatch.run import interrupts_raise  # noqa: E402

try:  # recent typer vendors its own click; older ones use click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors


class HelpIsAFlag:
    """--help takes no value: shown as a flag, as every boolean option is (typer would list
    it with a <bool> type)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class BenchCommand(HelpIsAFlag, TyperCommand):
    pass


class BenchGroup(HelpIsAFlag, TyperGroup):
    """Every user error ends as one line on stderr naming the option, and exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        for command in self.commands.values():
            _check_numbers_first(command)
        try:
            with interrupts_raise():
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = code if isinstance(code, int) else 0
        except UserError as e:
            code = _fail(f"{e.option}: {e.message}", 2)
        except Interrupted as e:
            typer.echo(str(e), err=True)
            code = 130
        except click_errors.NoArgsIsHelpError as e:
            code = e.exit_code  # the help was printed: nothing else to say
        except click_errors.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
            code = _fail(e.format_message() + hint, e.exit_code)
        except click_errors.ClickException as e:
            code = _fail(e.format_message(), e.exit_code)
        except typer.Abort:
            code = _fail("aborted", 130)
        if standalone_mode:
            sys.exit(code)
        return code


def _check_numbers_first(command) -> None:
    """Before any command runs: no NaN, infinity or integer past 64 bits in its options."""
    run = command.callback
    if run is None or getattr(run, "numbers_checked", False):
        return
    names = {p.name: p.opts[0] for p in command.params if p.opts}

    def checked(**values):
        check_numbers(values, names)
        return run(**values)

    checked.numbers_checked = True
    command.callback = checked


def _fail(message: str, code: int) -> int:
    typer.echo(f"Error: {message}", err=True)
    return code


app = typer.Typer(
    cls=BenchGroup,
    help="Measure on your own hardware why LLM inference is served in batches.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
# In the order a reader meets them: the three measurements, then the rest.
app.command("phases", cls=BenchCommand)(phases.phases)
app.command("sweep", cls=BenchCommand)(sweep.sweep)
app.command("occupancy", cls=BenchCommand)(occupancy.occupancy)
app.command("reproduce", cls=BenchCommand)(reproduce.reproduce)
app.command("probe", cls=BenchCommand)(probe.probe)
app.command("ablation", cls=BenchCommand)(ablation.ablation)
app.command("piggyback", cls=BenchCommand)(piggyback.piggyback)
app.command("compare", cls=BenchCommand)(compare.compare)


@app.callback()
def _root() -> None:
    """Measure on your own hardware why LLM inference is served in batches."""


def main() -> None:
    app()
