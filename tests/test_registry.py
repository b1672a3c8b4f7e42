"""Experiments are registered once and the command line is made from them: a new experiment
package (options, a run module, a view) becomes a command with no edit to the CLI; options
name only fields that exist."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from benchbatch import experiments
from benchbatch.app import registry, views
from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import Use, use

COMMANDS = ("phases", "sweep", "occupancy", "reproduce", "probe", "ablation", "piggyback",
            "serve-sweep", "serve", "compare", "project")  # fmt: skip


def test_every_command_is_one_registered_experiment_with_a_view():
    found = registry.registered()
    assert tuple(e.name for e, _ in found) == COMMANDS  # --help's order
    for experiment, view in found:
        assert callable(view.show) and callable(view.document), experiment.name
        assert experiment.help.strip(), experiment.name
        assert experiment.runs.startswith("benchbatch.experiments."), experiment.name


def test_several_ranks_is_a_property_of_the_experiment():
    assert set(registry.several_ranks()) == {"phases", "sweep", "occupancy", "ablation", "probe"}


def test_use_refuses_a_field_that_does_not_exist():
    with pytest.raises(ValueError, match="no field 'slot'"):
        use(WorkloadOptions, only=("requests", "slot"))
    with pytest.raises(ValueError, match="no field 'thread'"):
        use(RunOptions, skip=("thread",))
    with pytest.raises(ValueError, match="no field 'medain'"):
        Use(WorkloadOptions, defaults={"medain": 1.0})
    assert [f.name for f in use(RunOptions, only=("out", "force")).fields()] == ["out", "force"]


def test_options_are_data_building_lives_in_the_runtime():
    """ModelOptions and RunOptions hold values and checks; building the model and joining the
    process group are the runtime session's (benchbatch/runtime/session.py)."""
    assert not hasattr(ModelOptions, "build") and not hasattr(RunOptions, "target")
    for cls in (ModelOptions, RunOptions, WorkloadOptions):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


EXPERIMENT = '''
from benchbatch.core.options import RunOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from {pkg}.options import HelloOptions

EXPERIMENT = Experiment(
    name="hello",
    help="Say hello a few times (a test's experiment).",
    options=(HelloOptions, use(RunOptions, only=("out", "force", "json_out"))),
    runs="{pkg}.run",
)
'''
OPTIONS = '''
from dataclasses import dataclass
from benchbatch.core.optkit import check_count, opt

@dataclass(frozen=True)
class HelloOptions:
    times: int = opt(2, "How many rows.")

    def __post_init__(self):
        check_count("times", self.times, 1, 10)
'''
RUN = '''
from benchbatch.output.recorder import Recorder
from benchbatch.output.run_folder import create


def open_run(opts, run):
    return create(Recorder, run.out, run.force, "hello", {"options": {"times": opts.times}})


def measure_run(rec, opts, run):
    rec.note("saying hello")
    rec.record("hello", ({"i": i, "word": "hello"} for i in range(opts.times)), timed=False)
'''
VIEW = '''
def document(rec):
    return {"rows": rec.rows("hello")}


def show(rec):
    print(f"{len(rec.rows('hello'))} hellos in {rec.folder}")
'''


def test_a_new_experiment_is_a_command_with_no_edit_to_the_cli(tmp_path, monkeypatch):
    """A package under experiments/ and a view of the same name: registered, given its
    options as flags (checked: one line and exit 2), run through the one runner."""
    pkg = tmp_path / "hello"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(EXPERIMENT.format(pkg="hello")))
    (pkg / "options.py").write_text(textwrap.dedent(OPTIONS))
    (pkg / "run.py").write_text(textwrap.dedent(RUN))
    (tmp_path / "views").mkdir()
    (tmp_path / "views" / "hello.py").write_text(textwrap.dedent(VIEW))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(experiments, "__path__", [*experiments.__path__, str(tmp_path)])
    monkeypatch.setattr(views, "__path__", [*views.__path__, str(tmp_path / "views")])
    monkeypatch.setitem(sys.modules, "benchbatch.experiments.hello", __import__("hello"))
    found = {e.name: (e, v) for e, v in registry.registered()}
    assert "hello" in found and set(COMMANDS) <= set(found)

    from benchbatch.app.cli import BenchCommand, BenchGroup

    app = typer.Typer(cls=BenchGroup, add_completion=False)
    app.command("hello", cls=BenchCommand)(registry.command_of(*found["hello"]))
    app.command("other", cls=BenchCommand)(lambda: None)  # a group of two: `hello` is named
    runner = CliRunner()
    done = runner.invoke(app, ["hello", "--times", "3", "--out", str(tmp_path / "run")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "run" / "hello.csv").read_text().count("hello") == 3
    assert "3 hellos" in done.output
    bad = runner.invoke(app, ["hello", "--times", "0", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--times: must be at least 1" in bad.output
