"""The command line: a thin typer app, one command per registered experiment (app/registry.py)."""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import signal
import sys
import threading
import time
import types

from benchbatch.app import plotting_env

# matplotlib's folder and backend were set by that import, before anything imports it.
BACKEND_NOTE = plotting_env.BACKEND_NOTE

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

from benchbatch import signals  # noqa: E402
from benchbatch.app import help as help_view  # noqa: E402
from benchbatch.app import registry  # noqa: E402
from benchbatch.core import ranks  # noqa: E402
from benchbatch.core.inputs import check_paths  # noqa: E402
from benchbatch.core.optkit import check_numbers  # noqa: E402
from benchbatch.errors import (  # noqa: E402
    Interrupted,
    OutputFailed,
    UserError,
    WriteFailed,
    one_line,
)
from benchbatch.output import run_folder as runs  # noqa: E402
from benchbatch.output.recorder import interrupts_raise  # noqa: E402
from benchbatch.output.run_folder import abandon, kept  # noqa: E402
from benchbatch.runtime import distributed  # noqa: E402

try:  # recent typer vendors its own click; older ones use click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors


HELP_ALL = "benchbatch.help_all"  # ctx.meta: --help-all asked for the whole help


def _show_version(ctx, param, value) -> None:
    if value and not ctx.resilient_parsing:
        typer.echo(help_view.version_line())
        ctx.exit()


def _show_all(ctx, param, value) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta[HELP_ALL] = True
        typer.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


def _flag_option(names: list[str], help: str, callback):
    """An eager flag that answers and exits, made as typer makes --help (a TyperOption, so
    its help lists it). Typer's own click (typer._click, typer 0.26 and later) takes the names
    as one list, plain click (older typers) one by one, and only typer 0.29 on has a type
    descriptor for a flag: each is asked of what is installed, not assumed by version."""
    try:  # recent typer vendors its own click
        from typer._click.decorators import option
    except ImportError:  # pragma: no cover - older typer over plain click
        from click import option
    extra = {}
    try:
        from typer._coercion import bool_flag_type_descriptor

        extra = {"type_descriptor": bool_flag_type_descriptor()}
    except ImportError:  # pragma: no cover - a typer without it (the GPU image's)
        pass
    first = next(iter(inspect.signature(option).parameters.values()))
    args = tuple(names) if first.kind is inspect.Parameter.VAR_POSITIONAL else (names,)
    holder = types.SimpleNamespace(params=[])  # what the decorator appends its option to
    option(*args, is_flag=True, expose_value=False, is_eager=True, help=help,
           callback=callback, metavar="", **extra)(holder)  # fmt: skip
    return (getattr(holder, "__click_params__", None) or holder.params)[0]  # click's, typer's


class HelpIsAFlag:
    """--help (and -h) takes no value: shown as a flag, as every boolean option is (typer
    would list it with a <bool> type). Beside it, on the group and every command: --help-all
    (every option, each with its whole help) and --version."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def get_params(self, ctx):
        extra = getattr(self, "_answer_options", None)
        if extra is None:  # made once: click orders eager callbacks by the objects
            extra = self._answer_options = [
                _flag_option(["--help-all"], "Every option, each with its whole help.", _show_all),
                _flag_option(["--version"], "benchbatch's and torch's versions.", _show_version),
            ]
        return [*super().get_params(ctx), *extra]


class BenchCommand(HelpIsAFlag, TyperCommand):
    """--help: the command's first paragraph, its own options one row each, the shared ones
    named once (about 60 lines); --help-all: typer's whole help."""

    def format_help(self, ctx, formatter):
        if ctx.meta.get(HELP_ALL) or self.rich_markup_mode is None:
            return super().format_help(ctx, formatter)
        from typer import rich_utils

        help_view.render_short(self, ctx, rich_utils._get_rich_console())


