"""Bad input to every command: exit code 2, one line on stderr naming the option (or the
file), never a traceback; and property tests of the parsers of lists and traces."""

from __future__ import annotations

import csv
import errno
import io

import pandas as pd
import pytest
import torch
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchbatch.app.cli import app
from benchbatch.app.params import LIST_MAX, parse_int_list
from benchbatch.core.optkit import INT_MAX, check_numbers
from benchbatch.core.trace import read_trace
from benchbatch.core.workload import Request
from benchbatch.errors import UserError

TINY = ["--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time", "0"]
LONG = "9" * 40  # past any 64-bit integer
SHAPES = {  # each command's quick, valid arguments: a case changes one thing
    "phases": [*TINY, "--no-roofline", "--prefill", "8", "--decode-batch", "1", "--context", "8"],
    "sweep": [*TINY, "--no-roofline", "--batch", "1", "--context", "8"],
    "probe": ["--device", "cpu", "--repeats", "1", "--min-time", "0", "--sizes", "32"],
    "occupancy": ["--requests", "20"],
    "reproduce": [*TINY, "--prefill", "16", "--decode-batch", "1", "--batch", "1,2"]
    + ["--context", "8", "--requests", "20", "--max-output", "20", "--probe-sizes", "32"],
    "ablation": [*TINY, "--requests", "20", "--max-num-batched-tokens", "64", "--chunk-size", "32"]
    + ["--long-prompt-len", "64", "--max-output", "60"],
    "piggyback": [*TINY, "--decode-batch", "2", "--context", "8", "--prefill", "4"]
    + ["--chunk-prompt", "16", "--chunks", "8", "--tiles", "8"],
    "compare": [],
    "project": ["--tp", "1,2"],
    "serve-sweep": [*TINY, "--engine", "sim", "--requests", "20", "--rates", "1,max"],
    "serve": [*TINY, "--port", "0", "--duration", "0.5"],
}

