"""serve-sweep: request rate against latency and throughput, simulated and served on the
model (options, probe, run)."""

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.serve.options import SERVE_WORKLOAD, ServeOptions

WORKLOAD_FIELDS = ("requests", "slots", "median", "sigma", "max_output", "prompt_len", "trace")
RUN_FIELDS = (
    "device",
    "dtype",
    "seed",
    "repeats",
    "min_time",
    "warmup",
    "threads",
    "out",
    "force",
    "json_out",
)

HELP = """Request rate against TTFT, TPOT, ITL and throughput: static vs continuous vs chunked
prefill, and the largest rate each sustains within the SLO.

Poisson arrivals (seeded) at each rate, and a 'max' point with every request queued.
Every point is simulated with a step-cost model fitted to steps timed here (or
--step-costs): a step lasts what the model says, so a request arriving at t seconds is
first seen by the first step starting at or after t. With --engine real (the default)
the rates that fit --real-time are also served on the model (default preset: article on
CUDA, cpu-small on CPU), arrivals on the wall clock, each beside the simulation of the
very same requests and arrival times (sim-matched) and their ratio.

Lengths from --prompt-dist and --output-dist (fixed, uniform, lognormal), or --trace: a
CSV with output_tokens, optional prompt_tokens and optional arrival_s (seconds: its
shape, bursts and lulls, is replayed at each rate; without it, Poisson arrivals).

Metrics as the serving benchmarks define them: TTFT (arrival to first token), TPOT
((E2E - TTFT) / (output tokens - 1), per request), ITL (every gap between tokens), E2E;
mean, p50, p90, p99; request and output-token throughput; goodput (requests per second
meeting both --slo-ttft and --slo-tpot). A point is within the SLO when its p99 TTFT and
p99 TPOT are. Slot occupancy and mean batch per point say why the curve bends.

Defaults, sized for a 2-core CPU with cpu-small (a decode step of 8 sequences about 30
ms): 500 requests per simulated point, 8 slots, prompts lognormal around 128 tokens (up
to 1,024), outputs lognormal median 16 (at most 64), MLPerf's Llama-2-70B limits (TTFT
2 s, TPOT 200 ms); rates from the simulated capacity; 40 requests per real point within
150 s. Static batching leaves the SLO at about a third of the rate continuous batching
sustains. The whole run takes about four minutes; --engine sim about half a minute.
"""

EXPERIMENT = Experiment(
    name="serve-sweep",
    help=HELP,
    options=(
        ServeOptions,
        use(WorkloadOptions, only=WORKLOAD_FIELDS, defaults=SERVE_WORKLOAD, helps={
            "trace": "Replay a CSV trace instead: column output_tokens, optional prompt_tokens "
                     "and arrival_s (seconds, scaled to each rate; without it, Poisson "
                     "arrivals at each rate) (replaces --requests, --output-median, "
                     "--output-sigma, --max-output)."}),  # fmt: skip
        ModelOptions,
        use(RunOptions, only=RUN_FIELDS),
    ),
    runs="benchbatch.experiments.serve.run",
    order=80,
)
