"""sweep: batch size against decode throughput and step latency (options, probe, run)."""

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.sweep.options import SweepOptions

HELP = """Batch size vs decode throughput and step latency: the knee and the memory ceiling.

A decode step reads every weight once whatever the batch, so batching raises throughput
while each user's wait (the step time) barely grows, until compute takes over (the knee)
or the KV cache fills memory. Default model: the article's (12 layers, hidden 2048) on
CUDA, cpu-small on a CPU.

The memory ceiling is also given for a length distribution (the workload options, as
occupancy's): sequences that fit reserving the longest prompt + --max-output against
paged blocks at the lengths they reach (memory_ceiling.csv), on this device's free
memory and, with --gpu, on a named GPU's datasheet memory.
"""

# The length distribution the memory ceiling is read for (occupancy's workload options).
LENGTH_FIELDS = ("requests", "median", "sigma", "max_output", "prompt_len", "trace")

EXPERIMENT = Experiment(
    name="sweep",
    help=HELP,
    options=(SweepOptions, use(WorkloadOptions, only=LENGTH_FIELDS, helps={
        "trace": "Read the lengths from a CSV trace instead: column output_tokens, optional "
                 "prompt_tokens (replaces --requests, --output-median, --output-sigma, "
                 "--max-output)."}), ModelOptions, RunOptions),  # fmt: skip
    runs="benchbatch.experiments.sweep.run",
    several_ranks=True,
    order=20,
)
