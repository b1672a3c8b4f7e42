"""phases: prefill against decode steps, timed and accounted (options, probe, run)."""

from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.phases.options import PhasesOptions
from benchbatch.experiments.phases.run import HELP, measure_run, open_run

EXPERIMENT = Experiment(
    name="phases",
    help=HELP,
    options=(PhasesOptions, ModelOptions, RunOptions),
    open=open_run,
    measure=measure_run,
    several_ranks=True,
    order=10,
)
