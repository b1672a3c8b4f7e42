"""Issue 29, hostile input round three: the streams, signals and limits a run meets.

stderr that cannot be written (`2>/dev/full`) and a closed terminal (SIGHUP) never leave a
run marked running; stdout that cannot be written is one line and exit 1, the run whole;
paths too long for the system, memory past any machine, rates too small to mean anything
and an MPLBACKEND matplotlib refuses are one line before anything runs (or handled); the
context-overflow error names the option that made the length. Subprocess tests wait for a
line or a file, never on the wall clock."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from benchbatch.app.cli import app
from benchbatch.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 900  # a guard against a hung program, not a measure of the work (load 8 is slow)
QUICK = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", 30)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
OCCUPANCY = ["occupancy", "--requests", "20"]
# A run that prints notes on stderr between its folder's making and its `with` block.
REAL = ["occupancy", "--engine", "real", "--preset", "tiny", "--device", "cpu", "--requests",
        "4", "--slots", "2", "--median", "2", "--max-output", "4", "--prompt-len", "4"]  # fmt: skip
PHASES = ["phases", "--preset", "tiny", "--device", "cpu", "--no-roofline", "--repeats", "1"]
PHASES += ["--min-time", "0.05", "--prefill", "8,16", "--decode-batch", "1,2,3,4", "--context", "8"]


def status(folder: Path) -> str | None:
    try:
        return json.loads((folder / "metadata.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None


def one_line_error(result, option: str | None = None) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    if option is not None:
        assert lines[0].startswith(f"Error: {option}:"), lines[0]
    return lines[0]


def terminal_signals() -> None:
    """In a child before exec: Ctrl-C and SIGHUP at their defaults, as a program started
    from a terminal has them, however the suite was started (`&` leaves SIGINT ignored,
    nohup SIGHUP, and exec keeps SIG_IGN: a SIGHUP test of a suite run under nohup saw its
    program ignore the signal and exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def program(args, *, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=None, python=(),
            preexec=None) -> subprocess.Popen:  # fmt: skip
    """The program as a user runs it (python -m benchbatch) from a terminal."""

    def default_signals():
        terminal_signals()
        if preexec is not None:
            preexec()

    return subprocess.Popen(
        [sys.executable, *python, "-m", "benchbatch", *args], cwd=ROOT, stdout=stdout,
        stderr=stderr, text=True, env={**os.environ, **(env or {})},
        preexec_fn=default_signals,
    )  # fmt: skip


# --- item 3: stderr unwritable, and SIGHUP -----------------------------------------------------


def test_programs_start_with_a_terminals_signals_under_nohup():
    """A suite started under nohup (SIGHUP ignored) still starts its programs with SIGHUP
    and SIGINT at their defaults, so the SIGHUP tests below test the program, not how the
    suite was started."""
    code = ("import signal; print(signal.getsignal(signal.SIGHUP) == signal.SIG_DFL, "
            "signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             preexec_fn=terminal_signals, timeout=HANG_S).stdout  # fmt: skip
    finally:
        signal.signal(signal.SIGHUP, before)
    assert out.split() == ["True", "True"]


def test_a_run_with_stderr_on_a_full_device_ends_marked_complete(tmp_path):
    """The notes printed before the run's `with` block (the CPU's dtype, the estimate) used
    to raise OSError out of the command: exit 1, nothing said, metadata left running."""
    folder = tmp_path / "run"
    with open("/dev/full", "w") as full:
        proc = program([*REAL, "--out", str(folder)], stderr=full)
        out, _ = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, out
    assert status(folder) == "complete"
    assert f"results: {folder}" in out


def test_an_error_outside_a_runs_block_never_leaves_it_running(tmp_path, monkeypatch, runner):
    """Whatever escapes between the folder's making and the `with` block (a bug) ends the
    run failed, never running."""
    from benchbatch.app import registry

    def broken(rec):
        raise RuntimeError("a bug in a view's header")

    view = next(v for e, v in registry.registered() if e.name == "phases")
    monkeypatch.setattr(view, "before", broken, raising=False)
    folder = tmp_path / "run"
    result = runner.invoke(app, [*PHASES, "--out", str(folder)])
    assert isinstance(result.exception, RuntimeError)
    assert status(folder) == "failed"


def test_sighup_is_an_interrupt(tmp_path):
    """A closed terminal: exit 130, one line, metadata interrupted (it was killed with
    metadata running, exit -1)."""
    folder = tmp_path / "run"
    proc = program([*PHASES, "--out", str(folder)])
    for line in proc.stderr:  # the CPU note: the folder is made, the model not yet timed
        if line.startswith("note:"):
            break
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err
    # no step timed yet: the folder holds the run's metadata, and the line says only that
    # (it said rows measured so far were there)
    last = err.strip().splitlines()[-1]
    csvs = sorted(p.name for p in folder.glob("*.csv"))
    assert last == (f"interrupted: no row was measured yet: {folder} holds the run's "
                    "metadata only") if not csvs else last.startswith(
        f"interrupted: rows measured so far are in {folder} (")  # fmt: skip
    assert status(folder) == "interrupted"
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_sighup_during_the_imports_is_one_line(tmp_path):
    proc = program([*OCCUPANCY, "--out", str(tmp_path / "run")], python=("-X", "importtime"))
    started = False
    for line in proc.stderr:  # the first import that ends after benchbatch.app.start's
        if started:
            break
        started = line.rsplit("|", 1)[-1].strip() == "benchbatch.app.start"
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=HANG_S)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert said == ["interrupted while starting: nothing was run or written"], said
    assert not (tmp_path / "run").exists()


def test_sighup_ignored_from_the_start_stays_ignored(tmp_path):
    """nohup: the user asked the run to outlive its terminal."""
    folder = tmp_path / "run"
    ignore = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731
    proc = program([*PHASES, "--out", str(folder)], preexec=ignore)
    for line in proc.stderr:
        if line.startswith("note:"):
            break
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, err
    assert status(folder) == "complete" and f"results: {folder}" in out


def test_sighup_is_held_and_raised_like_sigterm():
    from benchbatch import signals

    assert signal.SIGHUP in signals.HELD and signal.SIGHUP in signals.ENDING


# --- item 14: stdout unwritable ------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--json"], ["--requests", "2", "--json"]],
                         ids=["tables", "json", "small-json"])  # fmt: skip
