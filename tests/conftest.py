"""Shared fixtures: CLI runner, one torch thread for tiny models, tiny models and workloads,
quick timing; GPU tests skip themselves without CUDA."""

import os
import signal

import matplotlib.font_manager  # noqa: F401
import pytest
import torch
from hypothesis import settings

# pytest-xdist's workers start with COLUMNS and LINES set (80 and 24 without a terminal), and
# rich's consoles, made when benchbatch is first imported, would keep that width for good: a
# test that gives a command its width (CliRunner's env={"COLUMNS": ...}) would not get it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# No test may depend on timing: hypothesis' per-example deadline (200 ms by default) fails a
# property when a loaded machine runs one example slowly, so it is off for every property.
# The profile in force is kept otherwise (under CI=true hypothesis' own "ci" profile:
# derandomized, so every CI run tries the same examples).
settings.register_profile("benchbatch", settings.default, deadline=None)
settings.load_profile("benchbatch")

torch.set_num_threads(min(2, torch.get_num_threads()))
# Imported above for its side effect: matplotlib builds its font cache on its first run on a
# machine and, when that takes over 5 s (a loaded machine), says so on stderr. Built here, it
# happens before any test reads what a command printed.


def pytest_configure(config):
    """The suite runs as it does in the foreground, however it was started: a shell that
    starts pytest with `&` (no job control) leaves SIGINT ignored, so a Ctrl-C test in this
    process saw nothing and every program a test starts inherited the ignored signal (exec
    keeps SIG_IGN). Python's own handler instead: the programs then start with SIGINT at its
    default, as from a terminal (the signal tests' programs also reset SIGINT and SIGHUP
    before exec: tests/test_hostile_round3_streams.py, terminal_signals)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: a tiny model's ops take microseconds, and with two threads each
    op waits for the second whenever another process holds a core (2-core machines)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model():
    """The tiny preset (hidden 64, 2 layers, GQA) with seeded random weights, fp32 on CPU."""
    from benchbatch.core.config import preset
    from benchbatch.runtime.model import Transformer

    return Transformer(preset("tiny"), seed=1)


@pytest.fixture
def quick_timing():
    """Two repeats, no time floor, one warm-up: enough to exercise the harness."""
    from benchbatch.runtime.timing import TimingOptions

    return TimingOptions(min_repeats=2, min_time_s=0.0, warmup=1, warmup_s=0.0)


@pytest.fixture
def tiny_workload():
    """Twelve requests with short prompts and outputs, all queued at step 0."""
    from benchbatch.core.options import WorkloadOptions

    return WorkloadOptions(requests=12, median=6, max_output=12, prompt_len=8).draw(seed=1)


def pytest_collection_modifyitems(config, items):
    """GPU tests skip themselves on machines without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def linear_step_costs(monkeypatch):
    """The cost model's steps (runtime/mixed.py) 'timed' at a fixed linear cost. Timed for
    real, a busy machine can make every per-token cost come out negative and the fit refuse
    the run (a test that failed one run in several under load); the fit is tested on its own."""
    from benchbatch.runtime import mixed
    from benchbatch.runtime.timing import Measurement

    def linear(model, step, opts, cuda_graphs=False, seed=0):
        decode, prefill, context = step.features
        return Measurement([1.0 + 0.05 * decode + 0.01 * prefill + 0.0005 * context])

    monkeypatch.setattr(mixed, "time_mixed", linear)


@pytest.fixture(autouse=True, scope="session")
def no_user_cache(tmp_path_factory):
    """The user's cache of the latest probe (ceilings_cache.py) is never read or written by
    a test, module-scoped fixtures included."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCHBATCH_CACHE_DIR", str(tmp_path_factory.mktemp("session-cache")))
        yield


@pytest.fixture(autouse=True, scope="session")
def short_wake_waits():
    """A serving run's calibration waits idle before its wake runs (up to a second each,
    runtime/calibrate.py's WAKE_IDLES_S); in-process tests wait milliseconds instead: what
    they check is not the wake's size (tests/test_wake.py checks its fit and pricing). On a
    loaded machine a short wait can pass before the engine looks (no wait recorded), so
    tests ask only that some wake steps were fitted."""
    from benchbatch.runtime import calibrate

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrate, "WAKE_IDLES_S", (0.0, 0.005, 0.01, 0.02, 0.04))
        yield


@pytest.fixture(autouse=True)
def own_ceilings_cache(tmp_path_factory, monkeypatch):
    """Each test its own cache of the latest probe: a test measures or reuses ceilings only
    as it says, never a probe another test left."""
    monkeypatch.setenv("BENCHBATCH_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def steady_probe(monkeypatch):
    """Every probe row as a steady probe's (two repeats, a CV of 2%): kept in the cache
    whatever this machine's timing does (a probe timed once, or a noisy one, is not)."""
    from benchbatch.runtime import ceilings as probes

    real_row = probes.probe_row

    def steady(probe, dtype, m, status="ok"):
        return {**real_row(probe, dtype, m, status), "cv": 0.02, "noisy": False, "repeats": 2}

    monkeypatch.setattr(probes, "probe_row", steady)
