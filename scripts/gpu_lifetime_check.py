"""The GPU checks of scripts/gpu_check.sh that are not a benchbatch command.

    python3 scripts/gpu_lifetime_check.py preflight        every dependency imports, CUDA is there
    python3 scripts/gpu_lifetime_check.py lifetime OUTDIR  graphs own their inputs; kernels; OOM
    python3 scripts/gpu_lifetime_check.py ranges RUNDIR    reproduce's numbers against an H200's
    python3 scripts/gpu_lifetime_check.py attention        a new shape's cost on each SDPA backend

`--dry` runs lifetime and attention on the CPU through the fake CUDA of the tests
(tests/fake_cuda.py) and the tiny model: the same logic, so a machine without a GPU can
tell the script works.
Each check prints one line: "ok", or "FAILED" and why; the exit status is the count failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Runtime dependencies (pyproject's), then the test ones, by import name.
DEPENDENCIES = ("torch", "typer", "rich", "pandas", "matplotlib", "pynvml", "safetensors")
TEST_DEPENDENCIES = ("pytest", "hypothesis", "transformers", "tokenizers")
STRESS_BYTES = 4 << 30  # memory filled between capture and replay (the freed blocks reused)
# What an H200 SXM gives (the article model, fp16), to say at once what is off.
EXPECTED = {
    "decode b=1 with graphs (ms)": (0.33, 0.5),
    "probe matmul (TFLOP/s)": (600.0, 800.0),
    "probe copy (TB/s)": (3.8, 4.3),
}


def say(name: str, ok: bool, detail: str) -> bool:
    print(f"{name:<24} {'ok' if ok else 'FAILED'}: {detail}", flush=True)
    return ok


def preflight(dry: bool = False) -> int:
    """Import every dependency; stop at the first missing one with one line."""
    for name in DEPENDENCIES + TEST_DEPENDENCIES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure to import is the one line
            print(f"preflight FAILED: cannot import {name} ({type(e).__name__}: {e})")
            return 1
    import torch

    if not dry and not torch.cuda.is_available():
        print(f"preflight FAILED: torch {torch.__version__} sees no CUDA device")
        return 1
    print(
        f"preflight ok: {len(DEPENDENCIES + TEST_DEPENDENCIES)} imports, torch {torch.__version__}"
    )
    return 0


# --- the machine: a real GPU, or the tests' fake one ------------------------------------------


@contextlib.contextmanager
def machine(dry: bool):
    """(api, device, model preset, dtype): torch.cuda and the article model in fp16 on a
    GPU; dry: the fake CUDA of the tests and the tiny model in fp32 on the CPU."""
    import torch

    from benchbatch.runtime import backend

    if not dry:
        yield torch.cuda, torch.device("cuda", 0), "article", torch.float16
        return
    sys.path.insert(0, str(REPO / "tests"))
    from fake_cuda import FakeCuda

    from benchbatch.runtime.cuda import CudaBackend

    api = FakeCuda(devices=1)
    cpu = torch.device("cpu")
    with backend.use(CudaBackend(torch.device("cuda", 0), api, cpu, min_flush_bytes=1 << 16)):
        with api.kernels_on(0, 1e-4):
            yield api, cpu, "tiny", torch.float32


def decode_replay(model, batch: int, context: int):
    """A decode step's graph as steps.prepare makes it: the cache owned by the call alone.
    Returns (replay, eager logits, where each replay leaves its logits)."""
    import torch

    from benchbatch.runtime import backend

    dev = model.embed.weight.device
    cache = model.new_cache(batch, context + 1)
    cache.k.normal_()
    cache.v.normal_()
    tokens = torch.randint(0, model.cfg.vocab, (batch, 1), device=dev)
    out: dict = {}

    @torch.inference_mode()
    def run():
        cache.lengths.fill_(context)
        out["logits"] = model.step(tokens, cache, slice(0, batch), kv_len=context + 1, dense=True)

    run()
    eager = out["logits"].clone()
    return backend.of(dev).capture(run), eager, out


def lifetime(api, dev, name: str, dtype, out: Path) -> int:
    """Prepare decode b=1 and b=32 at context 512, check the allocator still holds their
    KV caches, empty the cache, fill STRESS_BYTES of new memory, replay both graphs: each
    must give its eager logits (freed inputs would be overwritten, or fault)."""
    import torch

    from benchbatch.core import accounting
    from benchbatch.core.config import preset
    from benchbatch.runtime.model import Transformer

    cfg = preset(name)
    model = Transformer(cfg, dev, dtype)
    failed = 0
    base = api.memory_allocated(dev)
    made = [decode_replay(model, b, 512) for b in (1, 32)]
    dtype_name = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32")
    kv = sum(accounting.kv_cache_bytes(cfg, dtype_name, b, 513) for b in (1, 32))
    held = api.memory_allocated(dev) - base
    failed += not say(
        "kv caches kept", held >= kv, f"{held / 2**20:.1f} MiB held, KV {kv / 2**20:.1f} MiB"
    )
    api.empty_cache()
    stress = torch.empty(STRESS_BYTES // 4 if name == "article" else 1 << 16, device=dev)
    stress.fill_(7.0)
    for (replay, eager, got), b in zip(made, (1, 32), strict=True):
        replay()
        api.synchronize(dev)
        same = torch.allclose(got["logits"].float(), eager.float(), rtol=2e-2, atol=2e-2)
        failed += not say(f"replay decode b={b}", same, "eager logits after the memory was reused")
    del stress
    failed += liveness_check(model)
    failed += kernels(model, out)
    failed += oom_then_ok(model, dtype_name)
    return failed


def liveness_check(model) -> int:
    """torch >= 2.13's torch.cuda.graph(check_input_liveness=True), where it exists."""
    import inspect

    import torch

    if model.embed.weight.device.type != "cuda":
        return not say("check_input_liveness", True, "skipped: not a GPU")
    if "check_input_liveness" not in inspect.signature(torch.cuda.graph.__init__).parameters:
        return not say("check_input_liveness", True, f"skipped: torch {torch.__version__} has none")
    replay, eager, got = decode_replay(model, 1, 512)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, check_input_liveness=True):
            replay._fn()  # the call the replay owns, captured again under the check
        graph.replay()
        torch.cuda.synchronize()
    except RuntimeError as e:
        return not say("check_input_liveness", False, str(e).splitlines()[0][:200])
    return not say("check_input_liveness", True, "capture and replay passed torch's check")