def test_stdout_on_a_full_device_is_one_line_and_exit_1(tmp_path, extra):
    folder = tmp_path / "run"
    with open("/dev/full", "w") as full:
        proc = program([*OCCUPANCY, *extra, "--out", str(folder)], stdout=full)
        _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("Error: cannot write the output to stdout: No space left")
    assert str(folder) in lines[0]
    assert status(folder) == "complete"


def test_a_closed_pipe_on_stdout_is_still_quiet(tmp_path):
    """`| head`: a BrokenPipeError stays a quiet exit, not the full-device line."""
    folder = tmp_path / "run"
    proc = program([*OCCUPANCY, "--out", str(folder)])
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=HANG_S)
    assert "Traceback" not in err and "cannot write the output" not in err, err
    assert status(folder) == "complete"


# --- item 11: paths too long -------------------------------------------------------------------


def path_options() -> list[tuple[str, str]]:
    """(command, flag) of every option or argument that takes a path, read from the
    signatures app/params.py made (compare's folders as RUN_DIR)."""
    out = []
    for info in app.registered_commands:
        for p in inspect.signature(info.callback).parameters.values():
            args = typing.get_args(p.annotation)
            if not args or "Path" not in str(args[0]):
                continue
            option = args[1]
            decls = getattr(option, "param_decls", None) or ()
            if isinstance(getattr(option, "default", None), str):
                decls = (option.default, *decls)
            out.append((info.name, decls[0] if decls else "RUN_DIR"))
    return sorted(set(out))


def test_the_table_of_path_options_is_not_empty():
    found = path_options()
    assert ("compare", "RUN_DIR") in found and ("occupancy", "--model") in found
    assert len(found) > 25


TOO_LONG = st.one_of(
    st.integers(256, 1000).map(lambda n: "x" * n),  # one name past NAME_MAX
    st.integers(256, 400).map(lambda n: f"a/{'é' * (n // 2 + 1)}/b"),  # in bytes, not chars
    st.integers(4096, 6000).map(lambda n: "/".join(["d" * 99] * (n // 100 + 1))),  # PATH_MAX
)


@QUICK
@given(st.data())
@example(data=None)
def test_every_path_option_refuses_a_path_too_long_in_one_line(runner, tmp_path, data):
    if data is None:  # the case
        command, flag, path = "occupancy", "--out", "x" * 300
    else:
        command, flag = data.draw(st.sampled_from(path_options()))
        path = data.draw(TOO_LONG)
    if flag == "RUN_DIR":
        args = [command, path, str(tmp_path)]
    elif command == "compare":
        args = [command, str(tmp_path / "a"), str(tmp_path / "b"), flag, path]
    else:
        args = [command, flag, path] + ([] if flag == "--out" else ["--out", str(tmp_path / "r")])
    line = one_line_error(runner.invoke(app, args), flag)
    assert "long" in line and len(line) < 300
    assert not (tmp_path / "r").exists()


def test_a_nul_in_a_path_is_one_line(runner, tmp_path):
    one_line_error(runner.invoke(app, ["occupancy", "--out", "a\x00b"]), "--out")


def test_an_index_naming_a_shard_too_long_is_one_line(tmp_path):
    from benchbatch.runtime import checkpoint

    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"embed.weight": "s" * 300 + ".safetensors"}})
    )
    with pytest.raises(UserError) as e:
        checkpoint._shards(tmp_path)
    assert e.value.option == "--model" and "names a shard" in e.value.message


# --- item 12: memory past any machine ----------------------------------------------------------


HUGE = st.floats(min_value=1.0001e15, max_value=1.7e308).map(repr)


@QUICK
@given(value=HUGE, where=st.sampled_from([("occupancy", "--kv-memory"),
                                          ("project", "--memory-gib")]))  # fmt: skip
