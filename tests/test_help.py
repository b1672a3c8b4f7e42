"""Honest help: a flag is shown as a flag (no value type), --help included."""

from __future__ import annotations

import dataclasses

import pytest

from benchbatch.app.cli import app
from benchbatch.core.options import RunOptions, flag_of
from benchbatch.experiments.occupancy.options import OccupancyOptions
from benchbatch.experiments.sweep.options import SweepOptions

COMMANDS = ["phases", "sweep", "occupancy", "reproduce", "probe", "ablation", "piggyback",
            "compare"]  # fmt: skip


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["root", *COMMANDS])
def test_no_flag_is_shown_as_taking_a_value(runner, command):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    line = next(x for x in result.stdout.splitlines() if "--help" in x)
    assert "Show this message and exit." in line


OWN = {"sweep": SweepOptions, "occupancy": OccupancyOptions}


@pytest.mark.parametrize("command", COMMANDS)
def test_boolean_options_are_flags(runner, command):
    out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
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
