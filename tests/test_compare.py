"""`benchbatch compare`: tiny runs merged and overlaid; mismatched or broken folders refused
with one line naming the bad file (exit code 2)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from benchbatch import compare as merging
from benchbatch.cli import app

FAST = ["--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device", "cpu"]
PHASES = [
    "phases",
    *FAST,
    "--no-roofline",
    "--prefill",
    "8,16",
    "--decode-batch",
    "1,2",
    "--context",
    "8",
]
SWEEP = ["sweep", *FAST, "--no-roofline", "--batch", "1,2", "--context", "8"]
REPRODUCE = [
    "reproduce", *FAST, "--prefill", "8,16", "--decode-batch", "1,2", "--batch", "1,2",
    "--context", "8", "--requests", "20", "--slots", "4", "--median", "5", "--max-output", "20",
    "--probe-sizes", "32", "--probe-buffer-mb", "1",
]  # fmt: skip


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two phases runs (fp32 and bf16), a sweep run and two reproduce runs."""
    root = tmp_path_factory.mktemp("runs")
    for args, name in (
        (PHASES, "fp32"),
        ([*PHASES, "--dtype", "bf16"], "bf16"),
        (SWEEP, "sweep"),
        (REPRODUCE, "repro-a"),
    ):
        result = invoke(*args, "--out", root / name)
        assert result.exit_code == 0, result.output
    shutil.copytree(root / "repro-a", root / "repro-b")
    return root


def refused(result, *names: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), lines
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert "Traceback" not in result.output
    return lines[0]


def test_two_phases_runs_merge_into_one_csv_and_overlaid_plots(runs, tmp_path):
    result = invoke("compare", runs / "fp32", runs / "bf16", "--out", tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "cmp" / "compare-phases.csv")
    assert df.columns[0] == "run" and list(df["run"].unique()) == ["fp32", "bf16"]
    assert len(df) == 8 and set(df["label"]) == {
        "prefill 8",
        "prefill 16",
        "decode b=1",
        "decode b=2",
    }
    assert (tmp_path / "cmp" / "compare-phases.png").stat().st_size > 1000
    meta = json.loads((tmp_path / "cmp" / "metadata.json").read_text())
    assert meta["command"] == "compare" and meta["status"] == "complete"
    assert [r["dtype"] for r in meta["runs"]] == ["fp32", "bf16"]
    assert "bf16 / fp32" in result.stdout


def test_labels_name_the_runs(runs, tmp_path):
    result = invoke(
        "compare", runs / "fp32", runs / "bf16", "--label", "a,b", "--out", tmp_path / "c"
    )
    assert result.exit_code == 0, result.output
    assert list(pd.read_csv(tmp_path / "c" / "compare-phases.csv")["run"].unique()) == ["a", "b"]


