"""compare: several result folders of one command, overlaid and merged."""

from benchbatch.core.options import RunOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.compare.options import CompareOptions

HELP = """Overlay the same plot from several result folders (compare-*.png) and merge their
rows into one compare-TABLE.csv per table (phases, sweep, ...) with a `run` column.

Folders must come from the same command; a missing, corrupt or unknown file is named
in a one-line error (exit code 2).
"""

RUN_FIELDS = ("out", "force", "json_out")

EXPERIMENT = Experiment(
    name="compare",
    help=HELP,
    options=(CompareOptions, use(RunOptions, only=RUN_FIELDS)),
    runs="benchbatch.experiments.compare.run",
    several_ranks=False,
    order=90,
)
