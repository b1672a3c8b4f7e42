"""What a run's slots did, step by step: per step, or as runs of equal active-slot counts.

A static run of a million requests has millions of steps but far fewer changes of the
active-slot count, so the compact form (RunLengths) stores only the steps where the count
changes; expand() gives back the per-step column exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from benchbatch.core.plans import StepPlan


@dataclass(frozen=True, eq=False)
class RunLengths:
    """Active slots as runs: from step[i] until step[i + 1] (the last until total_steps)
    every step has active[i] active slots. step[0] is 0 and no two neighbours are equal."""

    step: np.ndarray
    active: np.ndarray
    total_steps: int

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.step, append=self.total_steps)

    def expand(self) -> np.ndarray:
        """The active-slot count of every step."""
        return np.repeat(self.active, self.lengths)

    @classmethod
    def from_per_step(cls, active) -> RunLengths:
        active = np.asarray(active, dtype=np.int64)
        if active.size == 0:
            return cls.empty()
        starts = np.flatnonzero(np.diff(active)) + 1
        step = np.concatenate(([0], starts))
        return cls(step, active[step], int(active.size))

    @classmethod
    def from_intervals(cls, starts: np.ndarray, ends: np.ndarray) -> RunLengths:
        """Each interval [start, end) holds one slot for its steps; steps are counted from 0."""
        if starts.size == 0:
            return cls.empty()
        up_at, ups = _counts(np.sort(starts))
        down_at, downs = _counts(np.sort(ends))
        points = np.union1d(up_at, down_at)
        delta = np.zeros(points.size, np.int64)
        delta[np.searchsorted(points, up_at)] += ups
        delta[np.searchsorted(points, down_at)] -= downs
        changed = delta != 0  # an end and a start at the same step change nothing
        points, active = points[changed], np.cumsum(delta[changed])
        # The last change is the last end (0 active from then on): it is total_steps.
        step, active, total = points[:-1], active[:-1], int(points[-1])
        if step[0] > 0:  # nothing active before the first arrival
            step, active = np.concatenate(([0], step)), np.concatenate(([0], active))
        return cls(step, active, total)

    @classmethod
    def empty(cls) -> RunLengths:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), 0)

    def sums(self, edges: np.ndarray) -> np.ndarray:
        """Active slot-steps in [edges[k], edges[k + 1]) for each k, without expanding:
        the cumulative sum at any step is the sum up to its run plus a part of that run."""
        edges = np.asarray(edges, dtype=np.int64)
        if self.step.size == 0:
            return np.zeros(max(edges.size - 1, 0), np.int64)
        before = np.concatenate(([0], np.cumsum(self.active * self.lengths)[:-1]))
        run = np.searchsorted(self.step, edges, side="right") - 1
        cumulative = before[run] + self.active[run] * (edges - self.step[run])
        return np.diff(cumulative)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunLengths):
            return NotImplemented
        return (
            self.total_steps == other.total_steps
            and np.array_equal(self.step, other.step)
            and np.array_equal(self.active, other.active)
        )

    __hash__ = None  # type: ignore[assignment]


def _counts(ordered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a sorted array and how often each occurs."""
    first = np.flatnonzero(np.diff(ordered, prepend=ordered[0] - 1))
    return ordered[first], np.diff(first, append=ordered.size)


@dataclass
class Timeline:
    """Per step, column-wise: what the step-by-step scheduler path records."""

    active_slots: list[int] = field(default_factory=list)  # slots doing useful work
    decode_tokens: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    # With a KV budget: blocks held, tokens the active sequences keep in them, preemptions.
    kv_blocks: list[int] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)

    def append(self, plan: StepPlan) -> None:
        self.active_slots.append(plan.num_active)
        self.decode_tokens.append(plan.num_decode_tokens)
        self.prefill_tokens.append(plan.num_prefill_tokens)
        self.kv_blocks.append(plan.kv_blocks)
        self.kv_tokens.append(plan.kv_tokens)
        self.preempted.append(len(plan.preempted))

    def run_lengths(self) -> RunLengths:
        return RunLengths.from_per_step(self.active_slots)


@dataclass(frozen=True, eq=False)
class EventTimeline:
    """The fast path's timeline under the article's rule: active slots as runs, and the steps
    where requests were admitted (each admission prefills its whole prompt). The per-step
    columns of Timeline are built from these only when read, and equal it exactly."""

    runs: RunLengths
    admit_step: np.ndarray  # increasing steps with at least one admission
    admit_count: np.ndarray  # requests admitted at that step
    admit_prefill: np.ndarray  # their prompt tokens

    @classmethod
    def from_requests(
        cls, starts: np.ndarray, outputs: np.ndarray, prompts: np.ndarray
    ) -> EventTimeline:
        """starts: admission step of each request (n output tokens hold a slot n steps)."""
        runs = RunLengths.from_intervals(starts, starts + outputs)
        if starts.size == 0:
            return cls(runs, starts, starts, starts)
        if not (starts[1:] >= starts[:-1]).all():  # (starts are sorted when arrivals are)
            order = np.argsort(starts, kind="stable")
            starts, prompts = starts[order], prompts[order]
        step, counts = _counts(starts)
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        return cls(runs, step, counts, np.add.reduceat(prompts, first))

    def run_lengths(self) -> RunLengths:
        return self.runs

    @cached_property
    def _admissions(self) -> tuple[np.ndarray, np.ndarray]:
        admitted = np.zeros(self.runs.total_steps, np.int64)
        prefill = np.zeros(self.runs.total_steps, np.int64)
        admitted[self.admit_step] = self.admit_count
        prefill[self.admit_step] = self.admit_prefill
        return admitted, prefill

    @cached_property
    def active_slots(self) -> list[int]:
        return self.runs.expand().tolist()

    @cached_property
    def decode_tokens(self) -> list[int]:
        """Every active slot decodes except those admitted this step (they prefill)."""
        return (self.runs.expand() - self._admissions[0]).tolist()

    @cached_property
    def prefill_tokens(self) -> list[int]:
        return self._admissions[1].tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventTimeline):
            return (
                self.runs == other.runs
                and np.array_equal(self.admit_step, other.admit_step)
                and np.array_equal(self.admit_count, other.admit_count)
                and np.array_equal(self.admit_prefill, other.admit_prefill)
            )
        if isinstance(other, Timeline):
            return (self.active_slots, self.decode_tokens, self.prefill_tokens) == (
                other.active_slots,
                other.decode_tokens,
                other.prefill_tokens,
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        runs = self.runs
        return f"EventTimeline({runs.total_steps} steps in {runs.step.size} runs)"
