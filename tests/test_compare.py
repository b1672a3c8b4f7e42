"""`benchbatch compare`: tiny runs merged and overlaid; mismatched or broken folders refused
with one line naming the bad file (exit code 2)."""

from __future__ import annotations

import json
import math
import re
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from benchbatch.app.cli import app
from benchbatch.output import compare as merging

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


RUNS = {
    "fp32": PHASES,
    "ctx16": [*PHASES[:-1], "16"],  # the same steps' decodes at context 16, not 8
    "bf16": [*PHASES, "--dtype", "bf16"],
    "sweep": SWEEP,
    "repro-a": REPRODUCE,
}


class Runs:
    """Result folders, each made the first time a test asks for it (`runs / "fp32"`): two
    phases runs (fp32 and bf16), a sweep run and two reproduce runs (repro-b a copy of
    repro-a). A test pays only for the runs it compares."""

    def __init__(self, root):
        self.root = root

    def __truediv__(self, name: str):
        folder = self.root / name
        if not folder.exists():
            if name == "repro-b":
                shutil.copytree(self / "repro-a", folder)
            else:
                result = invoke(*RUNS[name], "--out", folder)
                assert result.exit_code == 0, result.output
        return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("runs"))


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


def assert_rows_of(merged: pd.DataFrame, run: str, own: pd.DataFrame) -> None:
    """One run's rows of a merged table are exactly that run's own CSV (columns only other
    runs have are empty in its rows)."""
    mine = merged[merged["run"] == run].drop(columns="run").reset_index(drop=True)
    others = [c for c in mine.columns if c not in own.columns]
    assert mine[others].isna().all().all(), others
    pd.testing.assert_frame_equal(mine[list(own.columns)], own, check_exact=True)


