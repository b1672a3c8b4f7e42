"""One name, one unit: latency options take a unit or milliseconds (vLLM's), one concept has
one flag in every command, and each old spelling still works, hidden, with its old unit.

The options objects are taken from the command line itself (each command's own options
through app/params.py's `command`), without running the experiment."""

from __future__ import annotations

import math

import pytest
import typer

from benchbatch.app.params import command
from benchbatch.app.registry import registered
from benchbatch.core.units import duration_text, parse_duration
from benchbatch.errors import UserError
from benchbatch.experiments.common import LIST_FLAGS

EXPERIMENTS = {e.name: e for e, _ in registered()}


def parsed(runner, name: str, *args: str) -> dict:
    """Every field of the command's options objects, as the command line builds them."""
    got: dict = {}

    def capture(*groups) -> None:
        for group in groups:
            got.update(vars(group))

    app = typer.Typer()
    app.command()(command(*EXPERIMENTS[name].options)(capture))
    result = runner.invoke(app, list(args))
    if result.exit_code != 0:
        raise AssertionError(result.output)
    return got


def refused(runner, name: str, *args: str) -> str:
    """The UserError a command line gives, as 'OPTION: message'."""

    def capture(*groups) -> None:
        raise AssertionError("accepted")

    app = typer.Typer()
    app.command()(command(*EXPERIMENTS[name].options)(capture))
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, UserError), result.output
    return f"{result.exception.option}: {result.exception.message}"


# --- the parser ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("200ms", 0.2), ("2s", 2.0), ("2 s", 2.0), ("2000", 2.0), ("1.5S", 1.5), ("500us", 5e-4),
     ("500µs", 5e-4), (" 3 ms ", 3e-3), ("1e3", 1.0), ("+40ms", 0.04), ("1", 1e-3)],
)  # fmt: skip
def test_durations_with_a_unit_or_in_milliseconds(text, seconds):
    assert parse_duration(text, "--slo-ttft") == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "says"),
    [("0", "more than 0"), ("0ms", "more than 0"), ("-1s", "more than 0"), ("-0", "more than 0"),
     ("nan", "not a duration"), ("inf", "not a duration"), ("1e999", "finite"),
     ("2h", "not a duration"), ("2 m", "not a duration"), ("abc", "not a duration"),
     ("", "not a duration"), ("1_000", "not a duration"), ("١٢", "not a duration"),
     ("0.2", "write 0.2s for seconds")],
)  # fmt: skip
def test_bad_durations_name_the_option(text, says):
    with pytest.raises(UserError) as err:
        parse_duration(text, "--slo-tpot")
    assert err.value.option == "--slo-tpot" and says in err.value.message


def test_old_unit_and_zero_where_allowed():
    assert parse_duration("0.2", "--slo-tpot-s", bare="s") == 0.2  # the old spelling
    assert parse_duration("5", "--allreduce-latency-us", bare="us") == pytest.approx(5e-6)
    assert parse_duration("0", "--allreduce-latency", zero=True) == 0.0
    assert parse_duration(0.25, "--x") == 0.25  # a default or a caller's number: seconds


@pytest.mark.parametrize("seconds", [2.0, 0.2, 2e-5, 1.5, 1e-3, 7.25e-4, 3600.0])
def test_a_default_shown_reads_back_as_itself(seconds):
    assert math.isclose(parse_duration(duration_text(seconds), "--x", zero=True), seconds)


# --- the commands --------------------------------------------------------------------------


def test_serve_sweep_slos_in_milliseconds_or_with_a_unit(runner):
    default = parsed(runner, "serve-sweep")
    assert (default["slo_ttft"], default["slo_tpot"]) == (2.0, 0.2)  # held in seconds
    for args, ttft, tpot in [
        (["--slo-ttft", "1500", "--slo-tpot", "50"], 1.5, 0.05),  # vLLM's --goodput ttft:1500
        (["--slo-ttft", "3s", "--slo-tpot", "80ms"], 3.0, 0.08),
        (["--slo-ttft-s", "4", "--slo-tpot-s", "0.1"], 4.0, 0.1),  # the old spelling, seconds
    ]:
        got = parsed(runner, "serve-sweep", *args)
        assert (got["slo_ttft"], got["slo_tpot"]) == pytest.approx((ttft, tpot)), args


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--slo-tpot", "0.2"], "--slo-tpot: a bare number is milliseconds"),
     (["--slo-ttft", "0"], "--slo-ttft: must be more than 0"),
     (["--slo-ttft-s", "-1"], "--slo-ttft-s: must be more than 0"),
     (["--slo-tpot-s", "nan"], "--slo-tpot-s: 'nan' is not a duration")],
)  # fmt: skip
def test_serve_sweep_refuses_bad_slos_naming_the_spelling_typed(runner, args, says):
    assert refused(runner, "serve-sweep", *args).startswith(says)


