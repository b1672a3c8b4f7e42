"""Explicit sizes mean what they say (issue 28, item 3): --hidden/--layers without --preset
start from the article preset on any device (its heads, MLP, vocabulary), the shape built is
named for what it is, and a long run's estimate offers shorter ones with their durations."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from benchbatch.app.cli import app
from benchbatch.core import accounting
from benchbatch.core.config import preset, swiglu_intermediate
from benchbatch.core.options import ModelOptions
from benchbatch.runtime import estimate, session, steps

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = SimpleNamespace(device=torch.device("cpu"))
CUDA = SimpleNamespace(device=torch.device("cuda"))


def test_the_articles_command_builds_the_article_on_a_cpu():
    cfg = session.shape(ModelOptions(hidden=2048, layers=12), CPU)
    assert cfg == preset("article")  # its 16 heads, MLP 5,632 and 32,000-token vocabulary
    assert cfg.heads == 16 and cfg.intermediate == 5632 and cfg.name == "article"


def test_other_sizes_start_from_the_article_and_are_named_for_what_they_are():
    cfg = session.shape(ModelOptions(hidden=1024, layers=2), CPU)
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads) == (1024, 2, 16, 16)
    assert cfg.vocab == 32000 and cfg.intermediate == swiglu_intermediate(1024) == 2816
    assert cfg.name == "article with hidden 1024, layers 2"
    # A size equal to the article's is no change.
    assert session.shape(ModelOptions(layers=12, vocab=32000), CPU).name == "article"
    # Same on CUDA (the article is its default anyway).
    assert session.shape(ModelOptions(hidden=1024, layers=2), CUDA) == cfg


def test_a_preset_given_is_the_start_and_the_default_stays_without_sizes():
    cfg = session.shape(ModelOptions(preset="cpu-small", hidden=1024), CPU)
    assert cfg.heads == 8 and cfg.name == "cpu-small with hidden 1024"
    assert session.shape(ModelOptions(), CPU) == preset("cpu-small")
    assert session.shape(ModelOptions(preset="tiny"), CPU) == preset("tiny")
    # --max-context alone shortens the device's default model, it makes no model of its own.
    short = session.shape(ModelOptions(max_context=1024), CPU)
    assert short.hidden == 512 and short.name == "cpu-small with max context 1024"


def test_the_note_says_which_shape_is_built():
    note = session.preset_note(ModelOptions(hidden=1024, layers=2), CPU)
    assert note.startswith("building article with hidden 1024, layers 2 (hidden 1024, 2 layers")
    assert "16 heads" in note and "vocabulary 32,000" in note and "--preset" in note
    assert "cpu-small" in session.preset_note(ModelOptions(), CPU)
    assert session.preset_note(ModelOptions(preset="tiny"), CPU) is None


FAST = ["--repeats", "1", "--min-time", "0", "--device", "cpu", "--no-roofline"]
LISTS = ["--prefill", "8", "--decode-batch", "1", "--context", "8"]


def test_metadata_names_the_shape_built(runner, tmp_path):
    out = tmp_path / "run"
    args = ["phases", "--hidden", "64", "--layers", "1", "--vocab", "512", *FAST, *LISTS]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    c = meta["config"]
    assert c["name"] == "article with hidden 64, layers 1, vocab 512"
    assert (c["heads"], c["hidden"], c["layers"], c["vocab"]) == (16, 64, 1, 512)
    assert c["intermediate"] == swiglu_intermediate(64)
    assert "building article with hidden 64, layers 1, vocab 512" in " ".join(result.stderr.split())


def test_layers_for_a_limit_by_hand():
    cfg = preset("article")  # 12 layers
    # A run that costs 50 s a layer: 3 layers fit 180 s; nothing fits 10 s: two layers.
    assert estimate.fewest_layers(cfg, lambda c: 50.0 * c.layers, 180) == 3
    assert estimate.fewest_layers(cfg, lambda c: 50.0 * c.layers, 10) == 2
    assert estimate.fewest_layers(cfg.replace(layers=2), lambda c: 99.0 * c.layers, 1) == 1
    assert estimate.fewest_layers(cfg.replace(layers=1), lambda c: 1.0, 1) is None
    runs = estimate.smaller_models(cfg, lambda c: 50.0 * c.layers, 180, preset("cpu-small"))
    assert runs == [("--layers 3", 150.0), ("--preset cpu-small", 200.0)]


def test_a_long_run_offers_fewer_layers_and_cpu_small_with_their_durations(
    runner, tmp_path, monkeypatch
):
    slow = estimate.Rates(1e-6, 1e-6, 50.0, 900.0, 32, 8)  # 1 MFLOP/s, 1 MB/s: hours
    monkeypatch.setattr(estimate, "measure_rates", lambda *args: slow)
    out = tmp_path / "run"
    # Larger than cpu-small (a wide vocabulary), two layers: a model the CPU builds quickly.
    shape = ["--hidden", "256", "--layers", "2", "--vocab", "131072"]
    result = runner.invoke(app, ["phases", *shape, *FAST, *LISTS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    meta = json.loads((out / "metadata.json").read_text())
    runs = {r["flags"]: r["estimated_s"] for r in meta["estimate"]["smaller_models"]}
    assert set(runs) == {"--layers 1", "--preset cpu-small"}
    total = meta["estimate"]["estimated_s"]
    for flags, seconds in runs.items():  # said only where it is a shorter run (under 3/4)
        assert (f"{flags} (about" in err) == (seconds < 0.75 * total), (flags, seconds, total)
    # Each priced by hand: every planned step's FLOPs and bytes at 1 us each, as timed.
    cfg = session.shape(ModelOptions(hidden=256, layers=2, vocab=131072), CPU)
    plan = [steps.prefill(1, 8), steps.decode(1, 8)]

    def by_hand(c) -> float:
        total = 0.0
        for s in plan:
            cost = accounting.step_cost(c, "fp32", s.batch, s.tokens, s.context)
            step_s = (cost.flops + cost.bytes) * 1e-6
            total += (2 + 1) * step_s  # the default warm-up (2) and one repeat
        return total

    assert meta["estimate"]["steps"] == len(plan)
    assert meta["estimate"]["estimated_s"] == pytest.approx(by_hand(cfg), rel=1e-9)
    assert runs["--layers 1"] == pytest.approx(by_hand(cfg.replace(layers=1)), rel=1e-9)
    assert runs["--preset cpu-small"] == pytest.approx(by_hand(preset("cpu-small")), rel=1e-9)


def test_fewer_layers_is_offered_only_where_the_run_is_shorter(runner, tmp_path, monkeypatch):
    """Where the layers are most of the run, --layers 1 is offered; where the LM head is
    (the test above: --layers 1 at 95% of the run, cpu-small longer), nothing is."""
    slow = estimate.Rates(1e-6, 1e-6, 50.0, 900.0, 32, 8)
    monkeypatch.setattr(estimate, "measure_rates", lambda *args: slow)
    out = tmp_path / "run"
    shape = ["--hidden", "256", "--layers", "8", "--vocab", "256"]  # the layers, mostly
    result = runner.invoke(app, ["phases", *shape, *FAST, *LISTS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    runs = {r["flags"]: r["estimated_s"] for r in meta["estimate"]["smaller_models"]}
    layers = [f for f in runs if f.startswith("--layers")]
    assert len(layers) == 1 and runs[layers[0]] < 0.75 * meta["estimate"]["estimated_s"]
    assert f"{layers[0]} (about" in " ".join(result.stderr.split())