class BenchGroup(HelpIsAFlag, TyperGroup):
    """Every user error ends as one line on stderr naming the option, and exit code 2; Ctrl-C
    or SIGTERM at any moment as one line saying where the rows are, and exit code 130."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        for command in self.commands.values():
            _check_numbers_first(command)
        try:
            with interrupts_raise():
                code = self._main(args, prog_name, complete_var, **extra)
        except KeyboardInterrupt:  # between two `with` blocks, or while a line was printed
            _ignore_signals()  # exiting now: a second Ctrl-C cannot cut the last writes short
            code = interrupted(None)
        if code in (0, 2):  # done, or an error every rank agreed on: leave the group cleanly
            distributed.stop()
        if standalone_mode:
            _exit(code)
        return code

    def _main(self, args, prog_name, complete_var, **extra) -> int:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            if code == 130:  # typer's answer to a KeyboardInterrupt it caught: say where
                return interrupted(None)
            return code if isinstance(code, int) else 0
        except UserError as e:
            return _failed(f"{e.option}: {e.message}", 2, e)
        except WriteFailed as e:
            return _failed(str(e), 1, e)
        except OutputFailed as e:
            return _failed(_output_lost(e), 1, e)
        except Interrupted as e:
            return interrupted(e.folder)
        except click_errors.NoArgsIsHelpError as e:
            return e.exit_code  # the help was printed: nothing else to say
        except click_errors.UsageError as e:
            return _fail(usage_line(e), e.exit_code)
        except click_errors.ClickException as e:
            return _fail(e.format_message(), e.exit_code)
        except typer.Abort:  # click's word for Ctrl-C
            return interrupted(None)
        except BrokenPipeError:  # stdout's reader went away (`| head`): nothing to say
            _silence_stdout()
            return 0
        except OSError as e:
            if e.errno not in OUTPUT_ERRNOS:
                abandon("failed", e)
                raise
            # typer wrote --help (or click a usage line) straight to a stream that refused it
            return _failed(f"cannot write the output: {e.strerror or e}", 1, e)
        except Exception as e:  # a bug: its traceback, and no run left marked running
            if _rank_left(e):  # under torchrun: another rank is gone, not a bug here
                return _peer_lost(e)
            abandon("failed", e)
            raise


# A stream that refuses what is written to it: a full disk, a device error, a closed pipe.
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EPIPE, errno.EBADF, errno.EDQUOT)


def _output_lost(e) -> str:
    """stdout refused the output: one line, saying where the run's results are."""
    run = runs.last_run
    if run is not None and run.meta.get("status") == "complete":
        return f"{e} (the run is complete: its results are in {run.folder})"
    return str(e)


def usage_line(e) -> str:
    """The option parser's complaint as 'OPTION: what is wrong', as every other error."""
    param = getattr(e, "param", None)
    name = getattr(e, "option_name", None)
    if param is not None:
        opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        if opts and param.param_type_name == "option":
            name = opts[0]
        else:  # an argument: its metavar (RUN_DIR)
            name = getattr(param, "metavar", None) or (param.name or "argument").upper()
    text = e.message.strip()
    if isinstance(e, click_errors.MissingParameter):
        text = "missing"
    for prefix in ("Value error, ", "Input should be "):
        text = text.replace(prefix, "must be " if prefix.startswith("Input") else "")
    if name is None:
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
        return text + hint
    text = text.replace(f"Option '{name}' requires an argument.", "needs a value")
    if isinstance(e, click_errors.NoSuchOption):
        maybe = sorted(getattr(e, "possibilities", None) or [])
        text = "no such option" + (f" (did you mean {' or '.join(maybe)}?)" if maybe else "")
    return f"{name}: {text.split(', unable to parse')[0]}"


def interrupted(folder) -> int:
    """Ctrl-C or SIGTERM: every open run marked interrupted, one line saying where."""
    folders = abandon("interrupted")
    if folder is not None or folders:
        where = folder if folder is not None else folders[0]
        line = f"interrupted: {kept(where)}"
    elif runs.last_run is not None and runs.last_run.meta.get("status") != "complete":
        line = f"interrupted: {kept(runs.last_run.folder)}"
    elif runs.last_run is not None:
        line = f"interrupted after the run was written: its results are in {runs.last_run.folder}"
    else:
        line = "interrupted: nothing was written"
    if ranks.is_writer():  # under torchrun the folder is rank 0's: one line, not one each
        _echo(line)
    return 130


def _failed(message: str, code: int, error: BaseException) -> int:
    """An error outside a run's `with` block: a run it leaves open is marked failed."""
    abandon("failed", error)
    return _fail(message, code)


