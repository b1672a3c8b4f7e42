"""phases: prefill against decode steps, timed and accounted (options, probe, run)."""

from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.phases.options import PhasesOptions

HELP = """Prefill vs decode: step time, achieved TFLOP/s, bandwidth and arithmetic intensity.

Prefill multiplies each weight by a whole prompt (compute-bound); decode by one token per
sequence (memory-bound). Default model: the article's (12 layers, hidden 2048) on CUDA,
cpu-small on a CPU.
"""

EXPERIMENT = Experiment(
    name="phases",
    help=HELP,
    options=(PhasesOptions, ModelOptions, RunOptions),
    runs="benchbatch.experiments.phases.run",
    several_ranks=True,
    order=10,
)