@pytest.mark.parametrize(
    ("labels", "names"), [(None, ["fp32", "bf16"]), ("a,b", ["a", "b"])], ids=["folders", "labels"]
)
def test_each_run_rows_in_the_merged_csv_are_its_own_csv(runs, tmp_path, labels, names):
    extra = [] if labels is None else ["--label", labels]
    result = invoke("compare", runs / "fp32", runs / "bf16", *extra, "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    merged = pd.read_csv(tmp_path / "c" / "compare-phases.csv")
    assert list(merged["run"]) == [names[0]] * 4 + [names[1]] * 4
    own = {
        name: pd.read_csv(runs / folder / "phases.csv")
        for folder, name in zip(("fp32", "bf16"), names, strict=True)
    }
    for name in names:
        assert_rows_of(merged, name, own[name])
    # The two runs differ (bf16 weights are half the bytes): a swap could not pass.
    assert (own[names[0]]["weight_bytes"] == 2 * own[names[1]]["weight_bytes"]).all()


def test_every_table_of_reproduce_runs_keeps_its_rows(runs, tmp_path):
    result = invoke("compare", runs / "repro-a", runs / "repro-b", "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    for table in ("probe", "phases", "sweep", "occupancy"):
        merged = pd.read_csv(tmp_path / "c" / f"compare-{table}.csv")
        for run in ("repro-a", "repro-b"):
            assert_rows_of(merged, run, pd.read_csv(runs / run / f"{table}.csv"))


def printed_row(stdout: str, title: str, key: str) -> list[str]:
    """The cells of the row starting with `key` in the terminal table titled `title`."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    for line in lines[start:]:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == key:
            return cells
    raise AssertionError(f"no row {key!r} under {title!r}:\n{stdout}")


def test_the_printed_ratio_is_the_second_run_over_the_first(runs, tmp_path):
    """A copy of the fp32 run with each step made 2, 3, 4 and 5 times slower."""
    slow = tmp_path / "slow"
    shutil.copytree(runs / "fp32", slow)
    df = pd.read_csv(slow / "phases.csv")
    factors = {"prefill 8": 2, "prefill 16": 3, "decode b=1": 4, "decode b=2": 5}
    df["step_ms"] = df["step_ms"] * df["label"].map(factors)
    df.to_csv(slow / "phases.csv", index=False)
    result = invoke("compare", runs / "fp32", slow, "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    assert printed_row(result.stdout, "phases: step ms", "step")[-1] == "slow / fp32"
    for label, factor in factors.items():
        assert printed_row(result.stdout, "phases: step ms", label)[-1] == f"x{factor}", label
    result = invoke("compare", slow, runs / "fp32", "--out", tmp_path / "d")
    assert printed_row(result.stdout, "phases: step ms", "decode b=1")[-1] == "x0.25"


def test_ratio():
    assert merging.ratio(2.0, 6.0) == 3.0 and merging.ratio(6.0, 2.0) == 1 / 3
    for a, b in ((0.0, 1.0), (None, 1.0), (1.0, None), (math.nan, 1.0), (1.0, math.inf)):
        assert math.isnan(merging.ratio(a, b)), (a, b)


def test_first_seed_keeps_each_run_first_seed_only():
    def rows(run: str, seeds: list) -> list[dict]:
        return [
            {"run": run, "seed": s, "policy": p, "occupancy": 0.1 * i + 0.01 * j}
            for i, s in enumerate(seeds)
            for j, p in enumerate(("static", "continuous"))
        ]

    a, b, trace = rows("a", [3, 4, 5]), rows("b", [9, 2]), rows("t", [None])
    merged = pd.DataFrame(a + b + trace)
    kept = merging.first_seed(merged)
    expected = pd.DataFrame(a[:2] + b[:2] + trace)  # a trace run has no seed: all its rows
    pd.testing.assert_frame_equal(kept.reset_index(drop=True), expected)
    no_seeds = merged.drop(columns="seed")
    pd.testing.assert_frame_equal(merging.first_seed(no_seeds), no_seeds)


def test_compare_of_seeded_occupancy_runs_shows_the_first_seed(tmp_path):
    """Two runs of three seeds each: the terminal shows each run's first seed."""
    folders = {}
    for name, seed in (("s0", 0), ("s7", 7)):
        folders[name] = tmp_path / name
        args = ["occupancy", "--requests", "30", "--seed", seed, "--seeds", "3"]
        assert invoke(*args, "--out", folders[name]).exit_code == 0
    result = invoke("compare", folders["s0"], folders["s7"], "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    merged = pd.read_csv(tmp_path / "c" / "compare-occupancy.csv")
    assert sorted(set(merged["seed"])) == [0, 1, 2, 7, 8, 9]  # every seed is kept in the CSV
    for policy in ("static", "continuous"):
        cells = printed_row(result.stdout, "occupancy:", policy)
        for name, seed, cell in zip(folders, (0, 7), cells[1:3], strict=True):
            own = pd.read_csv(folders[name] / "occupancy.csv")
            value = own[(own["seed"] == seed) & (own["policy"] == policy)]["occupancy"]
            assert cell == f"{value.item():.1%}", (name, policy)


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
    from benchbatch.output.plots import compare as plots

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
    assert sorted(p.name for p in out.iterdir()) == [
        "compare-phases.csv", "metadata.json", "result.json"]  # fmt: skip
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


def test_the_tables_compare_does_not_read_are_named(runs, tmp_path):
    """A folder's tables compare leaves out (a reproduce run's memory.csv, timeline.csv,
    engine_steps.csv...) are named in metadata, --json and the terminal, not left unsaid;
    the tables it reads are not among them."""
    copy = broken_copy(runs, tmp_path)
    (copy / "extra.csv").write_text("a,b\n1,2\n")
    result = invoke("compare", runs / "fp32", copy, "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "c" / "metadata.json").read_text())
    held = {p.name for f in (runs / "fp32", copy) for p in f.glob("*.csv")}
    assert meta["not_compared"] == sorted(held - {"phases.csv", "probe.csv"})
    assert "extra.csv" in meta["not_compared"] and "phases.csv" not in meta["not_compared"]
    assert "not compared" in result.stderr and "extra.csv" in result.stderr
    repro = invoke("compare", runs / "repro-a", runs / "repro-b", "--json", "--out",
                   tmp_path / "r")  # fmt: skip
    left = json.loads(repro.stdout)["not_compared"]
    assert {"memory.csv", "timeline.csv"} <= set(left) and not set(left) & {
        "probe.csv", "phases.csv", "sweep.csv", "occupancy.csv"}


def broken_copy(runs, tmp_path, name: str = "fp32"):
    copy = tmp_path / "broken"
    shutil.copytree(runs / name, copy)
    return copy


def test_missing_metadata_is_refused(runs, tmp_path):
    bad = broken_copy(runs, tmp_path)
    (bad / "metadata.json").unlink()
    refused(invoke("compare", runs / "fp32", bad), str(bad / "metadata.json"), "does not exist")


def test_an_interrupted_run_compares_by_the_tables_it_wrote(runs, tmp_path):
    """reproduce stopped after phases (no sweep.csv, occupancy.csv header only): compare
    refused the folder whole; the tables it wrote are compared now, the others each run's
    own, with the warning that some runs did not complete. A run cut before any row is
    refused in one line."""
    cut = broken_copy(runs, tmp_path, "repro-a")
    meta = json.loads((cut / "metadata.json").read_text())
    (cut / "metadata.json").write_text(json.dumps(meta | {"status": "interrupted"}))
    (cut / "sweep.csv").unlink()
    header = (cut / "occupancy.csv").read_text().splitlines()[0]
    (cut / "occupancy.csv").write_text(header + "\n")
    result = invoke("compare", runs / "repro-a", cut, "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    assert "some runs did not complete" in " ".join(result.stderr.split())
    phases = pd.read_csv(tmp_path / "c" / "compare-phases.csv")
    assert list(phases["run"].unique()) == ["repro-a", "broken"]
    for table in ("sweep", "occupancy"):
        merged = pd.read_csv(tmp_path / "c" / f"compare-{table}.csv")
        assert list(merged["run"].unique()) == ["repro-a"], table
    for table in ("probe", "phases", "occupancy", "engine", "serve", "slo"):
        (cut / f"{table}.csv").unlink(missing_ok=True)
    refused(invoke("compare", runs / "repro-a", cut), str(cut), "holds no rows to compare")
    # a complete run without a table it always writes is still refused as corrupt
    whole = tmp_path / "whole"
    shutil.copytree(runs / "repro-a", whole)
    (whole / "sweep.csv").unlink()
    refused(invoke("compare", runs / "repro-a", whole), str(whole / "sweep.csv"), "does not")


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


def test_the_max_point_is_said_max_as_the_runs_said_it():
    """A sustained rate at the max point (every request queued) is inf in slo.csv: compare's
    tables said "inf" where each run had printed "max"."""
    from benchbatch.app.views.compare import _cell

    assert _cell(math.inf, "slo") == "max" and _cell(math.inf, "serve") == "max"
    assert _cell(3.9, "slo") == "3.9" and _cell(math.nan, "slo") == "-"
    assert _cell(0.25, "occupancy") == "25.0%"


def test_what_the_runs_measured_differently_is_said():
    """Two runs of other models or workloads compared as if alike: compare names each size
    and option whose values differ (not where they went, --out, --json), a size once (the
    config's value, not the option's null where it was not given), and a run without a
    model by its name alone."""
    from pathlib import Path

    from benchbatch.app.views.compare import differences_line

    def run(label, config, options):
        return merging.RunData(label, Path(label), "phases", {"config": config,
                                                              "options": options}, {})  # fmt: skip

    a = run("a", {"name": "tiny", "hidden": 64, "layers": 2},
            {"hidden": None, "repeats": 2, "out": "/x/a", "json_out": False})
    b = run("b", {"name": "tiny with hidden 128", "hidden": 128, "layers": 2},
            {"hidden": 128, "repeats": 5, "out": "/x/b", "json_out": True})
    found = merging.differences([a, b])
    assert found == {"hidden": ["64", "128"], "repeats": ["2", "5"]}
    assert differences_line(found) == ("the runs differ in hidden (64, 128); repeats (2, 5): "
                                       "each ratio below compares these too")  # fmt: skip
    assert merging.differences([a, a]) == {} and differences_line({}) is None
    sim = run("s", {}, {"hidden": None, "repeats": 2, "out": "/x/s"})
    assert merging.differences([sim, a]) == {"model": ["none", "tiny"]}
    # the engine's weight layout (packed against strided: up to 1.6x a step on one CPU)
    packed, strided = ({**x.meta, "weight_layout": w} for x, w in
                       ((a, "packed (oneDNN)"), (b, "columns, fused")))  # fmt: skip
    found = merging.differences([merging.RunData("a", Path("a"), "phases", packed, {}),
                                 merging.RunData("b", Path("b"), "phases", strided, {})])
    assert found["weight layout"] == ["packed (oneDNN)", "columns, fused"]
    many = {f"k{i}": ["1", "2"] for i in range(10)}
    assert differences_line(many).endswith("k7 (1, 2) and 2 more (metadata.json's differences): "
                                           "each ratio below compares these too")  # fmt: skip


def test_a_cpu_run_has_no_cuda_graphs_in_the_runs_table():
    from pathlib import Path

    meta = {"environment": {"device": "cpu"}, "options": {"cuda_graphs": True}}
    assert merging.RunData("a", Path("a"), "phases", meta, {}).describe()["cuda_graphs"] is None
    meta["environment"]["device"] = "cuda:0"
    assert merging.RunData("a", Path("a"), "phases", meta, {}).describe()["cuda_graphs"] is True


def test_occupancy_runs_of_several_seeds_are_compared_by_their_first_said(tmp_path):
    runner = CliRunner()
    for name, seeds in (("a", "2"), ("b", "3")):
        done = runner.invoke(app, ["occupancy", "--requests", "20", "--slots", "4", "--seeds",
                                   seeds, "--out", str(tmp_path / name)])  # fmt: skip
        assert done.exit_code == 0, done.output
    done = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out",
                               str(tmp_path / "c")])  # fmt: skip
    assert done.exit_code == 0, done.output
    said = " ".join(done.stderr.split())
    assert "note: occupancy: each run's first seed (compare-occupancy.csv has every seed)" in said
    assert "the runs differ in --seeds (2, 3)" in said
    assert set(pd.read_csv(tmp_path / "c" / "compare-occupancy.csv")["seed"]) == {0, 1, 2}


def test_decodes_at_other_contexts_are_never_one_row_or_one_ratio(runs):
    """phases at context 8 and at context 16 measured other decode steps under the same
    labels: compare set them in one row (and one bar), and matched a conclusion across
    them. Each is its own row now, and each conclusion names its context."""
    out = runs.root / "cmp-contexts"
    result = invoke("compare", runs / "fp32", runs / "ctx16", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    said = {c["ratio"]: c for c in doc["conclusions"]}
    assert "each token cheaper, batch 1 to 2 at context 8" in said
    assert "each token cheaper, batch 1 to 2 at context 16" in said
    for c in said.values():  # each measured by one run only: no ratio between the two
        assert len(c["runs"]) == 1 and c["versus_first"] == {}
    shown = invoke("compare", runs / "fp32", runs / "ctx16", "--out", runs.root / "cmp-ctx-2")
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "decode b=1, context 8" in text and "decode b=1, context 16" in text
    steps = merging.phases_steps(pd.read_csv(out / "compare-phases.csv"))
    shared = steps.groupby("step")["run"].nunique()
    assert shared[[k for k in shared.index if k.startswith("decode")]].max() == 1
    assert shared["prefill 8"] == 2  # a prefill is the same step in both: one row
    same = merging.phases_steps(pd.read_csv(runs / "fp32" / "phases.csv"))
    assert (same["step"] == same["label"]).all()  # one context: the labels as they are


def test_a_table_cut_short_is_refused(runs, tmp_path):
    """A phases.csv whose last row was cut mid-line read as a step with its last fields
    empty (a ratio said "-", the run "complete"): refused in one line."""
    cut = tmp_path / "cut"
    shutil.copytree(runs / "fp32", cut)
    data = (cut / "phases.csv").read_bytes()
    (cut / "phases.csv").write_bytes(data[: len(data) - 40])
    refused(invoke("compare", runs / "fp32", cut, "--out", tmp_path / "c"), "phases.csv",
            "cut short")  # fmt: skip


def test_runs_of_other_versions_are_named_with_the_options_as_typed(runs, tmp_path):
    """Another benchbatch's or torch's run was compared with no word; the options the runs
    differ in are named as the user types them (--output-median, not median), and an
    option one run left unset and another does not have is no difference."""
    from pathlib import Path

    from benchbatch.app.views.compare import differences_line, option_names

    other = tmp_path / "other"
    shutil.copytree(runs / "fp32", other)
    meta = json.loads((other / "metadata.json").read_text())
    meta["environment"]["benchbatch_version"] = "9.9.9"
    (other / "metadata.json").write_text(json.dumps(meta))
    result = invoke("compare", runs / "fp32", other, "--out", tmp_path / "c", "--json")
    assert result.exit_code == 0, result.output
    was = json.loads((runs / "fp32" / "metadata.json").read_text())["environment"]
    assert json.loads(result.stdout)["differences"] == {
        "benchbatch version": [was["benchbatch_version"], "9.9.9"]}
    names = option_names("occupancy")
    assert names["median"] == "--output-median" and names["slots"] == "--slots"
    assert option_names("no-such-command") == {}
    line = differences_line({"median": ["70.0", "40.0"]}, kind="occupancy")
    assert line.startswith("the runs differ in --output-median (70.0, 40.0)")

    def run(label, options):
        return merging.RunData(label, Path(label), "occupancy", {"options": options}, {})

    assert merging.differences([run("a", {"hidden": None, "cuda_graphs": True}),
                                run("b", {"cuda_graphs": False})]) == {}  # fmt: skip


def test_a_comparison_says_what_compared_the_runs(runs, tmp_path):
    """compare's result.json named no benchbatch version, machine or Python: null."""
    from benchbatch import __version__

    out = tmp_path / "c"
    result = invoke("compare", runs / "fp32", runs / "fp32", "--label", "a,b", "--out", out)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["benchbatch_version"] == __version__
    assert doc["machine"]["python"] and doc["machine"]["platform"]


def test_out_is_never_a_folder_compared_nor_inside_one(runs, tmp_path):
    """--out inside a result folder wrote compare's files among the run's own."""
    refused(invoke("compare", runs / "fp32", runs / "bf16", "--out", runs / "fp32"), "--out",
            "one of the folders compared")  # fmt: skip
    inside = runs / "bf16" / "cmp"
    refused(invoke("compare", runs / "fp32", runs / "bf16", "--out", inside), "--out",
            "is inside")  # fmt: skip
    assert not inside.exists()