# (command, arguments, what the error line names)
CASES = [
    ("serve-sweep", ["--rates", "1,,2"], "--rates"),
    ("serve-sweep", ["--requests", "-1"], "--requests"),
    ("serve-sweep", ["--slo-tpot", "inf"], "--slo-tpot"),
    # malformed lists
    ("phases", ["--prefill", "1,,x"], "--prefill"),
    ("phases", ["--prefill", " "], "--prefill"),
    ("phases", ["--decode-batch", "0"], "--decode-batch"),
    ("phases", ["--decode-batch", "-4"], "--decode-batch"),
    ("phases", ["--decode-batch", "3.5"], "--decode-batch"),
    ("phases", ["--decode-batch", "1e3"], "--decode-batch"),
    ("phases", ["--decode-batch", "1_000"], "--decode-batch"),
    ("phases", ["--decode-batch", LONG], "--decode-batch"),
    ("sweep", ["--batch", "8,", "--context", "8"], "--batch"),
    ("sweep", ["--batch", str(LIST_MAX + 1)], "--batch"),
    ("probe", ["--sizes", "0"], "--sizes"),
    ("reproduce", ["--batch", "a,b"], "--batch"),
    # sizes: zero, negative, too long, non-dividing, beyond the context
    ("phases", ["--hidden", "0"], "--hidden"),
    ("phases", ["--layers", "-2"], "--layers"),
    ("phases", ["--hidden", LONG], "--hidden"),
    ("phases", ["--heads", "3"], "--heads"),
    ("phases", ["--kv-heads", "3"], "--kv-heads"),
    ("phases", ["--context", "-1"], "--context"),
    ("phases", ["--context", "3.5"], "--context"),
    ("phases", ["--context", "4096"], "--context"),
    ("phases", ["--prefill", "5000"], "--prefill"),
    ("sweep", ["--context", "999999"], "--context"),
    ("phases", ["--vocab", str(10**15)], "--vocab"),
    ("phases", ["--repeats", "0"], "--repeats"),
    ("phases", ["--seed", "-1"], "--seed"),
    ("phases", ["--seed", LONG], "--seed"),
    ("probe", ["--buffer-mb", "0"], "--buffer-mb"),
    ("probe", ["--buffer-mb", str(2**40)], "--buffer-mb"),
    ("probe", ["--sizes", str(LIST_MAX)], "--sizes"),
    ("occupancy", ["--slots", "0"], "--slots"),
    ("occupancy", ["--requests", str(2**40)], "--requests"),
    ("occupancy", ["--seeds", str(2**40)], "--seeds"),
    ("occupancy", ["--max-output", LONG], "--max-output"),
    ("occupancy", ["--engine", "real", *TINY[:4], "--prompt-len", "5000"], "--prompt-len"),
    ("reproduce", ["--slots", "0"], "--slots"),
    # NaN and infinity wherever a float is taken
    ("phases", ["--min-time", "nan"], "--min-time"),
    ("phases", ["--min-time", "inf"], "--min-time"),
    ("phases", ["--min-time", "-1"], "--min-time"),
    ("sweep", ["--knee-threshold", "inf"], "--knee-threshold"),
    ("sweep", ["--knee-threshold", "nan"], "--knee-threshold"),
    ("probe", ["--min-time", "-inf"], "--min-time"),
    ("occupancy", ["--arrival-rate", "nan"], "--arrival-rate"),
    ("occupancy", ["--arrival-rate", "inf"], "--arrival-rate"),
    ("occupancy", ["--arrival-rate", "1e-300"], "--arrival-rate"),
    ("occupancy", ["--median", "inf"], "--median"),
    ("occupancy", ["--sigma", "nan"], "--sigma"),
    ("reproduce", ["--median", "nan"], "--median"),
    ("ablation", ["--arrival-rate", "nan"], "--arrival-rate"),
    ("ablation", ["--arrival-rate", "1e-300"], "--arrival-rate"),
    ("ablation", ["--seed", "-1"], "--seed"),
    ("ablation", ["--requests", str(2**40)], "--requests"),
    ("ablation", ["--vocab", str(10**15)], "--vocab"),
    ("piggyback", ["--vocab", str(10**15)], "--vocab"),
    ("ablation", ["--long-prompt-fraction", "inf"], "--long-prompt-fraction"),
    ("piggyback", ["--threshold", "inf"], "--threshold"),
    ("piggyback", ["--context", LONG], "--context"),
    # choices
    ("phases", ["--preset", "nope"], "--preset"),
    ("phases", ["--dtype", "fp8"], "--dtype"),
    ("sweep", ["--device", "tpu"], "--device"),
    ("phases", ["--device", "cuda:x"], "--device"),
    ("occupancy", ["--engine", "gpu"], "--engine"),
    ("phases", ["--no-such-option"], "--no-such-option"),
    # options that would do nothing, unsaid
    ("phases", ["--no-roofline", "--reprobe"], "--reprobe"),
    ("sweep", ["--reprobe", "--ceilings", "probe.csv"], "--reprobe"),
    ("sweep", ["--no-roofline", "--ceilings", "probe.csv"], "--ceilings"),  # the file won
    # a missing checkpoint beside --preset (the shape's --preset tiny): it said "a checkpoint
    # is its own shape: --preset cannot change it", not that there is none
    ("phases", ["--model", "/no/such/checkpoint"], "--model: no such folder"),
    # an empty path: read as ".", the current folder (written into with --force)
    ("phases", ["--config", ""], "--config"),
    ("occupancy", ["--step-costs", ""], "--step-costs"),
]

FILE_CASES = [
    # (command, option, file name, content or None for a folder; what the error names)
    ("phases", "--config", "config.json", "{not json", "--config"),
    ("phases", "--config", "config.json", "[1, 2]", "--config"),
    ("sweep", "--config", "missing.json", None, "--config"),
    ("phases", "--ceilings", "probe.csv", "label\nx\n", "--ceilings"),
    ("occupancy", "--trace", "trace.csv", "prompt_tokens\n4\n", "--trace"),
    ("occupancy", "--trace", "trace.csv", "output_tokens\n5,6,7\n", "--trace"),
    ("occupancy", "--trace", "trace.csv", b"output_tokens\n\xff\xfe\n", "--trace"),
    ("occupancy", "--trace", "trace.csv", "output_tokens\n\x00\n", "--trace"),
    ("ablation", "--trace", "trace.csv", "output_tokens\n-1\n", "--trace"),
    ("ablation", "--trace", "trace.csv", "output_tokens,arrival_step\n5,99999999999\n", "--trace"),
]


