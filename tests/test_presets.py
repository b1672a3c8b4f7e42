"""Every preset works with every command's defaults: each command's own checks pass for
each preset (the run itself is stopped where the run folder would be made)."""

from __future__ import annotations

import pytest

from benchbatch.app.cli import app
from benchbatch.core.config import PRESETS

COMMANDS = [
    ["phases"],
    ["sweep"],
    ["piggyback"],
    ["occupancy", "--engine", "real"],
    ["ablation"],
    ["ablation", "--engine", "real"],
    ["reproduce"],
    ["reproduce", "--engine", "real"],
]


class Checked(Exception):
    """Every check passed: the command went on to make its run folder."""


@pytest.fixture
def stop_at_the_folder(monkeypatch):
    from benchbatch.output.recorder import Recorder
    from benchbatch.runtime import device

    def opened(*args, **kwargs):
        raise Checked

    monkeypatch.setattr(Recorder, "open", opened)
    # The largest presets need more memory than a test machine has: that refusal is the
    # machine's, not the defaults'.
    monkeypatch.setattr(device, "free_memory_bytes", lambda dev: 2**50)


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_each_preset_passes_each_commands_checks_with_its_defaults(
    runner, stop_at_the_folder, command, preset
):
    result = runner.invoke(app, [*command, "--preset", preset, "--device", "cpu"])
    assert isinstance(result.exception, Checked), result.output
