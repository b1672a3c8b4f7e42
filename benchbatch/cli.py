"""The command line: a thin typer app. Each command lives in benchbatch/commands/."""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from benchbatch.commands import (
    ablation,
    compare,
    occupancy,
    phases,
    piggyback,
    probe,
    reproduce,
    sweep,
)
from benchbatch.commands.common import check_numbers, interrupts_raise
from benchbatch.errors import UserError

try:  # recent typer vendors its own click; older ones use click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors


class BenchGroup(TyperGroup):
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
app.command("occupancy")(occupancy.occupancy)
app.command("phases")(phases.phases)
app.command("probe")(probe.probe)
app.command("sweep")(sweep.sweep)
app.command("reproduce")(reproduce.reproduce)
app.command("compare")(compare.compare)
app.command("ablation")(ablation.ablation)
app.command("piggyback")(piggyback.piggyback)


@app.callback()
def _root() -> None:
    """Measure on your own hardware why LLM inference is served in batches."""


def main() -> None:
    app()
