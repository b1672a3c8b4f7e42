"""Five deliberate breaks that once survived the whole suite (issue 27, item 4), each now
caught by a test against an independent computation:

(a) the step-cost fit's weights squared instead of their square roots (core/simulate.py);
(b) the activation bytes' residual term halved (core/accounting.py);
(c) the all-reduce bus bandwidth without the rank count (runtime/steps.py, interconnect.py);
(d) a paged sequence's peak tokens counted one too many (core/kvblocks.py);
(e) a step's time as the mean of its repeats instead of the median (runtime/timing.py):
    the repeats here are skewed, so the two differ.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchbatch.core import accounting, stepcost
from benchbatch.core.config import ModelConfig
from benchbatch.core.kvblocks import PAGED, RESERVE, BlockManager, KVBudget, blocks_for
from benchbatch.core.step_model import fit_step_cost
from benchbatch.runtime import backend, interconnect, steps, timing
from benchbatch.runtime.timing import Measurement, TimingOptions

# --- (a) the step-cost fit weighs relative errors -------------------------------------------

# Steps whose times are not exactly linear in their tokens (as measured ones never are), so
# how the fit weighs each step decides the coefficients.
DECODE = [(1, 0.0102), (2, 0.0118), (4, 0.0161), (8, 0.0230), (16, 0.0395)]  # (tokens, s)
PREFILL = [(64, 0.061), (128, 0.118), (256, 0.228)]


def _relative_least_squares(features: list[list[float]], seconds: list[float]) -> np.ndarray:
    """The fit the weights stand for, solved directly: minimise sum((pred / y - 1)^2), i.e.
    ordinary least squares on each row divided by its own time, with target 1."""
    a = np.array(features, dtype=float) / np.array(seconds)[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones(len(seconds)), rcond=None)
    return coef


def test_the_step_cost_fit_minimises_relative_error():
    samples = [(d, 0, 0, s) for d, s in DECODE]
    model = fit_step_cost(samples, weights=[1 / s**2 for *_, s in samples])
    base, per_decode = _relative_least_squares(
        [[1.0, d] for d, _ in DECODE], [s for _, s in DECODE]
    )
    assert model.base_s == pytest.approx(base, rel=1e-9)
    assert model.per_decode_token_s == pytest.approx(per_decode, rel=1e-9)

    def relative_error(b: float, k: float) -> float:
        return sum(((b + k * d) / s - 1) ** 2 for d, s in DECODE)

    # And it is a minimum: any nudge of either coefficient makes the relative error larger.
    best = relative_error(model.base_s, model.per_decode_token_s)
    for db, dk in itertools.product((-1e-4, 0, 1e-4), (-1e-5, 0, 1e-5)):
        if db or dk:
            assert relative_error(model.base_s + db, model.per_decode_token_s + dk) > best


def test_the_step_cost_fit_of_timed_steps_weighs_each_step_by_its_own_time():
    rows = [
        {"decode_tokens": d, "prefill_tokens": 0, "context_tokens": 0, "step_ms": s * 1e3}
        for d, s in DECODE
    ] + [
        {"decode_tokens": 0, "prefill_tokens": p, "context_tokens": 0, "step_ms": s * 1e3}
        for p, s in PREFILL
    ]
    model, fitted = stepcost.fit(rows)
    assert all(r["used"] for r in fitted)  # no step is far enough off to be left out
    features = [[1.0, r["decode_tokens"], r["prefill_tokens"]] for r in rows]
    want = _relative_least_squares(features, [r["step_ms"] / 1e3 for r in rows])
    got = (model.base_s, model.per_decode_token_s, model.per_prefill_token_s)
    assert got == pytest.approx(tuple(want), rel=1e-9)


# --- (b) activation bytes, op by op ---------------------------------------------------------


def _activation_elements_by_hand(h: int, q: int, kv: int, inter: int, head_dim: int) -> int:
    """Elements each op of one layer reads and writes for one token, listed op by op (one
    pass per op, no fusion), from the layer's structure rather than accounting's formula."""
    ops = {  # op: (elements read, elements written)
        "input RMSNorm": (h, h),
        "q, k, v projections (x read once)": (h, q + 2 * kv),
        "rotary on q and k (cos and sin read for both)": (q + kv + 2 * head_dim, q + kv),
        "attention (queries in, output out)": (q, q),
        "output projection": (q, h),
        "residual add after attention": (2 * h, h),
        "post-attention RMSNorm": (h, h),
        "gate and up projections": (h, 2 * inter),
        "SwiGLU (gate, up in; product out)": (2 * inter, inter),
        "down projection": (inter, h),
        "residual add after the MLP": (2 * h, h),
    }
    return sum(r + w for r, w in ops.values())


def test_activation_bytes_count_every_op_of_every_layer():
    cfg = ModelConfig(hidden=8, layers=3, heads=2, kv_heads=1, intermediate=16, vocab=10)
    per_token = _activation_elements_by_hand(8, 8, 4, 16, 4)
    assert per_token == 280  # by hand: 32 norms + 104 projections + 16 + 32 rotary + 48 + 48
    for batch, tokens, context in ((1, 1, 5), (2, 7, 0), (3, 4, 9)):
        new = batch * tokens
        # Per new token: every layer's ops and the step's cos/sin rows (head_dim values);
        # per sequence: the final norm's row read and the logits written (hidden + vocab).
        elements = new * (cfg.layers * per_token + 4) + batch * (8 + 10)
        got = accounting.step_cost(cfg, "fp16", batch, tokens, context).activation_bytes
        assert got == 2 * elements, (batch, tokens, context)


# --- (c) all-reduce bus bandwidth, nccl-tests' definition ------------------------------------


@pytest.mark.parametrize("ranks", [3, 4, 8])
def test_allreduce_bus_bandwidth_counts_the_ring_over_the_ranks(ranks):
    cfg = ModelConfig(hidden=64, layers=2, heads=4, vocab=256)
    step = steps.decode(4, 16)  # 4 sequences, one token each
    reduce_ms = 2.0
    per_rank = [{"allreduce_ms": reduce_ms, "allgather_ms": 0.1, "stats": {"step_ms": 9.0}}]
    world = SimpleNamespace(tp=ranks)
    cols = steps.collective_columns(cfg, "fp32", step, world, per_rank * ranks, 9.0)
    message = 4 * 64 * 4  # four tokens' hidden vectors, fp32
    count = 2 * cfg.layers  # after attention and after the MLP, in every layer
    # A ring all-reduce moves 2 (n - 1) / n of the message over each rank's link.
    want = message * 2 * (ranks - 1) / ranks * count / (reduce_ms / 1e3) / 1e9
    assert cols["allreduce_bytes"] == message and cols["allreduce_count"] == count
    assert cols["allreduce_busbw_gbps"] == pytest.approx(want, rel=1e-12)
    # The probe's row of one all-reduce: algbw is the message over the time, busbw the ring.
    row = interconnect.row(Measurement([reduce_ms] * 5), message, ranks, "fp32")
    algbw = message / (reduce_ms / 1e3) / 1e9
    assert row["algbw_gbps"] == pytest.approx(algbw, rel=1e-12)
    assert row["gbps"] == pytest.approx(algbw * 2 * (ranks - 1) / ranks, rel=1e-12)


# --- (d) a paged sequence's peak tokens, counted token by token ------------------------------


def _cached_tokens_by_brute_force(prompt: int, output: int) -> int:
    """Generate a sequence step by step and count what its KV cache holds at its largest:
    the prefill caches the prompt and yields output token 1; each decode feeds the latest
    token back (caching it) and yields the next; the last token is never fed back."""
    cached, produced, peak = prompt, 1, prompt
    while produced < output:
        cached += 1
        produced += 1
        peak = max(peak, cached)
    return peak


def test_a_paged_sequence_peaks_at_its_prompt_and_every_output_token_but_the_last():
    budget = KVBudget(blocks=1000, block_size=16, policy=PAGED)
    for prompt, output in itertools.product((1, 5, 16, 17, 31), (1, 2, 15, 16, 17, 40)):
        peak = _cached_tokens_by_brute_force(prompt, output)
        assert budget.peak_tokens(prompt, output) == peak, (prompt, output)
        # The blocks a block manager hands out growing the sequence token by token.
        manager = BlockManager(num_blocks=1000, block_size=16)
        for held in range(prompt, peak + 1):
            assert manager.grow(0, held) is not None
        assert len(manager.table(0)) == blocks_for(budget.peak_tokens(prompt, output), 16)
    # At a block boundary the extra token would cost a whole block: 16 + 17 - 1 = 32.
    assert blocks_for(budget.peak_tokens(16, 17), 16) == 2
    reserve = KVBudget(blocks=1000, block_size=16, policy=RESERVE)
    assert reserve.peak_tokens(16, 17) == 33  # a reservation holds the whole output


# --- (e) a step's time is the median of its repeats ------------------------------------------


class ScriptedBackend(backend.CpuBackend):
    """The CPU backend with a scripted clock: each timed call lasts the next of `times_ms`
    (cycled), so a step's repeats are known and skewed: mostly fast, now and then slow, as
    on a machine where another process takes the core."""

    def __init__(self, times_ms: list[float]):
        super().__init__(torch.device("cpu"))
        self.clock = itertools.cycle(times_ms)

    def timer(self):
        outer = self

        class Scripted(backend.HostTimer):
            def time(self, fn) -> None:
                fn()
                self._ms.append(next(outer.clock))
                self._wall.append(self._ms[-1])

        return Scripted()


def test_a_steps_time_is_the_median_of_skewed_repeats():
    skewed = [1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 13.0]  # median 1, mean 3.86
    opts = TimingOptions(min_repeats=7, min_time_s=0.0, warmup=1, warmup_s=0.0, l2_flush=False)
    with backend.use(ScriptedBackend(skewed)):
        m = timing.measure(lambda: None, torch.device("cpu"), opts)
    times = sorted(m.times_ms)
    assert len(times) % 2 == 1  # an odd count: the median is one of the repeats
    median = times[len(times) // 2]
    assert median == 1.0 and sum(times) / len(times) > 1.5  # the repeats are skewed
    assert m.median_ms == median
    assert m.summary()["step_ms"] == median
    # And what the tables show: the probe's row is priced from the median too.
    from benchbatch.runtime import ceilings

    probe = ceilings.Probe("matmul", 8)
    row = ceilings.probe_row(probe, "fp32", Measurement([1.0, 1.0, 1.0, 1.0, 21.0]))
    assert row["step_ms"] == 1.0 and row["tflops"] == pytest.approx(2 * 8**3 / 1e-3 / 1e12)
