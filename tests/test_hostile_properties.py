"""Generated hostile input on every path a value enters by: the options of every command,
config.json (--config and a checkpoint's), --trace, --step-costs, --ceilings, --prompts and
the folders compare reads. Each either gives sane values or is refused in one line naming
the option (exit code 2 through the command line); none crashes, hangs or overflows."""

from __future__ import annotations

import inspect
import json
import math
import os
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from benchbatch.app.cli import app
from benchbatch.errors import UserError

# A few seconds each; HOSTILE_EXAMPLES=2000 for a longer hunt.
QUICK = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def one_line_error(result, option: str | None = None) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    if option is not None:
        assert lines[0].startswith(f"Error: {option}"), lines[0]
    return lines[0]


def refused_in_one_line(e: UserError, option: str, path: Path | None = None) -> None:
    assert e.option == option, (e.option, e.message)
    assert "\n" not in e.message and "\r" not in e.message and len(e.message) < 600
    if path is not None:
        assert str(path) in e.message


# --- options through the command line ------------------------------------------------------

INT_MAX = 2**63 - 1
# Values no option of its kind takes: every number option is >= 0 (most > 0), every
# integer one an integer of 64 bits at most, every list one of such integers.
BAD_FLOATS = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999", "", " "]),
    st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet="x[]/$:^é\x00-_ ", min_size=1, max_size=8),
)
BAD_INTS = st.one_of(
    st.integers(max_value=-1).map(str),
    st.integers(min_value=INT_MAX + 1, max_value=10**40).map(str),
    st.sampled_from(["1.5", "1e3", "1_000", "٣", "0x10", "", "nan", "inf", "9" * 5000]),
    st.text(alphabet="x[]/$:^-", min_size=1, max_size=8),
)
BAD_LISTS = st.one_of(
    BAD_INTS,
    st.sampled_from(["1,,2", ",", "1,-2", "2,x", "0.5", str(2**31)]),
)


# Lists of rates take decimals (0.5 req/s) and 'max': their own hostile values below.
RATE_LISTS = ("--rates", "--real-rates")
BAD_RATES = st.one_of(
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e999", "1_000", "٣", "0x10", ""]),
    st.sampled_from(["1,,2", ",", "2,x", "max,0", "1e300", "-0.0", " , "]),
    st.floats(max_value=0, allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet="x[]/$:^-", min_size=1, max_size=8),
)


def options_of(kind: str) -> list[tuple[str, str]]:
    """(command, flag) of every visible option whose values are of this kind, read from the
    signatures app/params.py made from the options dataclasses."""
    out = []
    for info in app.registered_commands:
        for p in inspect.signature(info.callback).parameters.values():
            base, option = typing.get_args(p.annotation)
            decls = getattr(option, "param_decls", None) or ()
            if isinstance(getattr(option, "default", None), str):  # Annotated: the flag
                decls = (option.default, *decls)
            if getattr(option, "hidden", False) or not decls or not decls[0].startswith("--"):
                continue
            base = next((a for a in typing.get_args(base) if a is not type(None)), base)
            is_list = "comma-separated" in (option.help or "") and decls[0] not in RATE_LISTS
            if (kind == "list" and is_list) or (kind == "int" and base is int) or (
                kind == "float" and base is float
            ):
                out.append((info.name, decls[0].split("/")[0]))
    return sorted(out)


def test_the_tables_of_options_are_not_empty():
    assert len(options_of("int")) > 20 and len(options_of("float")) > 10
    assert len(options_of("list")) > 8


@QUICK
@given(st.data())
def test_every_number_option_refuses_a_bad_value_in_one_line(runner, tmp_path, data):
    kind = data.draw(st.sampled_from(["int", "float", "list"]))
    command, flag = data.draw(st.sampled_from(options_of(kind)))
    value = data.draw({"int": BAD_INTS, "float": BAD_FLOATS, "list": BAD_LISTS}[kind])
    args = [command, f"{flag}={value}", "--out", str(tmp_path / "run")]
    if command == "compare":
        args = [command, str(tmp_path), str(tmp_path / "x"), f"{flag}={value}"]
    result = runner.invoke(app, args)
    line = one_line_error(result)
    assert flag in line or command == "compare", line
    assert not (tmp_path / "run").exists()


@QUICK
@given(flag=st.sampled_from(RATE_LISTS), value=BAD_RATES)
def test_every_rate_list_refuses_a_bad_value_in_one_line(runner, tmp_path, flag, value):
    out = tmp_path / "run"
    result = runner.invoke(app, ["serve-sweep", f"{flag}={value}", "--out", str(out)])
    assert flag in one_line_error(result)
    assert not out.exists()


# --- config.json ------------------------------------------------------------------------------

