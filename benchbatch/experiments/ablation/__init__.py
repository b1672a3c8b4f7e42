"""ablation: the Sarathi-Serve ablation (mixed batching, chunked prefill, both) on one
workload, simulated with a step-cost model fitted here and run on the model (options,
probe, run)."""

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.ablation.options import ABLATION_WORKLOAD, AblationOptions
from benchbatch.experiments.base import Experiment

HELP = """Mixed batching, chunked prefill and both (Sarathi-Serve): P50 TTFT and P99 TBT.

A long prompt prefilled whole stalls every running decode for a step; chunks bound the
step, and mixing them into the decodes' steps keeps prompts moving. The paper (Yi-34B):
P50 TTFT / P99 TBT 0.53 / 0.68 s mixed without chunks, 1.04 / 0.17 s chunks without
mixing, 0.76 / 0.14 s both. All three run on one workload, simulated with a step-cost
model fitted to steps timed here (or --step-costs), and with --engine real on the model
(default preset: article on CUDA, cpu-small on CPU).

On a CPU: `benchbatch ablation --engine real --preset cpu-small` (the defaults: 40
requests, a fifth with 1,024-token prompts, 8 sequences, budget 256, chunk 128) takes
about two minutes on 2 cores.
"""

# The ablation times steps for their cost, not against the device's ceilings.
ROOFLINE_FIELDS = ("roofline", "ceilings", "reprobe")

EXPERIMENT = Experiment(
    name="ablation",
    help=HELP,
    options=(
        AblationOptions,
        use(WorkloadOptions, skip=("prompts",), defaults=ABLATION_WORKLOAD, helps={
            "arrival_rate": "Poisson arrivals, requests per scheduler step (the ablation's "
                            "default keeps its slots busy)."}),  # fmt: skip
        ModelOptions,
        use(RunOptions, skip=ROOFLINE_FIELDS),
    ),
    runs="benchbatch.experiments.ablation.run",
    several_ranks=True,
    order=60,
)
