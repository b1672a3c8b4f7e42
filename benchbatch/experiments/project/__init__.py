"""project: a decode step on several GPUs projected from the accounting (nothing measured)."""

from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.project.options import ProjectOptions

HELP = """Projected decode step on several GPUs: how much goes to the all-reduce, and how many
GPUs are worth it, before renting them.

From the accounting (one rank's FLOPs, bytes, weights and KV cache), one GPU's roofline
(datasheet, or a probe.csv measured on it) and the all-reduce's latency and bus bandwidth
(half the datasheet's NVLink figure, or measured). Default: llama3-70b on H100 SXM over
NVLink 4, TP 1, 2, 4, 8. Prints the table with its assumptions; nothing is measured.
"""

EXPERIMENT = Experiment(
    name="project",
    help=HELP,
    options=(
        ProjectOptions,
        use(ModelOptions, skip=("model",)),
        use(RunOptions, only=("out", "force", "json_out")),
    ),
    runs="benchbatch.experiments.project.run",
    several_ranks=False,
    order=100,
)