def _exit(code: int) -> None:
    """Exit with the code decided: a signal from now on cannot change it (no 143)."""
    _ignore_signals()
    try:
        if sys.stdout is not None:  # None: started with stdout closed
            sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _silence_stdout()
    except OSError as e:  # the output's last bytes were refused (`> /dev/full`)
        _silence_stdout()
        if code == 0:
            code = _fail(_output_lost(OutputFailed(e)), 1)
    if signals.AS_PROGRAM and (code == signals.INTERRUPTED or signals.SIGNALLED):
        signals.exit_now(code)
    sys.exit(code)


def _ignore_signals() -> None:
    """The program is ending: no signal may change its exit code now (a library user's
    process, the tests', keeps its handlers)."""
    if signals.AS_PROGRAM and threading.current_thread() is threading.main_thread():
        for sig in signals.HELD:
            signal.signal(sig, signal.SIG_IGN)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _check_numbers_first(command) -> None:
    """Before any command runs: no NaN, infinity or integer past 64 bits in its options."""
    run = command.callback
    if run is None or getattr(run, "numbers_checked", False):
        return
    names = {p.name: p.opts[0] for p in command.params if p.opts}
    shown = {p.name: _shown(p) for p in command.params if p.opts}

    def checked(**values):
        check_numbers(values, names)
        check_paths(values, shown)
        # -0.0 means 0 (numpy's lognormal refuses a sigma with the sign bit set).
        values = {k: v + 0.0 if type(v) is float else v for k, v in values.items()}
        return run(**values)

    checked.numbers_checked = True
    command.callback = checked


def _shown(param) -> str:
    """A parameter as the user wrote it: --option, or an argument's metavar (RUN_DIR)."""
    if getattr(param, "param_type_name", "") == "argument":
        return param.metavar or (param.name or "argument").upper()
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def _rank_left(error: BaseException) -> bool:
    """A lost connection once the ranks had joined (a rendezvous that failed before is not
    another rank leaving: its traceback says what it is)."""
    return ranks.peer_lost(error) and distributed.current().distributed


def _peer_lost(error: BaseException) -> int:
    """A collective failed because another rank left: one line, the run marked failed with
    its rows kept."""
    folders = abandon("failed", error)
    left = f": {kept(folders[0])}" if folders else ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return _fail(f"another rank left the run ({first[:160]}){left}", 1)


def _fail(message: str, code: int) -> int:
    """One error line: rank 0's under torchrun; another rank's only after its grace
    (ranks.error_grace_s: rank 0, failing alike meanwhile, says it, and torchrun ends this
    rank unsaid)."""
    if ranks.is_writer() or not ranks.sensible():  # no rank 0 to say it for a bad RANK
        _echo(f"Error: {message}")
        return code
    try:
        time.sleep(ranks.error_grace_s())
    except KeyboardInterrupt:  # torchrun ending this rank: rank 0 has said it
        return code
    _echo(f"Error (rank {ranks.rank()}): {message}")
    return code


def _echo(line: str) -> None:
    """One line on stderr, whatever its encoding and whatever the line holds."""
    line = one_line(line)
    try:
        typer.echo(line, err=True)
    except (UnicodeEncodeError, OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.buffer.write(line.encode("ascii", "backslashreplace") + b"\n")
            sys.stderr.flush()


app = typer.Typer(
    cls=BenchGroup,
    help="Measure on your own hardware why LLM inference is served in batches.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
# One command per registered experiment, in the order a reader meets them (the three
# measurements first); each runs through registry.run and shows its own view.
EXPERIMENTS = registry.registered()
for _experiment, _view in EXPERIMENTS:
    app.command(_experiment.name, cls=BenchCommand)(registry.command_of(_experiment, _view))

# Commands that run under torchrun (tensor parallelism, or the interconnect's ceiling).
SEVERAL_RANKS = tuple(e.name for e, _ in EXPERIMENTS if e.several_ranks)


@app.callback()
def _root(ctx: typer.Context) -> None:
    """Measure on your own hardware why LLM inference is served in batches."""
    command = ctx.invoked_subcommand
    if ranks.world_size() > 1 and command not in SEVERAL_RANKS:
        raise UserError(
            "torchrun",
            f"{command} runs in one process; launch it without torchrun (under torchrun: "
            f"{', '.join(SEVERAL_RANKS)})",
        )


def main() -> None:
    signals.prepare()
    if BACKEND_NOTE is not None and ranks.is_writer():
        _echo(BACKEND_NOTE)
    app()
