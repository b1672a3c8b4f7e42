"""occupancy: static against continuous batching, and the memory policies on one KV budget,
simulated and on the model (options, probe, memory, run)."""

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.occupancy.options import OccupancyOptions

HELP = """Static vs continuous batching: slot occupancy and total steps on one workload.

Static batching runs a group of --slots requests until its longest ends (finished slots
sit idle); continuous batching refills a slot the step after it frees. Defaults are the
article's: 600 requests, output lengths lognormal (median 70), 32 slots.

Memory, not compute, limits the batch: on one KV budget (--kv-memory, --block-size) three
memory policies run side by side: static and continuous batching each reserving prompt +
--max-output per sequence, and continuous batching with paged blocks (preempting the
newest request when the blocks run out). memory.csv, memory_timeline.csv, memory.png.

With --engine real both policies also run on the model (default preset: article on CUDA,
cpu-small on CPU; --device applies only then), and measured time is compared with the
simulation; with --kv-memory the memory policies run on it too. A notice estimates the
duration first. On a CPU, try `benchbatch occupancy --engine real --requests 64 --slots
8 --max-output 200` (about a minute with cpu-small on 2 cores).
"""

RUN_FIELDS = ("device", "dtype", "seed", "threads", "tp", "compile", "out", "force", "json_out")

EXPERIMENT = Experiment(
    name="occupancy",
    help=HELP,
    options=(OccupancyOptions, WorkloadOptions, ModelOptions, use(RunOptions, only=RUN_FIELDS)),
    runs="benchbatch.experiments.occupancy.run",
    several_ranks=True,
    order=30,
)
