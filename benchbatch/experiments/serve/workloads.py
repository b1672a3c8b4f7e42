"""A serving sweep's workload: the requests (lengths from the distributions or a trace) and
their arrival times at 1 request per second (a seeded Poisson process, gamma gaps with
--burstiness, or a trace's own arrival_s), which every rate of the sweep scales. No torch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchbatch.core.arrivals import at_rate, read_arrivals, to_unit_rate, unit_poisson
from benchbatch.core.workload import Request, Workload
from benchbatch.errors import UserError
from benchbatch.experiments.serve.options import ServeOptions as Options


@dataclass(frozen=True)
class ServeWorkload:
    """The requests (lengths) and their arrival times at 1 request per second; every rate
    scales the same times, and every policy serves the same requests."""

    requests: list[Request]
    unit_arrivals: np.ndarray
    arrivals: str  # how they were made, for the metadata
    lengths: str

    def at(self, rate: float, n: int | None = None) -> tuple[list[Request], np.ndarray]:
        """The first n requests (all by default) and their arrival times at `rate`."""
        k = len(self.requests) if n is None else min(n, len(self.requests))
        return self.requests[:k], at_rate(self.unit_arrivals[:k], rate)


def draw(opts: Options, workload, seed: int) -> ServeWorkload:
    """The lengths from the distributions (or the trace) and the arrivals: a Poisson process
    (seeded; gamma gaps with --burstiness), or the trace's arrival_s scaled to each rate."""
    if workload.trace is not None:
        return _from_trace(workload, seed, opts.burstiness)
    prompt, output = opts.lengths(workload)
    n = workload.requests
    # Output lengths from default_rng(seed), as occupancy draws them: lognormal outputs of a
    # seed are the article workload's own.
    outputs = output.draw(n, np.random.default_rng(seed))
    prompts = prompt.draw(n, np.random.default_rng([seed, 5]))
    columns = Workload(np.arange(n), prompts, outputs, np.zeros(n, np.int64))
    lengths = f"prompts {prompt.describe()}; outputs {output.describe()} tokens"
    unit = unit_poisson(n, seed, opts.burstiness)
    return ServeWorkload(columns.to_requests(), unit, arrivals_label(opts.burstiness), lengths)


def arrivals_label(burstiness: float) -> str:
    """How the arrivals were drawn, for the metadata."""
    if burstiness == 1.0:
        return "poisson"
    spread = burstiness**-0.5
    return f"gamma gaps, burstiness {burstiness:g}: coefficient of variation {spread:.3g}"


def _from_trace(workload, seed: int, burstiness: float = 1.0) -> ServeWorkload:
    columns = workload.draw()
    if columns.arrival_step.any():
        raise UserError(
            "trace",
            f"{workload.trace} has arrival_step (scheduler steps): serve-sweep takes arrival_s, "
            "in seconds (or no arrival column: Poisson arrivals at each rate)",
        )
    times = read_arrivals(workload.trace)
    requests = columns.to_requests()
    lengths = f"{len(requests):,} requests from {workload.trace}"
    if times is None:
        unit = unit_poisson(len(requests), seed, burstiness)
        return ServeWorkload(requests, unit, arrivals_label(burstiness), lengths)
    if burstiness != 1.0:
        raise UserError("burstiness", f"{workload.trace} has its own arrival times (arrival_s): "
                        "--burstiness applies only to drawn arrivals")  # fmt: skip
    return ServeWorkload(requests, to_unit_rate(times), f"trace {workload.trace}", lengths)