def assert_one_line_error(result, names: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error:") and names in lines[0], lines[0]
    assert "Traceback" not in result.output


def registered() -> set[str]:
    return set(typer.main.get_command(app).commands)


def test_every_command_has_a_shape():
    """A renamed or new command fails here, rather than skipping its cases."""
    assert set(SHAPES) == registered()


def invoke(runner, command: str, args: list[str], tmp_path):
    assert command in registered(), f"{command} is not a command (renamed? update this test)"
    shape = SHAPES[command]
    if "--config" in args:  # a config.json replaces the preset
        shape = [a for a in shape if a not in ("--preset", "tiny")]
    if "--ceilings" in args:  # a probe.csv places the rows on a roofline: refused without
        shape = [a for a in shape if a != "--no-roofline"]
    out = ["--out", str(tmp_path / "run")] if command != "compare" else []
    return runner.invoke(app, [command, *shape, *args, *out])


@pytest.mark.parametrize(("command", "args", "names"), CASES, ids=lambda v: str(v)[:40])
def test_bad_option(runner, tmp_path, command, args, names):
    result = invoke(runner, command, args, tmp_path)
    assert_one_line_error(result, names)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize(("command", "option", "name", "content", "names"), FILE_CASES)
def test_bad_file(runner, tmp_path, command, option, name, content, names):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    result = invoke(runner, command, [option, str(path)], tmp_path)
    assert_one_line_error(result, names)
    assert str(path) in result.stderr.replace("\n", "")


@pytest.mark.parametrize(
    ("command", "option"),
    [("phases", "--config"), ("occupancy", "--trace"), ("sweep", "--ceilings")],
)
def test_a_folder_where_a_file_is_expected(runner, tmp_path, command, option):
    (tmp_path / "dir").mkdir()
    result = invoke(runner, command, [option, str(tmp_path / "dir")], tmp_path)
    assert_one_line_error(result, option)


def test_out_under_a_regular_file(runner, tmp_path):
    (tmp_path / "file").write_text("")
    args = [*SHAPES["occupancy"], "--out", str(tmp_path / "file" / "run")]
    assert_one_line_error(runner.invoke(app, ["occupancy", *args]), "--out")


def test_out_is_an_existing_file(runner, tmp_path):
    (tmp_path / "file").write_text("keep")
    args = [*SHAPES["phases"], "--out", str(tmp_path / "file")]
    assert_one_line_error(runner.invoke(app, ["phases", *args]), "--out")
    assert (tmp_path / "file").read_text() == "keep"


def test_an_unwritable_default_results_folder(runner, tmp_path, monkeypatch):
    from benchbatch.output import results

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(results, "DEFAULT_ROOT", tmp_path / "file" / "results")
    assert_one_line_error(runner.invoke(app, ["occupancy", "--requests", "20"]), "--out")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", ["phases", "sweep", "probe", "piggyback"])
def test_cuda_without_cuda(runner, tmp_path, command):
    result = invoke(runner, command, ["--device", "cuda"], tmp_path)
    assert_one_line_error(result, "--device")
    assert "CUDA is not available" in result.stderr


@pytest.mark.parametrize("command", ["ablation", "piggyback"])
def test_a_model_too_large_is_refused_before_the_preset_note(runner, tmp_path, command):
    """Without --preset the command notes the one it chose, once every input has passed."""
    shape = [a for a in SHAPES[command] if a not in ("--preset", "tiny")]
    args = [command, *shape, "--vocab", str(10**15), "--out", str(tmp_path / "run")]
    assert_one_line_error(runner.invoke(app, args), "--vocab")


def test_compare_names_what_is_wrong(runner, tmp_path):
    (tmp_path / "file").write_text("")
    assert_one_line_error(runner.invoke(app, ["compare"]), "RUN_DIR")
    result = runner.invoke(app, ["compare", str(tmp_path / "nothing"), str(tmp_path / "file")])
    assert_one_line_error(result, "nothing")


def test_no_command_prints_help_without_an_error(runner):
    result = runner.invoke(app, [])
    assert "Usage" in result.output and "Error" not in result.output
    assert_one_line_error(runner.invoke(app, ["nonsense"]), "nonsense")


# --- numbers the option parser lets through ---------------------------------------------


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"min_time": float("nan")}, "--min-time: must be a finite number"),
        ({"knee_threshold": float("-inf")}, "--knee-threshold: must be a finite number"),
        ({"seed": INT_MAX + 1}, "--seed: 9223372036854775808 is too large"),
        ({"json_out": True, "repeats": -INT_MAX}, None),
    ],
)
def test_check_numbers(values, says):
    names = {"json_out": "--json", "min_time": "--min-time"}
    if says is None:
        check_numbers(values, names)
        return
    with pytest.raises(UserError) as err:
        check_numbers(values, names)
    assert str(err.value).startswith(says)