BASE_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 256,
}
KEYS = [
    *BASE_CONFIG, "head_dim", "rope_theta", "rms_norm_eps", "rope_scaling", "rope_parameters",
    "text_config", "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act",
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "partial_rotary_factor", "quantization_config", "original_max_position_embeddings",
    "torch_dtype", "eos_token_id",
]  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 1e-300, 1e300, -0.0, 1.5, 2**63, "llama", "qwen3", "linear",
                     "llama3", "yarn", "silu", "gelu", "full_attention", "$^$", "[/]"]),
    st.text(max_size=10),
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["type", "rope_type", "factor", "rope_theta",
                                         "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings", *KEYS[:4]]),
                        inner, max_size=4),  # fmt: skip
    ),
    max_leaves=8,
)


@st.composite
def configs(draw) -> str:
    kind = draw(st.sampled_from(["edited", "edited", "any", "text"]))
    if kind == "text":
        return draw(st.sampled_from(["", "{", "[" * 5000, '{"a":' + "9" * 5000 + "}", "\ufeff{}"]))
    if kind == "any":
        return json.dumps(draw(JSON))
    config = dict(BASE_CONFIG)
    for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True)):
        config[key] = draw(JSON)
    if draw(st.booleans()):
        config = {"text_config": config, "model_type": draw(SCALARS)}
    return json.dumps(config)  # NaN and Infinity as Python writes them, as JSON allows


def check_config(cfg) -> None:
    """A config that passed is one a model can be built from: sizes and numbers sane."""
    for field in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab",
                  "max_context", "head_dim"):  # fmt: skip
        value = getattr(cfg, field)
        assert isinstance(value, int) and 1 <= value <= INT_MAX, (field, value)
    assert cfg.heads % cfg.kv_heads == 0 and cfg.head_dim % 2 == 0
    assert 1 < cfg.rope_theta <= 1e12 and 0 < cfg.norm_eps <= 1
    if cfg.rope_scaling is not None:
        assert math.isfinite(cfg.rope_scaling.factor) and cfg.rope_scaling.factor >= 1


@QUICK
@given(configs())
def test_config_json_gives_a_model_or_names_the_option(tmp_path, text):
    from benchbatch.core.hfconfig import from_hf_config

    path = tmp_path / "config.json"
    path.write_text(text)
    try:
        cfg = from_hf_config(path)
    except UserError as e:
        refused_in_one_line(e, "--config")
        return
    check_config(cfg)


@QUICK
@given(configs())
def test_a_checkpoints_config_gives_a_model_or_names_model(tmp_path, text):
    from benchbatch.runtime import checkpoint

    (tmp_path / "ckpt").mkdir(exist_ok=True)
    (tmp_path / "ckpt" / "config.json").write_text(text)
    try:
        cfg = checkpoint.read_config(tmp_path / "ckpt")
        checkpoint.stored_dtype(tmp_path / "ckpt")
    except UserError as e:
        refused_in_one_line(e, "--model")
        return
    check_config(cfg)


# --- CSV inputs -------------------------------------------------------------------------------

CELLS = st.one_of(
    st.integers(-3, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "0", "1e-300", "1e300", "inf", "nan", "x", "ok", "oom", "matmul",
                     "read", "copy", "decode", "prefill", "fp32", '"', "9" * 400, "$^$"]),
    st.text(max_size=5),
)  # fmt: skip


def csv_files(headers: list[str]):
    @st.composite
    def build(draw) -> bytes:
        names = draw(st.lists(st.sampled_from(headers), min_size=1, max_size=len(headers)))
        rows = draw(st.lists(st.lists(CELLS, min_size=len(names), max_size=len(names)),
                             max_size=6))  # fmt: skip
        text = "\n".join(",".join(r) for r in [names, *rows]) + "\n"
        bom = "\ufeff" if draw(st.booleans()) else ""
        return (bom + text).encode("utf-8", "surrogatepass")

    return build()


STEP_COST_HEADERS = ["decode_tokens", "prefill_tokens", "context_tokens", "step_ms", "status",
                     "phase", "batch", "tokens", "context", "decode_batch", "x"]  # fmt: skip


# An integer no float holds: pandas raised OverflowError on it (found by a random run).
HUGE = b"decode_tokens,prefill_tokens,context_tokens,step_ms\n0,0,0,0\n0,0,0," + b"9" * 400 + b"\n"


@QUICK
@given(csv_files(STEP_COST_HEADERS))
@example(HUGE)
@example(HUGE.replace(b"0,0,0," + b"9" * 400, b"2," + b"9" * 400 + b",0,5"))
def test_step_costs_give_a_finite_cost_model_or_name_the_option(tmp_path, content):
    from benchbatch.core import stepcost

    path = tmp_path / "costs.csv"
    path.write_bytes(content)
    try:
        model, fitted = stepcost.fit(stepcost.cost_rows_from_csv([path]))
    except UserError as e:
        refused_in_one_line(e, "--step-costs")
        return
    coefficients = (model.base_s, model.per_decode_token_s, model.per_prefill_token_s,
                    model.per_context_token_s)  # fmt: skip
    assert all(math.isfinite(c) for c in coefficients)
    assert all(math.isfinite(r["fitted_ms"]) for r in fitted)


