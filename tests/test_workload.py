"""Workload generator and CSV traces: seeded, validated, errors as one line naming the input."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from benchbatch.engines.workload import Request, lognormal_workload, read_trace
from benchbatch.errors import UserError


def test_same_seed_same_workload_and_another_seed_differs():
    a = lognormal_workload(
        500, seed=7, arrival_rate=0.3, long_prompt_fraction=0.1, long_prompt_len=999
    )
    b = lognormal_workload(
        500, seed=7, arrival_rate=0.3, long_prompt_fraction=0.1, long_prompt_len=999
    )
    c = lognormal_workload(
        500, seed=8, arrival_rate=0.3, long_prompt_fraction=0.1, long_prompt_len=999
    )
    assert a == b
    assert [r.output_tokens for r in a] != [r.output_tokens for r in c]


def test_output_lengths_follow_the_lognormal_and_are_clipped():
    reqs = lognormal_workload(20_000, median=70, sigma=0.9, max_output=500, seed=1)
    outputs = [r.output_tokens for r in reqs]
    assert [r.id for r in reqs] == list(range(20_000))
    assert 66 <= statistics.median(outputs) <= 74
    assert min(outputs) >= 1 and max(outputs) == 500  # the tail above 500 is clipped
    assert all(r.prompt_tokens == 64 and r.arrival_step == 0 for r in reqs)


def test_tiny_median_still_gives_at_least_one_token():
    assert min(r.output_tokens for r in lognormal_workload(1000, median=0.2, seed=0)) == 1


def test_reference_trace_seed_3_has_the_articles_tail():
    # shared/reference.md: the seed that gave 10,089 vs 2,576 steps; its longest request.
    assert max(r.output_tokens for r in lognormal_workload(600, seed=3)) == 1393


def test_arrivals_are_a_poisson_process_in_whole_steps():
    reqs = lognormal_workload(5000, arrival_rate=0.5, seed=2)
    steps = [r.arrival_step for r in reqs]
    assert steps == sorted(steps) and steps[0] >= 0
    assert 0.47 <= len(steps) / steps[-1] <= 0.53  # about 0.5 requests per step
    # Arrivals come from their own stream: the output lengths of the seed do not change.
    plain = lognormal_workload(5000, seed=2)
    assert [r.output_tokens for r in reqs] == [r.output_tokens for r in plain]


def test_long_prompt_fraction_is_exact():
    reqs = lognormal_workload(200, long_prompt_fraction=0.15, long_prompt_len=4096, prompt_len=32)
    prompts = [r.prompt_tokens for r in reqs]
    assert prompts.count(4096) == 30 and prompts.count(32) == 170


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"requests": 0}, "--requests"),
        ({"requests": -3}, "--requests"),
        ({"median": 0}, "--median"),
        ({"sigma": -1}, "--sigma"),
        ({"max_output": 0}, "--max-output"),
        ({"prompt_len": 0}, "--prompt-len"),
        ({"arrival_rate": 0}, "--arrival-rate"),
        ({"long_prompt_fraction": 1.5, "long_prompt_len": 10}, "--long-prompt-fraction"),
        ({"long_prompt_fraction": 0.5}, "--long-prompt-len"),
    ],
)
def test_bad_options_raise_user_error_naming_the_option(kwargs, option):
    kwargs = {"requests": 10, **kwargs}
    requests = kwargs.pop("requests")
    with pytest.raises(UserError) as e:
        lognormal_workload(requests, **kwargs)
    assert e.value.option == option
    assert str(e.value).startswith(option) and "\n" not in str(e.value)


def test_request_rejects_impossible_lengths():
    with pytest.raises(ValueError):
        Request(0, prompt_tokens=1, output_tokens=0)


# --- traces -------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_read_trace_with_defaults_and_optional_columns(tmp_path):
    path = write(tmp_path, "output_tokens,arrival_step,prompt_tokens\n5,0,10\n 7 ,3,\n\n1,3,2\n")
    assert read_trace(path, prompt_tokens=33) == [
        Request(0, 10, 5, 0),
        Request(1, 33, 7, 3),
        Request(2, 2, 1, 3),
    ]
    only_outputs = write(tmp_path, "output_tokens\n4\n9\n")
    assert read_trace(only_outputs) == [Request(0, 64, 4, 0), Request(1, 64, 9, 0)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("prompt_tokens\n5\n", "no column 'output_tokens'"),
        ("output_tokens\n5\n0\n", "line 3: output_tokens must be positive, got 0"),
        ("output_tokens\n-2\n", "line 2: output_tokens must be positive, got -2"),
        ("output_tokens,prompt_tokens\n5,0\n", "line 2: prompt_tokens must be positive"),
        ("output_tokens\n5.5\n", "line 2: output_tokens '5.5' is not an integer"),
        ("output_tokens\n\n3\nabc\n", "line 4: output_tokens 'abc' is not an integer"),
        ("output_tokens,arrival_step\n5,-1\n", "line 2: arrival_step must be zero or more"),
        ("", "is empty"),
        ("output_tokens\n", "no requests"),
    ],
)
def test_bad_traces_raise_one_line_naming_file_and_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        read_trace(path)
    message = str(e.value)
    assert e.value.option == "--trace"
    assert str(path) in message and expected in message and "\n" not in message


def test_unreadable_paths_raise_user_error(tmp_path):
    for path in (tmp_path / "missing.csv", tmp_path):
        with pytest.raises(UserError) as e:
            read_trace(path)
        assert e.value.option == "--trace" and str(path) in str(e.value)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"output_tokens\n\xff\xfe\n")
    with pytest.raises(UserError, match="cannot read"):
        read_trace(binary)


def test_arrival_zero_is_allowed(tmp_path):
    assert read_trace(write(tmp_path, "output_tokens,arrival_step\n2,0\n"))[0].arrival_step == 0
