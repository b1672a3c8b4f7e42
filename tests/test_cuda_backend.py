"""The CUDA logic, on a CPU: benchbatch's CUDA backend driven by a fake torch.cuda
(tests/fake_cuda.py) that keeps torch's semantics and records which device and stream each
call used. The model runs on the CPU; timing, graphs and memory go through the fake GPU 1
of a two-GPU machine whose current device is 0, which is what `--device cuda:1` meets."""

from __future__ import annotations

import time
import weakref

import pytest
import torch
from fake_cuda import FakeCuda

from benchbatch.core.config import preset
from benchbatch.experiments.piggyback import probe as pb
from benchbatch.experiments.piggyback.options import PiggybackOptions
from benchbatch.runtime import backend, ceilings, device, steps
from benchbatch.runtime.cuda import CudaBackend
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import QUEUED_CALLS, TimingOptions, measure

CPU, GPU1 = torch.device("cpu"), torch.device("cuda", 1)
WARM, REPEATS = 2, 3
CALLS = WARM + REPEATS + QUEUED_CALLS  # warm-up, repeats, the queued launch-bound probe
FEW = TimingOptions(min_repeats=REPEATS, min_time_s=0.0, warmup=WARM, warmup_s=0.0)


OP_MS = 1e-4  # each aten op the model runs is a 0.1 us kernel on GPU 1


@pytest.fixture
def fake():
    api = FakeCuda(devices=2)
    with backend.use(CudaBackend(GPU1, api=api, alloc_device=CPU, min_flush_bytes=1 << 16)):
        with api.kernels_on(1, OP_MS):
            yield api


@pytest.fixture(scope="module")
def model():
    return Transformer(preset("tiny"), seed=1)


def kernel(api: FakeCuda, ms: float, on: int = 1):
    return lambda: api.launch(ms, on)


def keep_caches(model, monkeypatch) -> list:
    """Every KV cache the model makes from now on."""
    made, real = [], model.new_cache
    monkeypatch.setattr(model, "new_cache", lambda *a: made.append(real(*a)) or made[-1])
    return made


# --- events, streams and synchronize on the right device --------------------------------------


def test_cuda1_is_timed_on_its_own_stream_and_synchronized(fake):
    opts = TimingOptions(min_repeats=3, min_time_s=0.011, warmup=2, warmup_s=0.0)
    m = measure(kernel(fake, 2.0), GPU1, opts)
    assert m.times_ms == pytest.approx([2.0] * 6)  # 11 ms of 2 ms calls
    records = fake.called("record")
    assert len(records) == 2 * (2 + 6 + 1)  # a pair per warm-up call, repeat, queued probe
    assert set(records) == {("record", 1, "default1")}
    assert set(fake.called("synchronize")) == {("synchronize", 1, None)}
    assert ("device", 1, None) in fake.calls and fake.current_device() == 0  # restored after


def test_events_and_synchronize_name_the_device_even_when_another_is_current(fake):
    timer = backend.of(GPU1).timer()
    timer.time(kernel(fake, 1.5))
    assert fake.current_device() == 0 and timer.read()[0] == [1.5]
    assert set(fake.called("record")) == {("record", 1, "default1")}
    assert fake.called("synchronize") == [("synchronize", 1, None)]


def test_the_fake_catches_events_on_the_current_device():
    """What the backend used to do: Event.record() on the current device (0) while the work
    runs on device 1, and a synchronize() of device 0: the fake reads 0 ms, or refuses."""
    api = FakeCuda(devices=2)
    start, end = api.Event(enable_timing=True), api.Event(enable_timing=True)
    start.record()
    api.launch(2.0, 1)
    end.record()
    with pytest.raises(RuntimeError, match="not ready"):
        start.elapsed_time(end)
    api.synchronize()
    assert start.elapsed_time(end) == 0.0