PROBE_HEADERS = ["kind", "label", "dtype", "tflops", "gbps", "status", "size"]


@QUICK
@given(csv_files(PROBE_HEADERS))
def test_probe_csv_gives_sane_ceilings_or_names_the_option(tmp_path, content):
    from benchbatch.core.roofline import ceilings_from_csv

    path = tmp_path / "probe.csv"
    path.write_bytes(content)
    try:
        c = ceilings_from_csv(path, "--ceilings")
    except UserError as e:
        refused_in_one_line(e, "--ceilings", path)
        return
    assert 1e-6 <= c.peak_tflops <= 1e5 and 1e-3 <= c.peak_gbps <= 1e6
    assert math.isfinite(c.ridge) and c.ridge > 0


TRACE_HEADERS = ["output_tokens", "prompt_tokens", "arrival_step", "x"]


@QUICK
@given(csv_files(TRACE_HEADERS))
def test_a_trace_through_the_options_is_within_the_limits_or_refused(tmp_path, content):
    from benchbatch.core.options import WorkloadOptions

    path = tmp_path / "trace.csv"
    path.write_bytes(content)
    options = WorkloadOptions(trace=path)
    try:
        w = options.draw()
    except UserError as e:
        refused_in_one_line(e, "trace", path)
        return
    assert len(w) and int(w.prompt_tokens.max()) <= options.MAX_TOKENS
    assert int(w.output_tokens.max()) <= options.MAX_TOKENS
    assert int(w.arrival_step.max()) <= options.MAX_ARRIVAL_SPAN


@QUICK
@given(st.one_of(st.binary(max_size=100), st.text(max_size=100).map(str.encode),
                 st.lists(JSON, max_size=3).map(lambda v: "\n".join(map(json.dumps, v)).encode())))
def test_prompts_give_strings_or_name_the_option(tmp_path, content):  # fmt: skip
    from benchbatch.core.prompts import read_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    try:
        prompts = read_prompts(path)
    except UserError as e:
        refused_in_one_line(e, "--prompts", path)
        return
    assert prompts and all(isinstance(p, str) for p in prompts)


# --- the folders compare reads ------------------------------------------------------------------

META = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"command": st.one_of(st.sampled_from(["phases", "probe", "occupancy"]), SCALARS),
         "schema_version": st.one_of(st.just(1), SCALARS)},
        optional={"config": JSON, "environment": JSON, "options": JSON, "status": JSON},
    ),
)  # fmt: skip
TABLE_HEADERS = ["kind", "label", "tflops", "gbps", "status", "phase", "batch", "tokens",
                 "step_ms", "us_per_token", "policy", "slots", "total_steps", "occupancy",
                 "speedup_vs_static"]  # fmt: skip


@QUICK
@given(META, csv_files(TABLE_HEADERS))
@example({"command": "phases", "schema_version": 1},
         b"label,step_ms,tokens\nprefill 8,1.5,8\nprefill 9," + b"9" * 400 + b",9\n")
@example({"command": "occupancy", "schema_version": 1},
         b"policy,total_steps\nstatic," + b"9" * 400 + b"\n")  # fmt: skip
def test_compares_folder_reader_gives_a_run_or_names_the_folder(tmp_path, meta, table):
    from benchbatch.output import compare

    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    (folder / "metadata.json").write_text(json.dumps(meta))
    for name in ("probe", "phases", "occupancy"):
        (folder / f"{name}.csv").write_bytes(table)
    try:
        run = compare.load(folder, "a")
    except UserError as e:
        refused_in_one_line(e, "RUN_DIR")
        return
    described = run.describe()
    assert all(isinstance(v, str | bool) or v is None for v in described.values())
    for df in run.tables.values():
        for col in set(compare.NUMERIC) & set(df.columns):
            values = df[col].dropna()
            assert ((values >= 0) & (values <= compare.MAX_VALUE)).all()


# --- a file that is not a regular file ------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("phases", "--config"),
        ("occupancy", "--trace"),
        ("phases", "--ceilings"),
        ("ablation", "--step-costs"),
    ],
)
def test_a_fifo_is_refused_not_read_forever(runner, tmp_path, command, option):
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    args = [command, option, str(fifo), "--device", "cpu", "--out", str(tmp_path / "run")]
    line = one_line_error(runner.invoke(app, args), option)
    assert "not a regular file" in line and not (tmp_path / "run").exists()


def test_a_fifo_in_compare_and_prompts_is_refused(tmp_path):
    from benchbatch.core.prompts import read_prompts
    from benchbatch.output import compare

    os.mkfifo(tmp_path / "prompts.txt")
    with pytest.raises(UserError, match="not a regular file"):
        read_prompts(tmp_path / "prompts.txt")
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "metadata.json")
    with pytest.raises(UserError, match="not a regular file"):
        compare.load(tmp_path / "run", "a")