def test_ablation_slos_take_the_same_units(runner):
    got = parsed(runner, "ablation", "--slo-ttft", "1s", "--slo-tbt", "150")
    assert (got["slo_ttft"], got["slo_tbt"]) == pytest.approx((1.0, 0.15))
    old = parsed(runner, "ablation", "--slo-ttft-s", "0.5", "--slo-tbt-s", "0.2")
    assert (old["slo_ttft"], old["slo_tbt"]) == pytest.approx((0.5, 0.2))
    assert refused(runner, "ablation", "--slo-ttft", "1s", "--slo-tbt", "0.2").startswith(
        "--slo-tbt: a bare number is milliseconds"
    )


def test_project_latency_held_in_microseconds(runner):
    assert parsed(runner, "project")["allreduce_latency_us"] is None  # the default: 20 us
    for args, us in [(["--allreduce-latency", "20us"], 20.0),
                     (["--allreduce-latency", "0.05ms"], 50.0),
                     (["--allreduce-latency", "2"], 2000.0),  # a bare number: milliseconds
                     (["--allreduce-latency", "0"], 0.0),  # an ideal link
                     # under 1 ms as a bare number: an all-reduce's latency, not seconds
                     (["--allreduce-latency", "0.02"], 20.0),
                     (["--allreduce-latency-us", "5"], 5.0)]:  # fmt: skip
        assert parsed(runner, "project", *args)["allreduce_latency_us"] == pytest.approx(us)
    assert refused(runner, "project", "--allreduce-latency-us", "-5").startswith(
        "--allreduce-latency-us: must be at least 0"
    )


DECODE_BATCH = ["phases", "piggyback", "project", "sweep", "reproduce"]


@pytest.mark.parametrize("name", DECODE_BATCH)
def test_decode_batch_sizes_are_one_flag_everywhere(runner, name):
    field = "batch" if name == "sweep" else "decode_batch"
    assert parsed(runner, name, "--decode-batch", "4,2")[field] == (2, 4)


def test_sweep_batch_keeps_its_old_name_and_reproduce_names_both(runner):
    assert parsed(runner, "sweep", "--batch", "8,1")["batch"] == (1, 8)
    assert refused(runner, "sweep", "--batch", "0").startswith("--batch: ")
    assert refused(runner, "sweep", "--decode-batch", "0").startswith("--decode-batch: ")
    # reproduce times both: phases' decode batches and the sweep's
    both = parsed(runner, "reproduce", "--decode-batch", "1,2", "--sweep-batch", "4,8")
    assert (both["decode_batch"], both["batch"]) == ((1, 2), (4, 8))
    old = parsed(runner, "reproduce", "--decode-batch", "1,2", "--batch", "16")
    assert (old["decode_batch"], old["batch"]) == ((1, 2), (16,))


@pytest.mark.parametrize("name", ["occupancy", "ablation"])
def test_arrivals_per_step_named_for_their_unit(runner, name):
    assert parsed(runner, name, "--arrivals-per-step", "0.5")["arrival_rate"] == 0.5
    assert parsed(runner, name, "--arrival-rate", "0.75")["arrival_rate"] == 0.75
    assert refused(runner, name, "--arrival-rate", "0").startswith("--arrival-rate: ")
    assert refused(runner, name, "--arrivals-per-step", "0").startswith("--arrivals-per-step: ")


@pytest.mark.parametrize("name", ["occupancy", "serve-sweep", "sweep", "reproduce"])
def test_output_lengths_named_beside_the_prompt_ones(runner, name):
    new = parsed(runner, name, "--output-median", "30", "--output-sigma", "0.5")
    old = parsed(runner, name, "--median", "30", "--sigma", "0.5")
    assert (new["median"], new["sigma"]) == (old["median"], old["sigma"]) == (30.0, 0.5)


def test_the_estimate_advises_flags_the_commands_take(runner):
    """A long run's advice names its lists by flag ('--decode-batch 1,8'): flags of the
    command it is printed for."""
    for name, fields in (("phases", ("prefill", "decode_batch", "context")),
                         ("sweep", ("batch", "context"))):  # fmt: skip
        app = typer.Typer()
        app.command()(command(*EXPERIMENTS[name].options)(lambda *g: None))
        cmd = typer.main.get_command(app)
        flags = {o for p in cmd.params if not p.hidden for o in p.opts}
        for field in fields:
            assert LIST_FLAGS[field] in flags, (name, field)


def test_vllm_bench_serves_names_are_taken_and_its_inf_named():
    """A vLLM user's --request-rate and --num-prompts, and --max-num-seqs: the same fields
    as --rates, --requests and --slots; --rates inf (vLLM's every-request-at-once) is named
    as benchbatch's max."""
    from typer.testing import CliRunner

    runner = CliRunner()
    got = parsed(runner, "serve-sweep", "--request-rate", "1,max", "--num-prompts", "20",
                 "--max-num-seqs", "4")  # fmt: skip
    assert (got["rates"], got["requests"], got["slots"]) == (("1", "max"), 20, 4)
    assert parsed(runner, "occupancy", "--num-prompts", "30")["requests"] == 30
    said = refused(runner, "serve-sweep", "--rates", "inf")
    assert said.startswith("--rates: inf is no rate here: write max")
    assert "--request-rate inf" in said
