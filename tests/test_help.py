"""Honest help: a flag is shown as a flag (no value type), --help included."""

from __future__ import annotations

import dataclasses

import pytest

from benchbatch.app.cli import app
from benchbatch.core.options import RunOptions
from benchbatch.core.optkit import flag_of
from benchbatch.experiments.occupancy.options import OccupancyOptions
from benchbatch.experiments.sweep.options import SweepOptions

COMMANDS = ["phases", "sweep", "occupancy", "reproduce", "probe", "ablation", "piggyback",
            "compare"]  # fmt: skip


@pytest.mark.parametrize("asked", ["--help", "--help-all"])
@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["root", *COMMANDS])
def test_no_flag_is_shown_as_taking_a_value(runner, command, asked):
    result = runner.invoke(app, [*command, asked], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    line = next(x for x in result.stdout.splitlines() if "--help " in x)
    assert "Show this message and exit." in line


OWN = {"sweep": SweepOptions, "occupancy": OccupancyOptions}


@pytest.mark.parametrize("command", COMMANDS)
def test_boolean_options_are_flags(runner, command):
    out = runner.invoke(app, [command, "--help-all"], env={"COLUMNS": "200"}).stdout
    fields = dataclasses.fields(RunOptions) + dataclasses.fields(OWN.get(command, RunOptions))
    flags = {flag_of(f).split("/")[0] for f in fields if f.type == "bool"}
    checked = 0
    for flag in flags:
        rows = [x for x in out.splitlines() if f" {flag} " in x]
        if not rows:  # a field this command does not take
            continue
        words = rows[0].split(flag, 1)[1].split()
        assert not words[0].startswith("<") and not words[1].startswith("<"), rows[0]
        checked += 1
    assert checked >= 2  # --force and --json at least


# --- short help, --help-all, -h and --version ----------------------------------------------

import importlib.metadata  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import typer  # noqa: E402

from benchbatch.app import help as help_view  # noqa: E402
from benchbatch.app.registry import registered  # noqa: E402

ALL = [e.name for e, _ in registered()]
SHARED = set(help_view.SHARED_PANELS)


def _params(command):
    return typer.main.get_command(app).commands[command].params


def _visible(command):
    return [p for p in _params(command) if not getattr(p, "hidden", False)]


def _flag(param) -> str:
    if param.param_type_name == "argument":
        return param.metavar or param.name.upper()
    return next(o for o in param.opts if o.startswith("--"))


@pytest.mark.parametrize("command", ALL)
def test_help_is_at_most_60_lines_and_names_every_visible_option(runner, command, monkeypatch):
    """At 100 columns, whatever the command: the own options one row each, the shared ones
    named in one panel; every option a user can give is still named."""
    monkeypatch.setattr(help_view, "cuda_possible", lambda: True)  # the longest help
    out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"}).stdout
    assert len(out.splitlines()) <= help_view.MAX_LINES, out
    for param in _visible(command):
        assert _flag(param) in out, _flag(param)
    assert out.count("╭─ Shared by the commands") <= 1


@pytest.mark.parametrize("command", ALL)
def test_help_all_lists_every_option_with_its_whole_help(runner, command, monkeypatch):
    monkeypatch.setattr(help_view, "cuda_possible", lambda: False)  # --help-all shows them anyway
    out = runner.invoke(app, [command, "--help-all"], env={"COLUMNS": "250"}).stdout
    short = runner.invoke(app, [command, "--help"], env={"COLUMNS": "250"}).stdout
    assert len(out.splitlines()) > len(short.splitlines())
    words = _plain(out.replace("│", " "))
    for param in _visible(command):
        assert _flag(param) in out, _flag(param)
        if param.param_type_name == "option" and param.help:  # the whole text, not a cut
            assert _plain(param.help) in words, param.name


def _plain(text: str) -> str:
    """Words as markdown shows them: no code quotes, no <tag> (markdown takes '<ID>' for
    one and shows nothing)."""
    return " ".join(re.sub(r"<[^>\s]*>", "", text.replace("`", "")).split())


def test_help_of_serve_sweep_at_100_columns_as_a_user_types_it():
    """The measure of the issue, run as a program: `python -m benchbatch.app.start
    serve-sweep --help` (its largest help) within 60 lines."""
    env = {**__import__("os").environ, "COLUMNS": "100", "BENCHBATCH_SHOW_ALL": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "benchbatch.app.start", "serve-sweep", "--help"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert 20 < len(result.stdout.splitlines()) <= 60
    assert "--slo-ttft" in result.stdout and "--help-all" in result.stdout


HIDDEN = {
    "serve-sweep": ["--slo-ttft-s", "--slo-tpot-s", "--median", "--sigma"],
    "ablation": ["--slo-ttft-s", "--slo-tbt-s", "--arrival-rate", "--median", "--sigma"],
    "occupancy": ["--arrival-rate", "--median", "--sigma", "--max-num-seqs"],
    "sweep": ["--batch", "--median", "--sigma"],
    "project": ["--allreduce-latency-us"],
    "reproduce": ["--batch", "--real", "--probe-sizes"],
}


@pytest.mark.parametrize("command", sorted(HIDDEN))
def test_old_spellings_never_show(runner, command):
    params = {o for p in _params(command) if p.hidden for o in p.opts}
    for flag in HIDDEN[command]:
        assert flag in params, flag  # still taken...
        for asked in ("--help", "--help-all"):  # ...and never shown
            out = runner.invoke(app, [command, asked], env={"COLUMNS": "200"}).stdout
            assert f"{flag} " not in out and f"{flag}\n" not in out, (asked, flag)


def test_cuda_only_options_are_shown_only_where_cuda_may_be(runner, monkeypatch):
    for possible in (False, True):
        monkeypatch.setattr(help_view, "cuda_possible", lambda p=possible: p)
        out = runner.invoke(app, ["phases", "--help"], env={"COLUMNS": "100"}).stdout
        assert ("--cuda-graphs" in out) is possible
        assert "--compile" in out  # torch.compile runs on a CPU too
        everything = runner.invoke(app, ["phases", "--help-all"], env={"COLUMNS": "200"})
        assert "--cuda-graphs" in everything.stdout


def test_cuda_is_guessed_without_torch(monkeypatch, tmp_path):
    monkeypatch.delenv(help_view.SHOW_ALL_ENV, raising=False)
    monkeypatch.setattr(help_view, "NVIDIA_DEVICE", str(tmp_path / "nvidia0"))
    monkeypatch.setattr(help_view.shutil, "which", lambda name: None)
    assert help_view.cuda_possible() is False
    (tmp_path / "nvidia0").write_text("")
    assert help_view.cuda_possible() is True
    (tmp_path / "nvidia0").unlink()
    monkeypatch.setattr(help_view.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert help_view.cuda_possible() is True
    monkeypatch.setattr(help_view.shutil, "which", lambda name: None)
    for value, shown in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv(help_view.SHOW_ALL_ENV, value)
        assert help_view.cuda_possible() is shown


@pytest.mark.parametrize("command", [[], *([c] for c in ALL)], ids=["root", *ALL])
def test_dash_h_is_help_and_version_answers_everywhere(runner, command):
    env = {"COLUMNS": "100"}
    assert (
        runner.invoke(app, [*command, "-h"], env=env).stdout
        == runner.invoke(app, [*command, "--help"], env=env).stdout
    )
    result = runner.invoke(app, [*command, "--version"])
    assert result.exit_code == 0
    want = (
        f"benchbatch {importlib.metadata.version('benchbatch')} "
        f"(torch {importlib.metadata.version('torch')}, "
    )
    assert result.stdout.startswith(want) and len(result.stdout.splitlines()) == 1


def test_short_help_rows_keep_their_meaning():
    """The cut: the whole help when it fits, else its first sentence, else that sentence
    without its asides."""
    text = "Requests per point (the first of them, same lengths). A point lasts at least this."
    assert help_view.first_sentence(text) == "Requests per point (the first of them, same lengths)."
    assert help_view.first_sentence("e.g. http://127.0.0.1:8000. Then") == (
        "e.g. http://127.0.0.1:8000."
    )
    assert help_view.first_sentence("No full stop, then (A. B) more") == (
        "No full stop, then (A. B) more"
    )
    assert help_view.without_brackets("Sequences served at once (KV-cache slots; vLLM's).") == (
        "Sequences served at once."
    )
    assert help_view._fold("<fixed|uniform|lognormal>", 18) == "<fixed|uniform|\nlognormal>"
    assert help_view._fold("<sim|real>", 18) == "<sim|real>"


@pytest.mark.parametrize(
    "missing",
    [(), ("typer._click.decorators", "typer._coercion")],
    ids=["typer-0.29", "plain-click"],
)
def test_the_answer_flags_build_on_every_typer_s_option_decorator(monkeypatch, missing):
    """typer 0.29's own click takes an option's names as one list and a flag's type
    descriptor; plain click (typer before 0.26) takes the names one by one and keeps the
    option in __click_params__. (0.26-0.28, the GPU image's 0.27.2, where every command
    failed on the names: their own click without the descriptor, checked by hand with each
    installed, docs/gpu.md.)"""
    import sys

    from benchbatch.app import cli

    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)  # import of it fails
    seen = []
    option = cli._flag_option(["--help-all"], "Every option.", lambda *a: seen.append(a))
    assert option.opts == ["--help-all"] and option.is_flag and option.is_eager
    assert not option.expose_value and option.help == "Every option."
    assert type(option).__module__.startswith("click" if "typer._click.decorators" in missing
                                               else "typer")  # fmt: skip


def test_a_shared_option_says_what_this_command_does_with_it(runner):
    """A field several commands share had one help everywhere: serve-sweep's --trace read
    "arrival_step" (it refuses those; it takes arrival_s, in seconds), sweep's and
    ablation's named options they do not have or a default they override."""
    def whole(command: str) -> str:
        out = runner.invoke(app, [command, "--help-all"], env={"COLUMNS": "250"}).stdout
        return _plain(out.replace("│", " "))

    serve, sweep, ablation = whole("serve-sweep"), whole("sweep"), whole("ablation")
    assert "optional prompt_tokens and arrival_s (seconds, scaled to each rate" in serve
    assert "arrival_step" not in serve.split("--trace", 1)[1][:300]
    assert "--arrivals-per-step" not in sweep
    assert "every request waits at step 0" not in ablation
    assert "the ablation's default keeps its slots busy" in ablation
    assert "every request waits at step 0" in whole("occupancy")  # its own default, as said
