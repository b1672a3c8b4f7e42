"""--compile: the compiled step's logits, the fallback to eager, the option on the CLI."""

import json

import pandas as pd
import pytest
import torch

from benchbatch.app.cli import app
from benchbatch.core.config import preset
from benchbatch.runtime import compiled, steps
from benchbatch.runtime.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")


def decode_logits(model, tokens, kv_lens=(9, 10)):
    """A prefill of all but the last token, then decode steps at the given KV lengths."""
    cache = model.new_cache(tokens.shape[0], 32)
    slots, out = slice(0, tokens.shape[0]), []
    with torch.inference_mode():
        out.append(model.step(tokens[:, : kv_lens[0] - 1], cache, slots))
        for kv in kv_lens:
            out.append(model.step(tokens[:, kv - 1 : kv], cache, slots, kv_len=kv))
    return torch.cat(out, dim=1)


def tokens_for(cfg, batch=2, length=12):
    return torch.randint(0, cfg.vocab, (batch, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.slow  # inductor builds C++ kernels: tens of seconds on a 2-core CPU
def test_compiled_step_gives_the_eager_logits():
    cfg = preset("tiny")
    eager, model = Transformer(cfg, seed=2), Transformer(cfg, seed=2)
    state = compiled.compile_model(model)
    tokens = tokens_for(cfg)
    want = decode_logits(eager, tokens)
    got = decode_logits(model, tokens)  # prefill, then two KV lengths: a recompile
    if not state.applied:
        pytest.fail(f"inductor could not compile here: {state.fallback}")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert state.graphs >= 2 and state.compile_s > 0


def test_torch_compile_raising_falls_back_to_eager_and_says_so(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler\nmore detail")

    monkeypatch.setattr(torch, "compile", broken)
    cfg = preset("tiny")
    eager, model = Transformer(cfg, seed=2), Transformer(cfg, seed=2)
    said = []
    state = compiled.compile_model(model, on_fallback=said.append)
    assert not state.applied and state.fallback == "RuntimeError: no C++ compiler"
    assert said == ["--compile: torch.compile failed (RuntimeError: no C++ compiler); "
                    "running eager instead"]  # fmt: skip
    assert state.info["applied"] == "eager (fallback)"
    tokens = tokens_for(cfg)
    assert torch.equal(decode_logits(model, tokens), decode_logits(eager, tokens))


def test_a_first_call_failing_in_the_compiler_falls_back(monkeypatch):
    def compiles_to_failure(fn, **kwargs):
        def call(*args, **kw):
            raise OSError("inductor: cannot build the kernel")

        return call

    monkeypatch.setattr(torch, "compile", compiles_to_failure)
    cfg = preset("tiny")
    eager, model = Transformer(cfg, seed=2), Transformer(cfg, seed=2)
    said = []
    state = compiled.compile_model(model, on_fallback=said.append)
    assert state.applied  # not yet known: compilation happens at the first call
    tokens = tokens_for(cfg)
    assert torch.equal(decode_logits(model, tokens), decode_logits(eager, tokens))
    assert not state.applied and len(said) == 1 and "OSError" in said[0]


def test_compile_seconds_are_a_column_apart_from_the_step(monkeypatch, quick_timing):
    calls = []
    # The compiler's time on compiled.py's own clock, 1,000 s a graph: no sleep, and a bound
    # that a loaded machine's step (timed on the real clock) can never reach.
    import time

    clock = {"offset": 0.0}
    fake_time = type("Clock", (), {"perf_counter": staticmethod(
        lambda: time.perf_counter() + clock["offset"])})  # fmt: skip
    monkeypatch.setattr(compiled, "time", fake_time)

    def counting(fn, **kwargs):  # a "compiler" that takes 1,000 s and makes one graph a shape
        from torch._dynamo.utils import counters

        def call(*args, **kw):
            key = (args[0].shape[0], len(args[1]))
            if key not in calls:
                calls.append(key)
                counters["stats"]["unique_graphs"] += 1
                clock["offset"] += 1000.0
            return fn(*args, **kw)

        return call

    monkeypatch.setattr(torch, "compile", counting)
    model = Transformer(preset("tiny"), seed=2)
    compiled.compile_model(model)
    row = steps.run_step(model, "fp32", steps.decode(2, 8), quick_timing)
    assert row["compile_s"] >= 1000 and row["step_ms"] < 1000 * 1e3
    again = steps.run_step(model, "fp32", steps.decode(2, 8), quick_timing)
    assert again["compile_s"] == 0.0  # the same shape: nothing compiled
    eager = steps.run_step(Transformer(preset("tiny")), "fp32", steps.decode(2, 8), quick_timing)
    assert "compile_s" not in eager


def test_mode_is_inductors_default_on_a_cpu_and_cuda_graphs_on_cuda():
    assert compiled.mode_for(torch.device("cpu"), own_graphs=False) == "default"
    assert compiled.mode_for(torch.device("cuda"), own_graphs=False) == "reduce-overhead"
    assert compiled.mode_for(torch.device("cuda"), own_graphs=True) == "default"


FAST = ["--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device", "cpu", "--no-roofline"]


def test_phases_accepts_compile_and_records_the_fallback(runner, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("compiler missing")

    monkeypatch.setattr(torch, "compile", broken)
    out = tmp_path / "run"
    result = runner.invoke(app, ["phases", *FAST, "--prefill", "16", "--decode-batch", "1",
                                 "--context", "24", "--compile", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.count("running eager instead") == 1
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["options"]["compile"] is True
    assert meta["compile"]["applied"] == "eager (fallback)"
    assert meta["compile"]["fallback"] == "RuntimeError: compiler missing"
    assert meta["weight_layout"] in {"rows, fused", "rows, split", "columns, fused",
                                     "columns, split"}  # fmt: skip
    assert "compile_s" in pd.read_csv(out / "phases.csv").columns


@pytest.mark.parametrize("command", ["phases", "sweep", "occupancy", "ablation", "reproduce"])
def test_compile_is_an_option_of_the_model_commands(runner, command):
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0 and "--compile" in result.output


QUICK = dict(min_repeats=2, min_time_s=0.0, warmup=1, warmup_s=0.0, l2_flush=False)


def test_inductor_skipping_its_cuda_graphs_is_recorded_as_what_ran(monkeypatch):
    """reduce-overhead with a step that writes its KV cache: inductor compiles the kernels
    but skips its CUDA graphs, through its own counter and logger (called here exactly as
    inductor calls them). The state and the rows say so, not just "reduce-overhead"."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from benchbatch.runtime.timing import TimingOptions

    shapes = []

    def inductor(fn, **kwargs):  # one graph per shape, each without its CUDA graphs
        def call(*args, **kw):
            if args[0].shape not in shapes:
                shapes.append(args[0].shape)
                counters["stats"]["unique_graphs"] += 1
                log_cudagraph_skip_and_bump_counter(
                    "skipping cudagraphs due to mutated inputs (2 instances)"
                )
            return fn(*args, **kw)

        return call

    monkeypatch.setattr(torch, "compile", inductor)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # "traced" calls
    monkeypatch.setattr(compiled, "mode_for", lambda device, own: "reduce-overhead")
    model = Transformer(preset("tiny"), seed=2)
    state = compiled.compile_model(model)
    opts = TimingOptions(**QUICK)
    rows = [steps.run_step(model, "fp32", steps.decode(b, 8), opts) for b in (2, 4, 2)]
    assert state.cudagraph_skips == 2 and state.eager_calls == 0
    assert state.info["cudagraph_skip_reasons"] == [
        "skipping cudagraphs due to mutated inputs (2 instances)"
    ]
    assert "without CUDA graphs" in state.info["ran"] and state.info["mode"] == "reduce-overhead"
    assert [r["recompiles"] for r in rows] == [0, 1, 0]  # the first graph is no recompile
    assert all("without CUDA graphs" in r["compiled_ran"] and not r["eager"] for r in rows)


def test_calls_past_dynamos_recompile_limit_are_recorded_as_eager(monkeypatch):
    """Real dynamo (its eager backend: no C++ build) with a recompile limit of 1: the second
    batch size would need a recompile, so dynamo runs it as plain Python, with no error.
    That row says eager; the first shape, run again, is compiled."""
    import torch._dynamo

    from benchbatch.runtime.timing import TimingOptions

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: real(fn, backend="eager"))
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=1):
            model = Transformer(preset("tiny"), seed=2)
            state = compiled.compile_model(model)
            opts = TimingOptions(**QUICK)
            rows = [steps.run_step(model, "fp32", steps.decode(b, 8), opts) for b in (2, 4, 2)]
            assert state.info["recompile_limit"] == 1
    finally:
        torch._dynamo.reset()
    assert [r["eager"] for r in rows] == [False, True, False]
    assert rows[1]["compiled_ran"] == "eager (past dynamo's recompile limit)"
    assert rows[0]["compile_s"] > 0 and rows[1]["compile_s"] == 0.0
    assert state.graphs == 1 and state.eager_calls == state.info["eager_calls"] >= 2


def test_engine_runs_record_their_compile_seconds(runner, tmp_path, monkeypatch):
    """The real engine with --compile: each step row has its compile columns, and each
    policy's engine.csv row the run's total compile seconds (inside its wall time)."""
    shapes = []

    def counting(fn, **kwargs):  # a "compiler" making one graph per new input shape
        from torch._dynamo.utils import counters

        def call(*args, **kw):
            if args[0].shape not in shapes:
                shapes.append(args[0].shape)
                counters["stats"]["unique_graphs"] += 1
            return fn(*args, **kw)

        return call

    monkeypatch.setattr(torch, "compile", counting)
    out = tmp_path / "run"
    args = ["occupancy", "--engine", "real", "--preset", "tiny", "--device", "cpu", "--compile"]
    args += ["--requests", "8", "--slots", "2", "--median", "4", "--max-output", "8"]
    result = runner.invoke(app, [*args, "--prompt-len", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    engine = pd.read_csv(out / "engine.csv").set_index("policy")
    per_step = pd.read_csv(out / "engine_steps.csv").groupby("policy")["compile_s"].sum()
    assert (engine["compile_s"] > 0).all()
    assert ((engine["compile_s"] - per_step.reindex(engine.index)).abs() < 1e-5).all()
    assert "recompiles" in pd.read_csv(out / "engine_steps.csv").columns
