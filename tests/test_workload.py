"""Workload generator and CSV traces: seeded, validated, errors as one line naming the input."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchbatch.core.trace import _read_trace_rows, plain_trace, read_trace, read_trace_columns
from benchbatch.core.workload import Request, Workload, lognormal_columns, lognormal_workload
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
        ({"requests": 0}, "requests"),
        ({"requests": -3}, "requests"),
        ({"median": 0}, "median"),
        ({"sigma": -1}, "sigma"),
        ({"max_output": 0}, "max_output"),
        ({"prompt_len": 0}, "prompt_len"),
        ({"arrival_rate": 0}, "arrival_rate"),
        ({"long_prompt_fraction": 1.5, "long_prompt_len": 10}, "long_prompt_fraction"),
        ({"long_prompt_fraction": 0.5}, "long_prompt_len"),
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
        ("output_tokens\n5\n" + "9" * 30 + "\n", "line 3: output_tokens is more than"),
        ("", "is empty"),
        ("output_tokens\n", "no requests"),
    ],
)
def test_bad_traces_raise_one_line_naming_file_and_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        read_trace(path)
    message = str(e.value)
    assert e.value.option == "trace"
    assert str(path) in message and expected in message and "\n" not in message


def test_unreadable_paths_raise_user_error(tmp_path):
    for path in (tmp_path / "missing.csv", tmp_path):
        with pytest.raises(UserError) as e:
            read_trace(path)
        assert e.value.option == "trace" and str(path) in str(e.value)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"output_tokens\n\xff\xfe\n")
    with pytest.raises(UserError, match="cannot read"):
        read_trace(binary)


def test_arrival_zero_is_allowed(tmp_path):
    assert read_trace(write(tmp_path, "output_tokens,arrival_step\n2,0\n"))[0].arrival_step == 0


# --- columns ------------------------------------------------------------------------------


def test_lognormal_columns_are_the_same_requests_as_the_list():
    options = dict(arrival_rate=0.7, long_prompt_fraction=0.25, long_prompt_len=500, seed=9)
    columns = lognormal_columns(4000, **options)
    assert columns.to_requests() == lognormal_workload(4000, **options)
    assert list(columns) == columns.to_requests() and len(columns) == 4000
    assert columns[17] == lognormal_workload(4000, **options)[17]
    assert columns[10:20].to_requests() == columns.to_requests()[10:20]
    assert Workload.of(columns.to_requests()) == columns and Workload.of(columns) is columns
    assert columns.output_tokens.dtype == np.int64
    # The seed shared/reference.md quotes keeps its longest request.
    assert lognormal_columns(600, seed=3).output_tokens.max() == 1393


def test_workload_rejects_impossible_lengths_as_request_does():
    with pytest.raises(ValueError):
        Workload(np.arange(2), np.array([1, 1]), np.array([1, 0]), np.array([0, 0]))
    with pytest.raises(ValueError):
        Workload(np.arange(2), np.array([1, 1]), np.array([1]), np.array([0, 0]))


# --- traces: the plain fast reader against the row-by-row one -------------------------------


def rows_reader(path: Path, prompt_tokens: int):
    """The csv-module reader alone: its requests, or the UserError it raises."""
    try:
        return Workload.of(_read_trace_rows(path, prompt_tokens))
    except UserError as e:
        return e.message


def test_a_large_plain_trace_is_read_at_once_and_equals_the_row_reader(tmp_path):
    rng = np.random.default_rng(0)
    n = 20_000
    outputs, prompts = rng.integers(1, 3000, n), rng.integers(1, 900, n)
    arrivals = np.cumsum(rng.integers(0, 3, n))
    text = "arrival_step,output_tokens,x,prompt_tokens\r\n" + "".join(
        f"{a},{o},{i},{'' if i % 5 == 0 else p}\r\n"
        for i, (a, o, p) in enumerate(zip(arrivals, outputs, prompts, strict=True))
    )
    path = tmp_path / "trace.csv"
    path.write_text(text, newline="")
    fast = plain_trace(path, prompt_tokens=33)
    assert fast is not None and fast == rows_reader(path, 33)
    assert (fast.prompt_tokens[::5] == 33).all() and fast.arrival_step.tolist() == arrivals.tolist()
    assert read_trace_columns(path, 33) == fast and read_trace(path, 33) == fast.to_requests()


ODD_CELLS = ["", "0", "007", "9" * 17, "9" * 30, " 3", "+4", "1_0", "-1", "1.0", '"5"', "a"]


@st.composite
def near_plain_traces(draw) -> bytes:
    """Plain traces, half of them with one oddity: a value, a field too many or too few, a
    blank line, a lone \r, a header without output_tokens or with a name twice."""
    extra = draw(st.lists(st.sampled_from(["prompt_tokens", "arrival_step", "id", " x "])))
    header = draw(st.permutations(["output_tokens", *dict.fromkeys(extra)]))
    cells = st.integers(0, 3000).map(str) | st.sampled_from(["", "1"])
    row = st.lists(cells, min_size=len(header), max_size=len(header))
    rows = [*draw(st.lists(row, min_size=1, max_size=8))]
    rows = [[r[0] or "1", *r[1:]] if header[0] == "output_tokens" else r for r in rows]
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    odd = draw(st.sampled_from(["none", "cell", "wider", "narrower", "blank", "cr", "header"]))
    k, j = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(header) - 1))
    if odd == "cell":
        rows[k][j] = draw(st.sampled_from(ODD_CELLS))
    elif odd in ("wider", "narrower"):
        rows[k] = rows[k] + ["5"] if odd == "wider" else rows[k][:-1]
    elif odd == "blank":
        rows.insert(k, [])
    elif odd == "header":
        header = [*header[:j], *header[j + 1 :], draw(st.sampled_from(["x", header[-1]]))]
    lines = [",".join(header), *(",".join(r) for r in rows)]
    text = ending.join(lines) + draw(st.sampled_from(["", ending]))
    return (text.replace("\n", "\r", 1) if odd == "cr" else text).encode()


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(near_plain_traces())
def test_plain_reader_accepts_only_what_the_row_reader_reads_the_same(tmp_path, content):
    path = tmp_path / "trace.csv"
    path.write_bytes(content)
    expected = rows_reader(path, 7)
    fast = plain_trace(path, 7)
    if fast is not None:  # the fast reader never accepts a file the row reader refuses
        assert fast == expected
    got = read_trace_columns(path, 7) if isinstance(expected, Workload) else None
    assert got == (expected if isinstance(expected, Workload) else None)