def test_resolving_cuda1_makes_it_the_current_device(fake, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device.resolve_device("cuda:1") == GPU1
    assert fake.called("set_device") == [("set_device", 1, None)]


def test_memory_info_and_release_go_to_the_device(fake):
    assert device.free_memory_bytes(GPU1) == fake.free_bytes
    device.release_memory(GPU1)
    assert fake.called("mem_get_info") == [("mem_get_info", 1, None)]
    assert fake.called("empty_cache") == [("empty_cache", 1, None)]


# --- repeats sized from device time; host time beside it -----------------------------------------


@pytest.mark.parametrize(("call_ms", "repeats"), [(0.5, 42), (2.0, 11), (8.0, 4), (0.0, 50)])
def test_the_repeat_count_follows_device_time(fake, call_ms, repeats):
    """min_time 21 ms: 42 calls of 0.5 ms, 11 of 2 ms, min_repeats (4) of 8 ms; a call the
    device does not time at all gets max_repeats. The host's clock has no say: it spends
    microseconds enqueueing each call."""
    opts = TimingOptions(min_repeats=4, min_time_s=0.021, warmup=3, warmup_s=0.0, max_repeats=50)
    calls = []
    m = measure(lambda: (calls.append(1), fake.launch(call_ms, 1)), GPU1, opts)
    assert m.repeats == repeats and len(calls) == repeats + 3 + QUEUED_CALLS
    assert m.median_ms == pytest.approx(call_ms)


def test_host_enqueue_time_and_launch_bound(fake):
    opts = TimingOptions(min_repeats=3, min_time_s=0.0, warmup=3, warmup_s=0.0)
    busy = measure(kernel(fake, 50.0), GPU1, opts)  # a 50 ms kernel, enqueued in microseconds
    assert busy.host_ms < busy.median_ms and not busy.launch_bound
    launches = measure(lambda: (time.sleep(0.002), fake.launch(0.1, 1)), GPU1, opts)
    assert launches.host_ms >= 2.0 and launches.launch_bound  # the GPU waits for the host
    row = launches.summary()
    assert row["launch_bound"] is True and row["host_ms"] == launches.host_ms


@pytest.mark.parametrize(
    ("host_ms", "kernel_ms", "bound"),
    [
        (0.3, 0.1, True),
        (0.3, 0.28, True),
        (0.3, 0.36, False),
        (0.3, 0.5, False),
        (0.01, 2.0, False),
    ],
)
def test_launch_bound_means_the_device_waited_for_the_host(host_ms, kernel_ms, bound):
    """The fake host spends host_ms per call and its device idles until each launch. A
    starved device's repeats take the host's time plus a few microseconds each, so "host
    time >= device time" said not launch-bound; queued back to back, a starved device's
    calls take the host's time each, and a busy device's their own."""
    api = FakeCuda(devices=2)
    b = CudaBackend(GPU1, api=api, alloc_device=CPU, min_flush_bytes=1 << 16,
                    host_clock=api.host_clock)  # fmt: skip
    api.record_ms = 0.002  # 2 us of host time per event recorded
    with backend.use(b):
        m = measure(lambda: (api.host_work(host_ms), api.launch(kernel_ms, 1)), GPU1, FEW)
    assert m.host_ms == pytest.approx(host_ms)
    # A repeat takes the slower of the two, and a starved one the records' 4 us on top:
    # so one call's host time never reaches its device time, starved or not.
    assert m.median_ms == pytest.approx(max(host_ms, kernel_ms), abs=0.005)
    assert m.host_ms < m.median_ms
    per_call = max(host_ms, kernel_ms) + min(host_ms, kernel_ms) / QUEUED_CALLS
    assert m.queued_ms == pytest.approx(per_call, abs=0.005)
    assert m.launch_bound is bound and m.summary()["launch_bound"] is bound


# --- graphs: on the device, per shape, replayed in place -----------------------------------------


def test_capture_uses_the_warm_up_stream_of_the_device(fake, model):
    steps.time_step(model, steps.decode(2, 8), FEW)
    [capture] = fake.called("capture")
    warm_up = [c for c in fake.calls if c[0] == "stream"]
    assert capture == ("capture", 1, warm_up[0][2]) and warm_up[0][1] == 1
    assert all(c[1] == 1 for c in fake.called("synchronize") + fake.called("Stream"))


def test_prefill_is_captured_like_decode_unless_graphs_are_off(fake, model):
    steps.time_step(model, steps.prefill(1, 16), FEW)
    assert len(fake.captures) == 1
    steps.time_step(model, steps.prefill(1, 16), FEW, cuda_graphs=False)
    assert len(fake.captures) == 1 and len(fake.called("replay")) == CALLS


def test_a_graph_is_captured_per_shape_and_never_reused(fake, model):
    plan = [
        steps.prefill(1, 8),
        steps.prefill(1, 16),
        steps.decode(1, 8),
        steps.decode(2, 8),
        steps.decode(2, 16),
    ]
    rows = [steps.run_step(model, "fp32", step, FEW) for step in plan]
    assert [r["status"] for r in rows] == ["ok"] * 5 and len(fake.captures) == 5
    # Each replay belongs to the graph captured last before it: no shape reuses a graph.
    captured = 0
    for call, _, name in fake.calls:
        if call == "capture":
            captured += 1
        elif call == "replay":
            assert name == f"graph{captured}"
    assert len(fake.called("replay")) == 5 * CALLS  # warm-up and repeats, per step


def test_replays_do_not_advance_the_kv_cache(fake, model, monkeypatch):
    made = keep_caches(model, monkeypatch)
    steps.time_step(model, steps.decode(3, 10), FEW)
    steps.time_step(model, steps.prefill(2, 12), FEW)
    assert len(fake.called("replay")) == 2 * CALLS
    assert made[0].lengths.tolist() == [11] * 3 and made[1].lengths.tolist() == [12] * 2


def test_the_fake_replays_what_was_captured(fake, model):
    """The fake is a faithful graph: a call that does not reset the cache's lengths is seen
    advancing them on every replay, and a replay gives the eager logits."""
    cache = model.new_cache(2, 16)
    tokens = torch.randint(0, model.cfg.vocab, (2, 1))
    out = {}

    @torch.inference_mode()
    def step():
        out["logits"] = model.step(tokens, cache, slice(0, 2), kv_len=6)

    with torch.inference_mode():
        cache.lengths.fill_(5)
    eager = model.step(tokens, cache, slice(0, 2), kv_len=6).clone()
    with torch.inference_mode():
        cache.lengths.fill_(5)
    replay = backend.of(CPU).capture(step)  # 3 warm-up calls and the capture: 4 steps
    assert cache.lengths.tolist() == [9, 9]
    with torch.inference_mode():
        cache.lengths.fill_(5)
        out["logits"].zero_()
    replay()
    assert cache.lengths.tolist() == [6, 6]
    torch.testing.assert_close(out["logits"], eager)


def test_a_captured_call_may_not_read_device_values(fake, model):
    cache = model.new_cache(1, 8)

    @torch.inference_mode()
    def step():  # no kv_len: the step reads the cache's lengths on the host
        cache.lengths.zero_()
        model.step(torch.zeros(1, 4, dtype=torch.long), cache, slice(0, 1))

    with pytest.raises(RuntimeError, match="capturing"):
        backend.of(CPU).capture(step)


def piggyback_options(**changes) -> PiggybackOptions:
    """decode b=2 at context 8 with 0 or 4 prefill tokens, 4 alone; a 32-token prompt in
    chunks of 8 and whole; tiles of 8 and 9 tokens: 8 timed steps."""
    base = dict(decode_batch=(2,), context=(8,), piggyback_tokens=(4,), chunk_prompt=32,
                chunks=(8,), tiles=(8, 9))  # fmt: skip
    return PiggybackOptions(**(base | changes))


def test_piggyback_times_every_step_from_a_graph(fake, model):
    raw = list(pb.rows(model, piggyback_options(), FEW))
    assert [r["part"] for r in raw] == ["piggyback"] * 3 + ["chunked"] * 2 + ["tile"] * 2
    assert len(fake.captures) == 7
    assert [r["chunks"] for r in pb.chunk_rows(raw, model.cfg, "fp32")] == [4, 1]
    four, one = fake.captures[3:5]
    assert four.ops > 3 * one.ops  # the whole loop of four chunks is one graph
    list(pb.rows(model, piggyback_options(), FEW, cuda_graphs=False))
    assert len(fake.captures) == 7


def test_piggyback_rows_carry_host_time_and_launch_bound(fake, model):
    raw = list(pb.rows(model, piggyback_options(chunks=(32,), tiles=(8,)), FEW))
    for r in pb.piggyback_rows(raw) + pb.tile_rows(raw):
        # A fake replay runs its ops on the host, microseconds each, against 0.1 us of
        # device time each: launch-bound.
        assert r["host_ms"] > 0 and r["launch_bound"] is True


# --- memory: out-of-memory rows, the flush buffer -----------------------------------------------


def test_an_out_of_memory_row_frees_its_tensors_and_the_next_row_runs(fake, model, monkeypatch):
    made = keep_caches(model, monkeypatch)
    fake.fail_captures = {1}
    row = steps.run_step(model, "fp32", steps.decode(4, 16), FEW)
    assert row["status"] == "oom" and row["repeats"] == 0 and row["launch_bound"] is False
    freed = weakref.ref(made.pop().k)
    assert freed() is None
    assert ("empty_cache", 1, None) in fake.calls
    row = steps.run_step(model, "fp32", steps.decode(2, 16), FEW)
    assert row["status"] == "ok" and row["repeats"] == REPEATS


def test_the_flush_buffer_comes_first_and_only_once(fake, model, monkeypatch):
    b = backend.of(GPU1)
    flushed_first, real = [], model.new_cache
    monkeypatch.setattr(
        model, "new_cache", lambda *a: flushed_first.append(b.flush_bytes is not None) or real(*a)
    )
    steps.run_step(model, "fp32", steps.decode(2, 8), FEW)
    flush = b.flusher()
    pb.time_mixed(model, pb.MixedStep(2, 8, 4), FEW)
    assert flushed_first == [True, True] and b.flusher() is flush
    assert b.flush_bytes == 2 * fake.l2_bytes  # twice L2, over the 64 KiB minimum here


def test_a_flush_buffer_that_does_not_fit_is_not_an_out_of_memory_row(model):
    """The buffer would be 4 EiB: the step is measured without a flush, not recorded OOM."""
    api = FakeCuda()
    b = CudaBackend(GPU1, api=api, alloc_device=CPU, min_flush_bytes=1 << 62)
    with backend.use(b), api.kernels_on(1, OP_MS):
        row = steps.run_step(model, "fp32", steps.decode(2, 8), FEW, cuda_graphs=False)
        probe = next(ceilings.run([ceilings.Probe("matmul", 16)], CPU, "fp32", FEW))
    assert row["status"] == "ok" and probe["status"] == "ok"
    assert b.flush_bytes is None and "L2-flush buffer" in b.flush_error


def test_an_error_raised_while_handling_an_oom_is_an_oom():
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        except torch.cuda.OutOfMemoryError:
            raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904
    except RuntimeError as e:
        assert device.is_out_of_memory(e)
    assert not device.is_out_of_memory(RuntimeError("shape mismatch"))


# --- graph inputs: a graph owns only its pool; the replay owns the rest -------------------------


def test_the_fake_graph_does_not_own_the_captured_calls_tensors(fake):
    """As a real CUDAGraph: tensors made outside the capture are not kept alive by the
    graph, and replaying after they died is an illegal access, not a quiet success."""
    x = torch.ones(4)
    graph = fake.CUDAGraph()
    with fake.graph(graph):
        x.mul_(2)
    graph.replay()
    assert x.tolist() == [4.0] * 4  # the capture ran it once, the replay once more
    del x
    with pytest.raises(RuntimeError, match="illegal memory access"):
        graph.replay()


def test_the_fake_allocator_hands_freed_blocks_out_and_empty_cache_returns_them(fake):
    x = torch.empty(1000)  # 4000 bytes, allocated inside kernels_on
    assert fake.allocated == 4000 and fake.reserved == 4000
    del x
    assert fake.allocated == 0 and fake.reserved == 4000 and fake.cached == [4000]
    y = torch.empty(500)  # fits the freed block: no new memory
    assert fake.reused == 1 and fake.reserved == 4000 and fake.allocated == 4000
    del y
    fake.empty_cache()
    assert fake.reserved == 0 and fake.cached == []


def test_a_replay_owns_its_inputs_until_released(fake):
    def prepared():  # as steps.prepare leaves it: the call's closure is the only owner
        x = torch.ones(4)
        return backend.of(CPU).capture(lambda: x.mul_(2)), weakref.ref(x)

    replay, kept = prepared()
    replay()
    assert kept() is not None and kept().tolist() == [32.0] * 4  # 3 warm-ups, capture, replay
    replay.release()
    assert kept() is None
    with pytest.raises(RuntimeError, match="released"):
        replay()


def test_a_group_frees_its_caches_when_done(fake, model, monkeypatch):
    made = keep_caches(model, monkeypatch)
    group = [steps.decode(1, 8), steps.decode(4, 8), steps.prefill(1, 8)]
    rows = steps.run_group(model, "fp32", group, FEW)
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert len(fake.called("replay")) == 3 * CALLS
    freed = [weakref.ref(c.k) for c in made]
    made.clear()
    assert [f() for f in freed] == [None] * 3


GROUPED = ["--preset", "tiny", "--device", "cpu", "--repeats", "2", "--min-time", "0"]
GROUPED_COMMANDS = {
    "phases": ["phases", *GROUPED, "--no-roofline", "--prefill", "8,16"]
    + ["--decode-batch", "1,4", "--context", "8"],
    "sweep": ["sweep", *GROUPED, "--no-roofline", "--batch", "1,2,4", "--context", "8"],
}


@pytest.mark.parametrize("command", list(GROUPED_COMMANDS))
def test_grouped_commands_replay_graphs_whose_inputs_are_alive(fake, tmp_path, command):
    """The whole plan is one timing group on the fake (3 GiB free): every step is prepared
    (its cache allocated, its graph captured, empty_cache called) before the first replay,
    so a replay that did not own its inputs would raise here."""
    import pandas as pd
    from typer.testing import CliRunner

    from benchbatch.app.cli import app
    from benchbatch.experiments import common

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "estimate_run", lambda *a, **k: None)  # its eager steps: not timed
        out = tmp_path / "run"
        result = CliRunner().invoke(app, [*GROUPED_COMMANDS[command], "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exc_info)
    df = pd.read_csv(out / f"{command}.csv")
    assert (df["status"] == "ok").all() and df["timing_group"].nunique() == 1
    assert len(fake.captures) == len(df) >= 3
    assert len(fake.called("empty_cache")) >= len(df)  # each capture's, then the group's
    assert fake.reused > 0  # freed blocks were handed out again, as a GPU's allocator does


def test_a_cuda_backend_keeps_attention_off_cudnn(monkeypatch):
    """cuDNN's attention rebuilds its graph for each new shape (the engine's steps on the
    first H200 run): a CUDA backend turns it off for the process, and the selector's choice
    for the rows follows."""
    from benchbatch.runtime.cuda import CudaBackend

    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        CudaBackend(torch.device("cuda", 0), FakeCuda(devices=1), torch.device("cpu"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert (
            torch.backends.cuda.flash_sdp_enabled()
            and torch.backends.cuda.mem_efficient_sdp_enabled()
        )
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