def test_reproduce_folders_compare_every_part(runs, tmp_path):
    result = invoke("compare", runs / "repro-a", runs / "repro-b", "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    for table in ("probe", "phases", "sweep", "occupancy"):
        df = pd.read_csv(tmp_path / "c" / f"compare-{table}.csv")
        assert list(df["run"].unique()) == ["repro-a", "repro-b"], table
        assert (tmp_path / "c" / f"compare-{table}.png").stat().st_size > 1000


def test_json_has_every_row(runs, tmp_path):
    result = invoke("compare", runs / "fp32", runs / "bf16", "--json", "--out", tmp_path / "c")
    doc = json.loads(result.stdout)
    assert len(doc["rows"]["phases"]) == 8 and len(doc["runs"]) == 2


# --- interrupted or failed while writing ------------------------------------------------------


@pytest.mark.parametrize(
    ("stop", "status", "code"),
    [(KeyboardInterrupt(), "interrupted", 130), (OSError("disk full"), "failed", 1)],
    ids=["ctrl-c", "disk-full"],
)
def test_a_compare_cut_short_says_so_and_leaves_no_temporary_file(
    runs, tmp_path, monkeypatch, stop, status, code
):
    """Cut short while drawing its figure (after the merged CSV is written): metadata.json
    says how it ended and what was written, and no half-written file is left."""
    from benchbatch.plots import compare as plots

    def half_drawn(table, names, path, title):
        path.with_name(f".{path.name}.tmp.png").write_bytes(b"\x89PNG half")
        raise stop

    monkeypatch.setattr(plots, "compare_phases_figure", half_drawn)
    out = tmp_path / "cmp"
    result = invoke("compare", runs / "fp32", runs / "bf16", "--out", out)
    assert result.exit_code == code, result.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == status and "finished_utc" in meta
    assert meta["files"] == ["compare-phases.csv"]
    assert len(pd.read_csv(out / "compare-phases.csv")) == 8
    assert sorted(p.name for p in out.iterdir()) == ["compare-phases.csv", "metadata.json"]
    if status == "interrupted":
        assert "interrupted" in result.stderr and "Traceback" not in result.output
    else:
        assert "disk full" in meta["error"]


# --- refusals ----------------------------------------------------------------------------------


def test_folders_of_different_kinds_are_refused(runs, tmp_path):
    result = invoke("compare", runs / "fp32", runs / "sweep", "--out", tmp_path / "c")
    refused(result, "different kinds", "phases", "sweep")
    assert not (tmp_path / "c").exists()


def test_a_missing_folder_is_refused(runs, tmp_path):
    refused(invoke("compare", runs / "fp32", tmp_path / "nope"), "nope does not exist")


def test_one_folder_is_not_a_comparison(runs):
    refused(invoke("compare", runs / "fp32"), "at least two")


def broken_copy(runs, tmp_path, name: str = "fp32"):
    copy = tmp_path / "broken"
    shutil.copytree(runs / name, copy)
    return copy


def test_missing_metadata_is_refused(runs, tmp_path):
    bad = broken_copy(runs, tmp_path)
    (bad / "metadata.json").unlink()
    refused(invoke("compare", runs / "fp32", bad), str(bad / "metadata.json"), "does not exist")


def test_a_missing_csv_is_refused(runs, tmp_path):
    bad = broken_copy(runs, tmp_path)
    (bad / "phases.csv").unlink()
    refused(invoke("compare", runs / "fp32", bad), str(bad / "phases.csv"), "does not exist")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00\xff\xfe garbage \x89",
        b"a,b\n1,2\n",
        b'phase,label\n"unterminated\n',
    ],
    ids=["empty", "binary", "other columns", "unterminated quote"],
)
def test_a_corrupt_csv_is_refused(runs, tmp_path, content):
    bad = broken_copy(runs, tmp_path)
    (bad / "phases.csv").write_bytes(content)
    refused(invoke("compare", runs / "fp32", bad), str(bad / "phases.csv"), "corrupt")


def test_text_in_a_number_column_is_refused(runs, tmp_path):
    bad = broken_copy(runs, tmp_path)
    df = pd.read_csv(bad / "phases.csv")
    df["step_ms"] = df["step_ms"].astype(str)
    df.loc[0, "step_ms"] = "fast"
    df.to_csv(bad / "phases.csv", index=False)
    refused(invoke("compare", runs / "fp32", bad), str(bad / "phases.csv"), "step_ms")


def test_corrupt_metadata_is_refused(runs, tmp_path):
    bad = broken_copy(runs, tmp_path)
    (bad / "metadata.json").write_text('{"command": "phases", ')
    refused(invoke("compare", runs / "fp32", bad), str(bad / "metadata.json"), "corrupt")


def test_an_unknown_schema_version_is_refused(runs, tmp_path):
    bad = broken_copy(runs, tmp_path)
    meta = json.loads((bad / "metadata.json").read_text())
    (bad / "metadata.json").write_text(json.dumps({**meta, "schema_version": 99}))
    refused(invoke("compare", runs / "fp32", bad), "metadata.json", "schema_version 99")


def test_a_compare_folder_is_not_an_input(runs, tmp_path):
    assert invoke("compare", runs / "fp32", runs / "bf16", "--out", tmp_path / "c").exit_code == 0
    refused(invoke("compare", tmp_path / "c", runs / "fp32"), "'compare' run")


def test_label_count_must_match(runs):
    refused(invoke("compare", runs / "fp32", runs / "bf16", "--label", "one"), "--label")


def test_same_folder_names_get_their_parents():
    from pathlib import Path

    names = merging.labels([Path("/a/x/run"), Path("/a/y/run")], None)
    assert names == ["x/run", "y/run"]
