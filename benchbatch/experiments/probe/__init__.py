"""probe: the device's measured ceilings (matmul, memory, all-reduce) beside its datasheet."""

from benchbatch.core.options import RunOptions
from benchbatch.core.optkit import use
from benchbatch.core.probe_options import ProbeOptions
from benchbatch.experiments.base import Experiment

HELP = """The device's ceilings, measured: matmul TFLOP/s and memory GB/s (copy and read).

The roofline of every other command is drawn on these numbers; the datasheet's are
shown beside them, and dashed on roofline.png. Under torchrun (`torchrun
--nproc-per-node N -m benchbatch probe`) also the interconnect's: all-reduce bus
bandwidth between the N ranks over message sizes (nccl-tests' busbw), in allreduce.png.
"""

RUN_FIELDS = ("device", "dtype", "seed", "repeats", "min_time", "warmup", "threads", "out",
              "force", "json_out")  # fmt: skip

EXPERIMENT = Experiment(
    name="probe",
    help=HELP,
    options=(ProbeOptions, use(RunOptions, only=RUN_FIELDS)),
    runs="benchbatch.experiments.probe.run",
    several_ranks=True,
    order=50,
)