def kernels(model, out: Path) -> int:
    """The kernels of one prefill step and one masked mixed step (torch.profiler), listed in
    OUT/kernels.txt: which attention and matmul kernels ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchbatch.experiments.piggyback import probe as piggyback
    from benchbatch.runtime import steps
    from benchbatch.runtime.timing import TimingOptions

    opts = TimingOptions(l2_flush=False)
    gpu = model.embed.weight.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    calls = {
        "prefill 512": steps.prepare(model, steps.prefill(1, 512), opts, cuda_graphs=False),
        "mixed b=32 + 64 (masked)": piggyback.prepare_mixed(
            model, piggyback.MixedStep(32, 512, 64), opts, cuda_graphs=False
        ),
    }
    lines = []
    for label, call in calls.items():
        call()  # first-call work out of the list
        with profile(activities=activities) as prof:
            call()
            if gpu:
                torch.cuda.synchronize()
        key = "self_cuda_time_total" if gpu else "self_cpu_time_total"
        lines += [f"== {label}", prof.key_averages().table(sort_by=key, row_limit=20)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.txt").write_text("\n".join(lines))
    return not say("kernel list", True, f"{len(calls)} steps listed in {out / 'kernels.txt'}")


def oom_then_ok(model, dtype_name: str) -> int:
    """A decode step twice the device's memory is an oom row, and the next step in the same
    process is a normal row (the failed step gave back what it held)."""
    from benchbatch.core import accounting
    from benchbatch.runtime import device, steps
    from benchbatch.runtime.timing import TimingOptions

    dev = model.embed.weight.device
    per_seq = accounting.kv_cache_bytes(model.cfg, dtype_name, 1, 513)
    free = device.free_memory_bytes(dev) if dev.type == "cuda" else 2**62
    huge = steps.decode(max(1, 2 * free // per_seq), 512)
    opts = TimingOptions(min_repeats=5, min_time_s=0.0)
    rows = [steps.run_step(model, dtype_name, s, opts) for s in (huge, steps.decode(1, 512))]
    statuses = [r["status"] for r in rows]
    return not say("oom, then a row", statuses == ["oom", "ok"], f"statuses {statuses}")


# --- reproduce's numbers against an H200's ---------------------------------------------------


def ranges(run: Path) -> int:
    """probe.csv's best matmul and copy, phases.csv's decode b=1, each against EXPECTED
    (an H200 SXM's; another GPU's numbers are printed, not judged)."""
    import pandas as pd

    from benchbatch.core import peaks

    meta = run / "metadata.json"
    gpu = ""
    if meta.exists():
        import json

        gpu = json.loads(meta.read_text()).get("environment", {}).get("device_name", "") or ""
    judged = (peaks.lookup(gpu) or peaks.Peak("", {}, 0)).name == "H200 SXM"
    got = measured(pd, run)
    failed = 0
    for what, (low, high) in EXPECTED.items():
        value = got.get(what, math.nan)
        inside = low <= value <= high
        note = f"{value:.3g} (an H200 SXM: {low}-{high})"
        failed += not say(
            what,
            inside or not judged,
            note + ("" if judged else f"; not judged on {gpu or 'this GPU'}"),
        )
    return failed


def measured(pd, run: Path) -> dict:
    got = {}
    probe, phases = run / "probe.csv", run / "phases.csv"
    if probe.exists():
        df = pd.read_csv(probe)
        ok = df[df["status"] == "ok"]
        got["probe matmul (TFLOP/s)"] = ok[ok["kind"] == "matmul"]["tflops"].max()
        got["probe copy (TB/s)"] = ok[ok["kind"] == "copy"]["gbps"].max() / 1e3
    if phases.exists():
        df = pd.read_csv(phases)
        one = df[(df["label"] == "decode b=1") & (df["status"] == "ok")]
        if len(one):
            got["decode b=1 with graphs (ms)"] = float(one["step_ms"].min())
    return got


# --- attention: what a new shape costs on each SDPA backend -----------------------------------

NEW_SHAPES = 12  # consecutive key lengths, as a served decode batch meets them step by step


def attention(dev, dtype, dry: bool, limit_ms: float | None = None) -> int:
    """Decode attention (batch 8, one query each) over NEW_SHAPES consecutive key lengths,
    each shape's first call timed, then one shape repeated: per backend, unmasked and with
    the engine's boolean mask. cuDNN builds a graph for each new shape (docs/gpu.md: the
    engine's steps cost 50-78 ms on the first H200 run); benchbatch runs the others (a
    CUDA backend turns cuDNN's off). ok when the backends benchbatch uses take a new shape
    in under 1 ms a call (on the CPU of --dry: under 50 ms)."""
    import functools
    import statistics

    import torch
    from torch.nn.attention import SDPBackend

    heads, d, batch, start = (2, 16, 2, 33) if dry else (16, 128, 8, 513)
    sync = (lambda: None) if dry else torch.cuda.synchronize  # noqa: E731
    make = lambda *shape: torch.randn(*shape, device=dev, dtype=dtype)  # noqa: E731
    q = make(batch, heads, 1, d)
    sets = {
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "benchbatch's (flash, memory-efficient, math)": [
            SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
        ],
    }  # fmt: skip
    failed, limit_ms = 0, limit_ms or (50.0 if dry else 1.0)
    for name, backends in sets.items():
        for masked in (False, True):
            kind = "masked" if masked else "unmasked"

            call = functools.partial(_timed_attention, q, make, sync, backends, masked)
            try:
                call(start - 1)  # the backend's own first-call setup, not a shape's
                new = [call(start + i) for i in range(NEW_SHAPES)]
                again = [call(start + NEW_SHAPES - 1) for _ in range(NEW_SHAPES)]
            except RuntimeError as e:  # this backend does not take these tensors here
                why = str(e).split(". ")[0][:80]
                print(f"{'attention':<24} -: {name}, {kind}: not available ({why})")
                continue
            new_ms, again_ms = statistics.median(new), statistics.median(again)
            detail = (f"{name}, {kind}: a new shape {new_ms:.3g} ms a call, the same shape "
                      f"again {again_ms:.3g} ms (medians of {NEW_SHAPES})")  # fmt: skip
            if name == "cudnn":  # recorded, not judged: benchbatch does not run it
                print(f"{'attention':<24} -: {detail}", flush=True)
            else:
                failed += not say("attention", new_ms < limit_ms, detail)
    return failed


def _timed_attention(q, make, sync, backends, masked: bool, length: int) -> float:
    """Milliseconds of one attention call of q against `length` new keys, on `backends`,
    with the engine's boolean mask (one sequence a key shorter) or none."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    batch, heads, _, d = q.shape
    keys, mask = make(batch, heads, length, d), None
    if masked:
        mask = torch.ones(batch, 1, 1, length, dtype=torch.bool, device=q.device)
        mask[0, ..., -1] = False
    sync()
    begin = time.perf_counter()
    with sdpa_kernel(backends):
        F.scaled_dot_product_attention(q, keys, keys, attn_mask=mask)
    sync()
    return (time.perf_counter() - begin) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["preflight", "lifetime", "ranges", "attention"])
    parser.add_argument("folder", nargs="?", default="results/gpu-check", type=Path)
    parser.add_argument("--dry", action="store_true", help="on the CPU, through the fake CUDA")
    args = parser.parse_args(argv)
    if args.check == "preflight":
        return preflight(args.dry)
    if args.check == "ranges":
        return ranges(args.folder)
    sys.path.insert(0, str(REPO))
    with machine(args.dry) as (api, dev, name, dtype):
        if args.check == "attention":
            return attention(dev, dtype, args.dry)
        return lifetime(api, dev, name, dtype, args.folder)


if __name__ == "__main__":
    sys.exit(main())