# --- every command's help ------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(registered()))
def test_help_describes_every_option(runner, command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output
    params = typer.main.get_command(app).commands[command].params
    undocumented = [
        p.name for p in params if not getattr(p, "hidden", False) and not getattr(p, "help", "")
    ]
    assert not undocumented


# --- property tests of the parsers ---------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.lists(st.integers(-10, 2**40).map(str)).map(",".join),
        st.lists(st.sampled_from(["1", " 2", "3 ", "", "-0", "+4", "1_0", "٣", "²", "0x1"])).map(
            ",".join
        ),
    )
)
def test_parse_int_list_gives_a_sorted_list_or_names_the_option(text):
    try:
        values = parse_int_list(text, "--batch")
    except UserError as e:
        assert e.option == "--batch"
        return
    assert values and values == sorted(set(values))
    assert all(isinstance(v, int) and 0 < v <= LIST_MAX for v in values)
    assert values == sorted({int(item) for item in text.split(",")})


SPACE = st.sampled_from(["", " ", "  "])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, LIST_MAX), st.sampled_from(["", "+"]), SPACE, SPACE),
        min_size=1,
        max_size=12,
    )
)
def test_parse_int_list_parses_every_list_of_positive_integers(items):
    """The positive case: a parser that refused everything would fail here."""
    text = ",".join(f"{before}{sign}{v}{after}" for v, sign, before, after in items)
    assert parse_int_list(text, "--batch") == sorted({v for v, *_ in items})


def test_parse_int_list_examples():
    assert parse_int_list("512,2048", "--prefill") == [512, 2048]
    assert parse_int_list(" 32, 1,8,8 ,+4", "--batch") == [1, 4, 8, 32]
    assert parse_int_list(str(LIST_MAX), "--batch") == [LIST_MAX]


CELLS = st.one_of(
    st.integers(-3, 10**6).map(str),
    st.text(max_size=6),
    st.sampled_from(["", " 3 ", "1_0", "٣", "+4", "1e3", "nan", "\x00", '"', "\r", "9" * 5000]),
)
HEADERS = st.lists(
    st.sampled_from(["output_tokens", "prompt_tokens", "arrival_step", "x", "", " output_tokens"]),
    max_size=4,
)


