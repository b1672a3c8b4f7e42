"""What a run of the real engine records: each executed step (StepRecord: its counts and
its times, one CSV row) and the run of one policy (EngineResult), filled step by step so an
interrupted run keeps what it did. runtime/engine.py fills them."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchbatch.core.metrics import RunMetrics
from benchbatch.core.workload import Request


@dataclass(frozen=True)
class StepRecord:
    """One executed step: what it computed and what it cost."""

    policy: str
    step: int
    active: int  # slots doing useful work (decoding or prefilling)
    decode_tokens: int
    prefill_tokens: int
    padded: int  # finished slots of a static group that still computed a padding token
    step_s: float
    model_s: float
    rank_step_s: tuple[float, ...] = ()  # under torchrun: every rank's step (step_s: slowest)
    kv_blocks: int = 0  # with a KV budget: blocks held during the step
    kv_tokens: int = 0  # tokens the active sequences hold in them after it
    preempted: int = 0  # requests preempted before it ran
    start_s: float | None = None  # with arrivals in seconds: on the run's clock (0: start)
    end_s: float | None = None
    # What the step-cost model prices beside the counts (core/step_model.py): KV entries the
    # step's sequences read, those copied to gather a decode batch of scattered slots, the
    # keys its attention reads past a row's own context, whether its matmuls have 2+ rows,
    # and the query-key pairs of its prompts attended from scratch.
    context_tokens: int = 0
    gathered_tokens: int = 0
    masked_tokens: int = 0
    batched: int = 0
    prompt_pairs: int = 0
    decode_only_rows: int = 0  # a decode-only step's rows (0 with prefill tokens)
    prefill_step: int = 0  # 1 with prefill tokens
    since_change: int = 0  # steps since the step's requests changed (plan.since_change)
    # Host time from the previous step's end to this one's start (the loop handing the last
    # record on, releasing arrivals); None (an empty cell) for a run's first step and after
    # an idle wait, where there is no such gap.
    gap_s: float | None = None
    # The engine thread's CPU time over the step and over the gap before it (None where
    # there is no gap): with one compute thread (torch runs the step's work inline) what a
    # core spent on them, which other processes' turns on the core do not stretch
    # (runtime/backend.py, HostTimer); step_s over cpu_s says how long it waited for one.
    cpu_s: float | None = None
    gap_cpu_s: float | None = None
    # With arrivals in seconds: how long the engine waited idle for a request before this
    # step (None where it did not): the core comes back from idle slow, and the step-cost
    # model prices that (StepCostModel.woken_s).
    idle_s: float | None = None

    def row(self) -> dict:
        ranks = {f"step_ms_rank{i}": s * 1e3 for i, s in enumerate(self.rank_step_s)}
        timed = {} if self.end_s is None else {"start_s": self.start_s, "end_s": self.end_s}
        return {
            "policy": self.policy,
            "step": self.step,
            "active": self.active,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "padded": self.padded,
            "step_ms": self.step_s * 1e3,
            "model_ms": self.model_s * 1e3,
            **ranks,
            "kv_blocks": self.kv_blocks,
            "kv_tokens": self.kv_tokens,
            "preempted": self.preempted,
            "context_tokens": self.context_tokens,
            "gathered_tokens": self.gathered_tokens,
            "masked_tokens": self.masked_tokens,
            "batched": self.batched,
            "prompt_pairs": self.prompt_pairs,
            "decode_only_rows": self.decode_only_rows,
            "prefill_step": self.prefill_step,
            "since_change": self.since_change,
            "gap_ms": math.nan if self.gap_s is None else self.gap_s * 1e3,
            "cpu_ms": math.nan if self.cpu_s is None else self.cpu_s * 1e3,
            "gap_cpu_ms": math.nan if self.gap_cpu_s is None else self.gap_cpu_s * 1e3,
            "idle_ms": math.nan if self.idle_s is None else self.idle_s * 1e3,
            **timed,
        }


@dataclass
class EngineResult:
    """A run of one policy; filled step by step, so an interrupted run keeps what it did."""

    policy: str
    slots: int
    requests: int
    steps: list[StepRecord] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    metrics: RunMetrics | None = None  # in seconds; set when the run completes
    complete: bool = False
    compile_s: float | None = None  # --compile: seconds of wall_s torch spent compiling

    @property
    def total_steps(self) -> int:
        return len(self.steps)

    @property
    def wall_s(self) -> float:
        """The run's time: its steps and the host's gaps between them (the loop handing a
        record on, admitting requests), which the calibrated price holds in its base; the
        steps alone left 1-2% of a CPU run out."""
        return sum(s.step_s + (s.gap_s or 0.0) for s in self.steps)

    @property
    def model_s(self) -> float:
        return sum(s.model_s for s in self.steps)

    @property
    def useful_slot_steps(self) -> int:
        """Slot-steps that produced or prefilled something (= output tokens, unchunked)."""
        return sum(s.active for s in self.steps)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    @property
    def output_lengths(self) -> dict[int, int]:
        """Tokens each request generated (its forced length, or fewer if it stopped)."""
        return {rid: len(t) for rid, t in self.tokens.items()}

    @property
    def occupancy(self) -> float:
        steps = self.total_steps
        return self.useful_slot_steps / (steps * self.slots) if steps else float("nan")

    @property
    def overhead(self) -> float:
        """Time outside the model (forward and greedy pick) over the run's time, the host's
        gaps between steps included."""
        wall = self.wall_s
        return (wall - self.model_s) / wall if wall else float("nan")

    def step_end_times(self) -> list[float]:
        """When each step ended: on the run's clock with arrivals in seconds (idle waits
        included), else the sum of the step times and the gaps before them so far."""
        if self.steps and self.steps[0].end_s is not None:
            return [s.end_s for s in self.steps]
        ends, now = [], 0.0
        for s in self.steps:
            now += s.step_s + (s.gap_s or 0.0)
            ends.append(now)
        return ends


OnStep = Callable[[StepRecord], None]


def observed_requests(requests: Sequence[Request], result: EngineResult) -> list[Request]:
    """The requests with the output lengths the run produced (with stop tokens, the real
    distribution): output/results.write_trace saves them for `occupancy --trace` to replay."""
    lengths = result.output_lengths
    missing = [r.id for r in requests if not lengths.get(r.id)]
    if missing:
        raise ValueError(f"requests {missing[:5]} produced no tokens: the run did not finish")
    return [dataclasses.replace(r, output_tokens=lengths[r.id]) for r in requests]
