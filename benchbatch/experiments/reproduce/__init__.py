"""reproduce: the article's measurements in one command, one folder, one report: a list of
parts (probe, phases, sweep, occupancy, memory, the real engine, the serving curve) run on
one model and one set of ceilings (options, run)."""

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import use
from benchbatch.core.probe_options import ProbeOptions
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.phases.options import PhasesOptions
from benchbatch.experiments.reproduce.options import ReproduceOptions
from benchbatch.experiments.sweep.options import SweepOptions

WORKLOAD_FIELDS = ("requests", "slots", "median", "sigma", "max_output", "prompt_len")
RUN_FIELDS = ("device", "dtype", "seed", "repeats", "min_time", "warmup", "threads",
              "cuda_graphs", "compile", "out", "force", "json_out")  # fmt: skip

HELP = """The article's tables B and A and experiment C on this device, in one folder with a
report (report.md, report.html) that sets each number beside the article's and says
which claims hold here.

probe -> phases -> sweep -> occupancy, on one model with random weights. On CUDA the
article's sizes (12 layers, hidden 2048, fp16); without CUDA a CPU-sized model
(cpu-small: hidden 512, 4 layers, fp32) and batches up to 128, under a minute on 2
cores (--engine real adds about two and a half minutes: the runs, then the calibration
that prices them).
"""

EXPERIMENT = Experiment(
    name="reproduce",
    help=HELP,
    options=(
        ReproduceOptions,
        PhasesOptions,
        use(SweepOptions, only=("batch",), flags={"batch": "--sweep-batch"}),  # beside phases
        use(WorkloadOptions, only=WORKLOAD_FIELDS, helps={
            "prompt_len": "Prompt tokens of a request.",  # reproduce takes no --trace
        }),  # fmt: skip
        ProbeOptions,
        ModelOptions,
        use(RunOptions, only=RUN_FIELDS),
    ),
    runs="benchbatch.experiments.reproduce.run",
    order=40,
)
