"""piggyback: prefill tokens riding on a decode step, and what chunking costs."""

from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.piggyback.options import PiggybackOptions

HELP = """How many prefill tokens ride nearly free on a decode step, and what chunking costs.

A decode step reads every weight for one token per sequence; prefill tokens added to
the same forward (Sarathi-Serve's piggybacking) use the idle arithmetic. The paper puts
it at about 128 prefill tokens per decode token in linear layers. The chunk sweep times
a long prompt prefilled in chunks (each re-reads the weights and the earlier chunks' KV)
against one prefill; the tile rows compare e.g. 256 with 257 tokens (the paper: 32%
slower). Default model: article on CUDA, cpu-small on CPU.
"""

EXPERIMENT = Experiment(
    name="piggyback",
    help=HELP,
    options=(PiggybackOptions, ModelOptions, use(RunOptions, skip=("tp",))),
    runs="benchbatch.experiments.piggyback.run",
    several_ranks=False,
    order=70,
)
