"""serve-sweep's work bounded before anything runs: the simulated sweep's steps (refused past
ServeOptions.MAX_SIM_WORK) and explicit --real-rates against --real-time."""

from __future__ import annotations

from benchbatch.core.options import WorkloadOptions
from benchbatch.core.units import figure
from benchbatch.errors import UserError
from benchbatch.experiments.serve.options import ServeOptions
from benchbatch.output import render


def check_work(opts: ServeOptions, workload: WorkloadOptions, w=None) -> None:
    """Refuse a sweep whose simulation would run for hours or out of memory, before anything
    runs: its points (every policy at every rate, the default rates at most
    len(AUTO_FRACTIONS) + 1, and with --engine real the first --real-requests again at each
    candidate rate) times each point's steps (an upper bound: every output token, every
    prefill chunk) and requests. Without w (not drawn yet): each request one step."""
    from benchbatch.experiments.serve import rate_choice

    if w is None and workload.trace is not None:
        return  # its rows are counted once read
    given, real_given = opts.rate_values, opts.real_rate_values or ()
    if opts.concurrency_sweep:
        rates = len(opts.caps)  # each cap a point, at one rate
    elif given is None:
        rates = len(rate_choice.AUTO_FRACTIONS) + 1 + len(real_given)
    else:
        rates = len(set(given) | set(real_given))
    points = rates * len(opts.policies)
    n = len(w.requests) if w is not None else workload.requests
    served = min(opts.real_requests, n) if opts.engine == "real" else 0
    candidates = (len(real_given) or rates) * len(opts.policies)

    def work(requests: int, first=None) -> int:
        steps = requests if first is None else steps_bound(opts, first)
        return steps + ServeOptions.REQUEST_WORK * requests

    head = None if w is None else w.requests
    total = points * work(n, head) + candidates * work(served, head and head[:served])
    if total <= ServeOptions.MAX_SIM_WORK:
        return
    one_rate = len(opts.policies) * work(n, head)
    longest = 0 if w is None else max(r.output_tokens for r in w.requests)
    if workload.trace is not None:
        option = "trace"
    elif one_rate * 2 <= ServeOptions.MAX_SIM_WORK and opts.concurrency_sweep:
        option = "max_concurrency"
    elif one_rate * 2 <= ServeOptions.MAX_SIM_WORK and opts.rates is not None:
        option = "rates"
    elif len(opts.policies) * longest * 2 > ServeOptions.MAX_SIM_WORK:
        option = "max_output"
    else:
        option = "requests"
    tokens = "" if w is None else f" ({sum(r.output_tokens for r in w.requests):,} output tokens)"
    fewer = "a shorter --trace" if workload.trace is not None else "fewer --requests"
    raise UserError(
        option,
        f"simulating {len(opts.policies)} policies at {rates} "
        f"{'caps' if opts.concurrency_sweep else 'rates'} of {n:,} requests"
        f"{tokens} is about {total:,} steps' work, more than the "
        f"{ServeOptions.MAX_SIM_WORK:,} a run may ({fewer}, fewer "
        f"{'--max-concurrency caps' if opts.concurrency_sweep else '--rates'} or --policies, "
        "or shorter outputs)",
    )


def steps_bound(opts: ServeOptions, requests) -> int:
    """At most the steps one point takes: a step yields a token of every running request
    or takes a prefill (the chunked policy's prompts in chunks)."""
    chunk = opts.chunk if "chunked" in opts.policies else None
    steps = 0
    for r in requests:
        steps += r.output_tokens + 1 + (0 if chunk is None else -(-r.prompt_tokens // chunk))
    return steps


def check_real_rates(opts: ServeOptions, w) -> None:
    """Explicit --real-rates must fit --real-time as the default ones do: a point lasts at
    least until its last request arrives (on the wall clock), for every policy; refused here,
    before anything runs (real.py's _matched checks the fitted cost model's fuller estimate)."""
    if opts.engine != "real" or opts.real_rates is None:
        return
    from benchbatch.experiments.serve import probe

    n = min(opts.real_requests, len(w.requests))
    last = float(w.unit_arrivals[:n].max(initial=0.0))  # at 1 request per second
    rates = opts.real_rate_values
    least = len(opts.policies) * sum(last / r for r in rates)  # an infinite rate: 0
    if least <= opts.real_time:
        return
    fits = len(opts.policies) * last / opts.real_time  # the lowest rate that fits alone
    raise UserError(
        "real_rates",
        f"{', '.join(probe.rate_label(r) for r in rates)} req/s: {n:,} requests per point "
        f"arrive over at least {render.duration(least)} in all ({len(opts.policies)} "
        f"policies), more than --real-time {opts.real_time:g} s (a rate alone fits only from "
        f"{figure(fits)} req/s; or fewer --real-requests, or a larger --real-time)",
    )
