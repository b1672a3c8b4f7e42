"""What every command shares: option types, list parsing, the model it builds, and the
recording of a run (progress, interrupts, metadata), so each command stays a few lines.
"""

from __future__ import annotations

import contextlib
import json
import signal
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchbatch import config as configs
from benchbatch import device, peaks, telemetry
from benchbatch.errors import UserError
from benchbatch.plots.roofline import roofline_figure
from benchbatch.probes.ceilings import measure_ceilings
from benchbatch.results import json_safe
from benchbatch.roofline import Ceilings, ceilings_from_csv
from benchbatch.run import Run, environment
from benchbatch.timing import TimingOptions

out_console = Console()
err_console = Console(stderr=True)


class Dtype(str, Enum):
    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"


MODEL = "Model"
RUN = "Run"

PresetOpt = Annotated[
    str | None,
    typer.Option(
        help=f"Named model shape ({', '.join(configs.PRESETS)}); other model options override it.",
        rich_help_panel=MODEL,
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A Hugging Face config.json to take the shapes from (no weights are read).",
        rich_help_panel=MODEL,
    ),
]
HiddenOpt = Annotated[
    int | None, typer.Option(help="Hidden size (model width).", rich_help_panel=MODEL)
]
LayersOpt = Annotated[int | None, typer.Option(help="Transformer layers.", rich_help_panel=MODEL)]
HeadsOpt = Annotated[
    int | None, typer.Option(help="Attention (query) heads.", rich_help_panel=MODEL)
]
KvHeadsOpt = Annotated[
    int | None,
    typer.Option(
        help="Key/value heads (grouped-query attention); must divide --heads. Default: --heads.",
        rich_help_panel=MODEL,
    ),
]
IntermediateOpt = Annotated[
    int | None,
    typer.Option(
        help="SwiGLU MLP width. Default: 8/3 x hidden rounded up to a multiple of 256.",
        rich_help_panel=MODEL,
    ),
]
VocabOpt = Annotated[
    int | None, typer.Option(help="Vocabulary size (LM head width).", rich_help_panel=MODEL)
]
MaxContextOpt = Annotated[
    int | None,
    typer.Option(
        help="Longest sequence the model accepts (rotary table size).", rich_help_panel=MODEL
    ),
]
SeedOpt = Annotated[
    int, typer.Option(help="Seed of the random weights and inputs.", rich_help_panel=MODEL)
]

DeviceOpt = Annotated[
    str, typer.Option(help="auto (CUDA when present), cpu, cuda or cuda:N.", rich_help_panel=RUN)
]
DtypeOpt = Annotated[
    Dtype | None,
    typer.Option(
        help="Default fp16 on CUDA, fp32 on CPU (CPUs run fp16 matmuls hundreds of times slower).",
        rich_help_panel=RUN,
        case_sensitive=False,
    ),
]
RepeatsOpt = Annotated[
    int,
    typer.Option(
        help="Minimum timed repeats of each step (more if --min-time is not reached).",
        rich_help_panel=RUN,
    ),
]
MinTimeOpt = Annotated[
    float, typer.Option(help="Minimum seconds of timed repeats per step.", rich_help_panel=RUN)
]
CudaGraphsOpt = Annotated[
    bool,
    typer.Option(
        "--cuda-graphs/--no-cuda-graphs",
        help="Replay decode steps from CUDA graphs: launch overhead must not hide the GPU work.",
        rich_help_panel=RUN,
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        help="Folder for the CSV, plots and metadata. Default: results/<UTC time>-<command>/.",
        rich_help_panel=RUN,
    ),
]
ForceOpt = Annotated[
    bool, typer.Option(help="Allow writing into a non-empty --out folder.", rich_help_panel=RUN)
]
CeilingsOpt = Annotated[
    Path | None,
    typer.Option(
        "--ceilings",
        help="A probe.csv (from `benchbatch probe` or `reproduce`) to place rows on the "
        "roofline, instead of measuring the device's ceilings first.",
        rich_help_panel=RUN,
    ),
]
RooflineOpt = Annotated[
    bool,
    typer.Option(
        "--roofline/--no-roofline",
        help="Measure the device's matmul and memory ceilings first (seconds) and add mfu, "
        "mbu and bound to every row, with roofline.png.",
        rich_help_panel=RUN,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document with every row at the end (for scripts).",
        rich_help_panel=RUN,
    ),
]