@example(value="1e300", where=("occupancy", "--kv-memory"))
@example(value="1e300", where=("project", "--memory-gib"))
def test_memory_past_any_machine_is_refused_with_its_range(runner, tmp_path, value, where):
    command, flag = where
    result = runner.invoke(app, [command, flag, value, "--out", str(tmp_path / "r")])
    line = one_line_error(result, flag)
    assert "more than 0 and at most 1e+15 GiB" in line
    assert not (tmp_path / "r").exists()


def test_memory_up_to_the_bound_still_runs(runner, tmp_path):
    result = runner.invoke(app, ["project", "--memory-gib", "1e15", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output


# --- item 13: rates too small to mean anything --------------------------------------------------


@QUICK
@given(rate=st.floats(min_value=5e-324, max_value=9.99e-7).map(repr))
@example(rate="1e-320")
@example(rate="5e-324")
def test_a_rate_below_the_least_is_refused(rate):
    from benchbatch.experiments.serve.rates import parse_rates

    with pytest.raises(UserError) as e:
        parse_rates((rate,), "rates")
    assert e.value.option == "rates" and "less than the least rate" in e.value.message


@pytest.mark.parametrize("flag", ["--rates", "--real-rates"])
def test_a_subnormal_rate_is_refused_before_the_folder(runner, tmp_path, flag):
    folder = tmp_path / "r"
    result = runner.invoke(app, ["serve-sweep", "--engine", "sim", flag, "1e-320", "--out",
                                 str(folder)])  # fmt: skip
    one_line_error(result, flag)
    assert not folder.exists()


def test_the_least_rate_itself_is_taken():
    from benchbatch.experiments.serve.options import ServeOptions
    from benchbatch.experiments.serve.rates import parse_rates

    assert parse_rates((repr(ServeOptions.MIN_RATE_RPS),), "rates") == (1e-6,)


# --- item 15: MPLBACKEND --------------------------------------------------------------------------


def test_an_unknown_mplbackend_falls_back_to_agg_and_says_so(tmp_path):
    folder = tmp_path / "run"
    proc = program([*OCCUPANCY, "--out", str(folder)], env={"MPLBACKEND": "nonsense"})
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    notes = [line for line in err.splitlines() if "MPLBACKEND" in line]
    assert notes == ["note: MPLBACKEND='nonsense' is no matplotlib backend; figures are drawn "
                     "with Agg"]  # fmt: skip
    assert status(folder) == "complete" and (folder / "occupancy.png").is_file()


@pytest.mark.parametrize("given", ["agg", "TkAgg", "module://my.backend", ""])
def test_a_known_mplbackend_is_left_alone(monkeypatch, given):
    from benchbatch.app import plotting_env

    monkeypatch.setenv("MPLBACKEND", given)
    assert plotting_env.matplotlib_backend() is None
    assert os.environ["MPLBACKEND"] == given


# --- item 16: the option a too-long request came from -------------------------------------------


SERVE = ["serve-sweep", "--preset", "tiny", "--max-context", "32", "--requests", "10",
         "--real-requests", "4"]  # fmt: skip


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--prompt-dist", "fixed", "--prompt-len", "40", "--max-prompt", "64"], "--prompt-len"),
        (["--prompt-len", "40", "--max-prompt", "64"], "--max-prompt"),
        (["--prompt-len", "8", "--max-prompt", "16", "--median", "30", "--max-output", "64"],
         "--max-output"),
    ],
    ids=["fixed-prompt", "drawn-prompt", "output"],
)
def test_serve_sweep_names_the_option_that_made_the_length(runner, tmp_path, extra, flag):
    folder = tmp_path / "r"
    line = one_line_error(runner.invoke(app, [*SERVE, *extra, "--out", str(folder)]), flag)
    assert "--max-context 32" in line
    assert not folder.exists()


def _occupancy_check(tmp_path, **workload):
    from benchbatch.core.config import preset
    from benchbatch.core.options import WorkloadOptions
    from benchbatch.core.workload import Request
    from benchbatch.experiments.occupancy.run import _check_real

    cfg = preset("tiny").replace(max_context=32)
    prompt, output = workload.pop("prompt", 40), workload.pop("output", 2)
    requests = [Request(0, 4, 2), Request(1, prompt, output, prompt_ids=(1,) * prompt)]
    with pytest.raises(UserError) as e:
        _check_real(cfg, requests, WorkloadOptions(**workload))
    return e.value.option


def test_occupancy_names_prompts_for_a_long_line_of_prompts(tmp_path):
    assert _occupancy_check(tmp_path, prompts=tmp_path / "p.txt") == "prompts"


def test_occupancy_names_the_prompt_options(tmp_path):
    assert _occupancy_check(tmp_path) == "prompt_len"
    assert _occupancy_check(tmp_path, trace=tmp_path / "t.csv") == "trace"
    assert _occupancy_check(tmp_path, long_prompt_fraction=0.5, long_prompt_len=40) == (
        "long_prompt_len"
    )
    assert _occupancy_check(tmp_path, prompt=20, output=20) == "max_output"