@st.composite
def trace_files(draw) -> bytes:
    kind = draw(st.sampled_from(["csv", "text", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "text":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    rows = [draw(HEADERS), *draw(st.lists(st.lists(CELLS, max_size=5), max_size=6))]
    if draw(st.booleans()):  # quoted as a spreadsheet writes it
        buffer = io.StringIO()
        csv.writer(buffer).writerows(rows)
        return buffer.getvalue().encode("utf-8", "surrogatepass")
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    return ending.join(",".join(r) for r in rows).encode("utf-8", "surrogatepass")


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(trace_files())
def test_read_trace_gives_requests_or_names_the_option(tmp_path, content):
    path = tmp_path / "trace.csv"
    path.write_bytes(content)
    try:
        requests = read_trace(path, prompt_tokens=7)
    except UserError as e:
        assert e.option == "trace" and str(path) in e.message
        return
    assert requests and all(isinstance(r, Request) for r in requests)
    assert [r.id for r in requests] == list(range(len(requests)))
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in requests)
    assert all(r.arrival_step >= 0 for r in requests)


@st.composite
def valid_traces(draw) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A well-formed trace and the (prompt, output, arrival) of each of its requests."""
    columns = draw(st.permutations(["output_tokens", "prompt_tokens", "arrival_step"]))
    columns = [c for c in columns if c == "output_tokens" or draw(st.booleans())]
    n = draw(st.integers(1, 8))
    rows, expected = [], []
    for _ in range(n):
        out = draw(st.integers(1, 10**6))
        prompt = draw(st.one_of(st.none(), st.integers(1, 10**4)))
        arrival = draw(st.one_of(st.none(), st.integers(0, 10**6)))
        cells = {"output_tokens": str(out), "prompt_tokens": "", "arrival_step": ""}
        if "prompt_tokens" in columns and prompt is not None:
            cells["prompt_tokens"] = f" {prompt} " if draw(st.booleans()) else str(prompt)
        if "arrival_step" in columns and arrival is not None:
            cells["arrival_step"] = str(arrival)
        rows.append([cells[c] for c in columns])
        given_prompt = prompt if cells["prompt_tokens"] else None
        given_arrival = arrival if cells["arrival_step"] else None
        expected.append((given_prompt or 7, out, given_arrival or 0))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
    writer.writerows([columns, *rows])
    return buffer.getvalue().encode(), expected


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(valid_traces())
def test_read_trace_reads_every_well_formed_trace(tmp_path, trace):
    """The positive case: a reader that refused everything would fail here."""
    content, expected = trace
    path = tmp_path / "trace.csv"
    path.write_bytes(content)
    requests = read_trace(path, prompt_tokens=7)
    got = [(r.prompt_tokens, r.output_tokens, r.arrival_step) for r in requests]
    assert got == expected and [r.id for r in requests] == list(range(len(expected)))


# --- figures: a failed write, rows where nothing was measured -------------------------------


@pytest.mark.parametrize(
    "stop", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()], ids=repr
)
def test_a_failed_figure_write_leaves_no_temporary_file(tmp_path, monkeypatch, stop):
    from benchbatch.errors import WriteFailed
    from benchbatch.output import results
    from benchbatch.output.plots import plt, save

    real_fdopen = results.os.fdopen

    def half_written(fd, mode):
        f = real_fdopen(fd, mode)
        f.write(b"\x89PNG half")
        f.flush()
        raise stop

    monkeypatch.setattr(results.os, "fdopen", half_written)
    (tmp_path / "fig.png").write_bytes(b"good")
    fig = plt.figure()
    with pytest.raises(WriteFailed if isinstance(stop, OSError) else KeyboardInterrupt) as e:
        save(fig, tmp_path / "fig.png")
    if isinstance(stop, OSError):
        said = str(e.value)
        assert "fig.png: No space left on device" in said and "bytes to write" in said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]
    assert (tmp_path / "fig.png").read_bytes() == b"good"  # the good one is kept
    assert fig.number not in plt.get_fignums()  # and the figure closed


def sweep_rows(context: int, statuses: list[str], measured: bool = True) -> list[dict]:
    """Rows of one context at batches 1, 2, 4, ...: measured where the status is ok."""
    nan = float("nan")
    return [
        {
            "context": context,
            "batch": 2**i,
            "status": s,
            "tokens_per_s": 100.0 * 2**i if s == "ok" and measured else nan,
            "step_ms": 10.0 if s == "ok" and measured else nan,
        }
        for i, s in enumerate(statuses)
    ]


def sweep_summary(context: int) -> dict:
    return {
        "context": context,
        "predicted_max_batch": 3,
        "measured_knee": None,
        "knee_threshold": 0.25,
        "predicted_knee": None,
        "predicted_knee_fits": False,
        "predicted_knee_note": "no prediction (unknown device)",
        "matmul_knee": None,
    }


@pytest.mark.parametrize(
    "rows",
    [
        sweep_rows(8, ["skipped", "skipped"]),
        sweep_rows(8, ["oom", "skipped"]),
        sweep_rows(8, ["ok", "ok"], measured=False),  # times lost: NaN where a number belongs
        sweep_rows(8, ["ok", "ok"]) + sweep_rows(64, ["skipped", "oom"]),
        sweep_rows(8, ["ok", "ok"], measured=False) + sweep_rows(64, ["ok", "ok"]),
        [],
    ],
    ids=["all-skipped", "oom-and-skipped", "ok-but-nan", "one-context-empty", "one-nan", "none"],
)
def test_the_sweep_figure_draws_rows_where_nothing_was_measured(tmp_path, rows):
    from benchbatch.output.plots.sweep import sweep_figure

    summary = [sweep_summary(ctx) for ctx in dict.fromkeys(r["context"] for r in rows)]
    sweep_figure(rows, summary, tmp_path / "sweep.png", "a sweep that measured little")
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.png"]


# --- round two: the cases of issue 13, each one instance of its class ------------------------

COSTS = "decode_tokens,prefill_tokens,context_tokens,step_ms\n"
GOOD_COSTS = COSTS + "1,0,10,1\n8,0,80,2\n0,64,0,3\n0,128,0,5\n4,64,100,4.5\n"
SHAPE = '"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4'
PROBE = "kind,label,dtype,tflops,gbps,status\nmatmul,m,fp32,{},,ok\nread,r,fp32,,{},ok\n"

ROUND_TWO_FILES = [
    # (command, option, content, what the line says)
    *[("ablation", "--step-costs", COSTS + f"1,0,10,{v}\n8,0,80,2\n", "step_ms")
      for v in ("0", "1e-300", "inf", "text", "-1", "1e300")],
    ("phases", "--ceilings", PROBE.format("1e300", "10"), "tflops"),
    ("phases", "--ceilings", PROBE.format("1e-300", "10"), "tflops ceiling"),
    ("phases", "--ceilings", PROBE.format("1", "1e300"), "gbps"),
    ("phases", "--config", '{"text_config": null}', "text_config"),
    ("phases", "--config", '{"text_config": 5}', "text_config"),
    ("phases", "--config", '{"hidden_size": ' + "9" * 5000 + "}", "5,000 digits"),
    ("phases", "--config", "[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ("phases", "--config", "{" + SHAPE + ', "rope_theta": NaN}', "rope_theta"),
    ("phases", "--config", "{" + SHAPE + ', "rms_norm_eps": -1e-6}', "rms_norm_eps"),
    ("phases", "--config", "{" + SHAPE + ', "rms_norm_eps": Infinity}', "rms_norm_eps"),
    ("phases", "--config", "{" + SHAPE + ', "head_dim": 0}', "head_dim"),
    ("phases", "--config", "{" + SHAPE + ', "model_type": ["llama"]}', "model_type"),
    *[("occupancy", "--trace", f"output_tokens,prompt_tokens\n5,{v}\n", "prompt")
      for v in ("1000000000", "1e9", "10" + "0" * 29)],
    *[("ablation", "--trace", f"output_tokens\n{v}\n", "output")
      for v in ("1000000000", "1e30")],
]  # fmt: skip


@pytest.mark.parametrize(("command", "option", "content", "says"), ROUND_TWO_FILES,
                         ids=lambda v: str(v)[:30])  # fmt: skip
def test_round_two_bad_files(runner, tmp_path, command, option, content, says):
    path = tmp_path / "input"
    path.write_text(content)
    (tmp_path / "costs.csv").write_text(GOOD_COSTS)
    extra = ["--step-costs", str(tmp_path / "costs.csv")] if command == "ablation" else []
    if option == "--step-costs":
        extra = []
    result = invoke(runner, command, [option, str(path), *extra], tmp_path)
    assert_one_line_error(result, option)
    assert says in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "option", "says"),
    [
        (["occupancy", "--seeds", "100", "--requests", "1000000"], "--seeds", "100,000,000"),
        (["ablation", "--requests", "100000", "--median", "1000", "--max-output", "2000"],
         "--requests", "steps"),
        (["ablation", "--requests", "100", "--arrival-rate", "0.0001", "--slo-ttft", "1",
          "--slo-tbt", "1"], "--requests", "steps"),
        (["reproduce", "--preset", "tiny", "--device", "cpu", "--probe-buffer-mb", str(2**39)],
         "--probe-buffer-mb", "MiB"),
        (["occupancy", "--engine", "real", "--preset", "tiny", "--device", "cpu", "--slots",
          "1000000", "--requests", "2000000", "--max-output", "100"], "--slots", "KV cache"),
        (["phases", "--repeats", "5000"], "--repeats", "at most 1,000"),
        (["phases", "--repeats", "x"], "--repeats", "'x' is not an integer"),
        (["phases", "--min-time", "1_0"], "--min-time", "'1_0' is not a number"),
        (["phases", "--repeats"], "--repeats", "needs a value"),
        (["phases", "--dtype", "fp8"], "--dtype", "'fp8' is not one of"),
        (["phases", "--prefil", "8"], "--prefil", "did you mean --prefill"),
        (["compare"], "RUN_DIR", "missing"),
    ],
    ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None,
)
def test_round_two_bad_options(runner, tmp_path, args, option, says):
    (tmp_path / "costs.csv").write_text(GOOD_COSTS)
    if args[0] == "ablation":
        args = [*args, "--step-costs", str(tmp_path / "costs.csv")]
    bare = args[0] == "compare" or args[-1] == "--repeats"
    out = [] if bare else ["--out", str(tmp_path / "run")]
    result = runner.invoke(app, [*args, *out])
    assert_one_line_error(result, option)
    assert result.stderr.startswith(f"Error: {option}: ") and says in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_sigma_of_negative_zero_is_zero(runner, tmp_path):
    for command in ("occupancy", "ablation"):
        (tmp_path / "costs.csv").write_text(GOOD_COSTS)
        args = [command, "--sigma", "-0.0", "--requests", "20", "--out", str(tmp_path / command)]
        if command == "ablation":
            args += ["--step-costs", str(tmp_path / "costs.csv")]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output


def test_an_ablation_of_one_token_outputs_has_no_gap_to_stall(runner, tmp_path):
    (tmp_path / "costs.csv").write_text(GOOD_COSTS)
    args = ["ablation", "--max-output", "1", "--step-costs", str(tmp_path / "costs.csv")]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "no gap between tokens to stall" in result.stdout
    assert (tmp_path / "run" / "ablation_tbt.png").exists()


def test_a_piggyback_batch_too_large_to_allocate_is_an_oom_row(runner, tmp_path):
    args = [*SHAPES["piggyback"], "--decode-batch", "100000000", "--out", str(tmp_path / "run")]
    result = runner.invoke(app, ["piggyback", *args])
    assert result.exit_code == 0, result.output
    steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    big = steps[steps["decode_batch"] == 100000000]
    assert len(big) and (big["status"] == "oom").all()


@pytest.mark.parametrize("where", ["trace", "step-costs", "ceilings", "config", "prompts"])
def test_a_byte_order_mark_is_accepted_everywhere(runner, tmp_path, where):
    bom = "\ufeff"
    path = tmp_path / "input"
    if where == "trace":
        path.write_text(bom + "output_tokens,prompt_tokens\n5,8\n6,9\n")
        assert read_trace(path) == [Request(0, 8, 5), Request(1, 9, 6)]
    elif where == "step-costs":
        from benchbatch.core.stepcost import cost_rows_from_csv

        path.write_text(bom + GOOD_COSTS)
        assert len(cost_rows_from_csv([path])) == 5
    elif where == "ceilings":
        from benchbatch.core.roofline import ceilings_from_csv

        path.write_text(bom + PROBE.format("2", "30"))
        assert ceilings_from_csv(path).peak_tflops == 2
    elif where == "config":
        from benchbatch.core.hfconfig import from_hf_config

        path.write_text(bom + "{" + SHAPE + "}")
        assert from_hf_config(path).hidden == 64
    else:
        from benchbatch.core.prompts import read_prompts

        path.write_text(bom + "hello\nworld\n")
        assert read_prompts(path) == ["hello", "world"]


@pytest.mark.parametrize(
    ("command", "args", "line"),
    [
        # the options as typed, not their field names
        ("serve-sweep", ["--prompt-dist", "lognormal", "--prompt-len", "128", "--max-prompt",
                         "32"], "Error: --prompt-len: 128 lies outside [1, 32] (--min-prompt, "
         "--max-prompt)"),
        ("serve-sweep", ["--min-prompt", "64", "--max-prompt", "32"],
         "Error: --min-prompt: 64 is more than --max-prompt 32"),
        # a count past a trillion in e-notation, not 300 digits
        ("occupancy", ["--arrivals-per-step", "1e-300"], "Error: --arrivals-per-step: 1e-300 "
         "spreads 20 arrivals over about 2e+301 steps (at most 10,000,000); raise it"),
        # a missing tokenizer before the workload is drawn (no warning about it before)
        ("serve-sweep", ["--endpoint", "http://127.0.0.1:9", "--tokenizer", "/nonexistent"],
         "Error: --tokenizer: /nonexistent is not a file (a tokenizer.json or a folder with "
         "one)"),
    ],
)  # fmt: skip
def test_an_error_reads_as_the_user_typed_it(runner, tmp_path, command, args, line):
    result = invoke(runner, command, args, tmp_path)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [line]


def test_an_empty_out_is_refused_not_the_current_folder(runner, tmp_path, monkeypatch):
    """--out '' was read as '.', the current folder (refused as not empty, or written into
    with --force)."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["project", "--out", "", "--force"])
    assert_one_line_error(result, "--out")
    assert list(tmp_path.iterdir()) == []