def parse_int_list(text: str, option: str) -> list[int]:
    """'512,2048' -> [512, 2048]: positive integers, duplicates dropped, sorted."""
    values = set()
    for item in text.split(","):
        item = item.strip()
        try:
            value = int(item)
        except ValueError:
            raise UserError(
                option,
                f"{text!r} is not a comma-separated list of integers ({item!r} is not an integer)",
            ) from None
        if value <= 0:
            raise UserError(option, f"every value must be positive, got {value}")
        values.add(value)
    return sorted(values)


def build_config(
    preset: str | None, config: Path | None, default: str = "article", **overrides
) -> configs.ModelConfig:
    """A preset or a config.json (not both), then any explicit --hidden, --layers, ..."""
    if preset is not None and config is not None:
        raise UserError("--config", "give either --preset or --config, not both")
    base = configs.from_hf_config(config) if config else configs.preset(preset or default)
    changes = {k: v for k, v in overrides.items() if v is not None}
    return base.replace(**changes) if changes else base


def resolve_target(device_spec: str, dtype: Dtype | None) -> device.Target:
    return device.resolve(device_spec, dtype.value if dtype else None)


def timing_options(repeats: int, min_time: float) -> TimingOptions:
    if repeats <= 0:
        raise UserError("--repeats", "must be a positive integer")
    if min_time < 0:
        raise UserError("--min-time", "must be zero or more seconds")
    return TimingOptions(min_repeats=repeats, min_time_s=min_time)


def load_ceilings(path: Path | None, target: device.Target) -> Ceilings | None:
    """Ceilings from a probe.csv given with --ceilings, checked against this run's dtype."""
    if path is None:
        return None
    ceilings = ceilings_from_csv(path, option="--ceilings")
    if ceilings.dtype != target.dtype_name:
        raise UserError(
            "--ceilings",
            f"{path} was measured in {ceilings.dtype}, this run is {target.dtype_name}",
        )
    return ceilings


def device_ceilings(given: Ceilings | None, enabled: bool, run: Run, target) -> Ceilings | None:
    """The ceilings this run's rows are placed against: given, or measured now (probe.csv)."""
    ceilings = given
    if ceilings is None and enabled:
        with progress() as bar:
            bar.add_task("measuring the device's ceilings", total=None)
            rows, ceilings = measure_ceilings(target.device, target.dtype_name)
        run.put("probe", rows)
    if ceilings is not None:
        run.meta["ceilings"] = ceilings.to_dict()
    return ceilings


def roofline_plot(rows, source: str, ceilings: Ceilings, target, folder: Path, title: str):
    """roofline.png: the rows against the measured roof (and the datasheet's, if known)."""
    name = device.device_name(target.device)
    sheet = peaks.lookup(name) if target.device.type == "cuda" else None
    tagged = [{**r, "source": source} for r in rows]
    roofline_figure(tagged, ceilings, folder / "roofline.png", sheet, title)


def start_run(folder: Path, command: str, target: device.Target, cfg, options: dict) -> Run:
    """Open the run's metadata; every input has been checked by now, so notices go out."""
    if target.notice:
        err_console.print(f"[yellow]note:[/] {target.notice}")
    meta = {
        "config": cfg.to_dict() if cfg is not None else None,
        "options": {k: (str(v) if isinstance(v, Path | Enum) else v) for k, v in options.items()},
        "environment": environment(target),
        "telemetry_before": telemetry.snapshot(target.device),
    }
    return Run(folder, command, meta)


@contextlib.contextmanager
def recording(run: Run, target: device.Target):
    """Finish the run's metadata however the body ends; Ctrl-C or SIGTERM exits 130."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield run
    except KeyboardInterrupt:
        run.finish("interrupted", telemetry_after=telemetry.snapshot(target.device))
        err_console.print(f"[yellow]interrupted[/]: rows measured so far are in {run.folder}")
        raise typer.Exit(130) from None
    except BaseException as e:
        if not isinstance(e, typer.Exit):
            run.finish("failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if run.meta["status"] == "running":
        run.finish("complete", telemetry_after=telemetry.snapshot(target.device))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def progress(quiet: bool = False) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet,
    )


def print_json(document: dict) -> None:
    out_console.out(json.dumps(json_safe(document), indent=2), highlight=False)
