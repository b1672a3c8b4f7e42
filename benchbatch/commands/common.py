"""What every command shares: option types, list parsing, the model it builds, and the
recording of a run (progress, interrupts, metadata), so each command stays a few lines.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import threading
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchbatch import accounting, device, peaks, results, telemetry
from benchbatch import config as configs
from benchbatch.errors import UserError
from benchbatch.plots.roofline import roofline_figure
from benchbatch.probes.ceilings import measure_ceilings
from benchbatch.roofline import Ceilings, ceilings_from_csv
from benchbatch.run import Run, environment
from benchbatch.timing import DEFAULT_CV_THRESHOLD, TimingOptions

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
    int,
    typer.Option(help="Seed of the random weights and inputs.", rich_help_panel=MODEL, min=0),
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
        help="Folder for the CSV, plots and metadata. "
        "Default: a new results/TIME-COMMAND folder (UTC).",
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


LIST_MAX = 2**31 - 1  # a batch, a length or a matrix size: far beyond any memory already


def parse_int_list(text: str, option: str, maximum: int = LIST_MAX) -> list[int]:
    """'512,2048' -> [512, 2048]: positive integers, duplicates dropped, sorted."""
    values = set()
    for item in text.split(","):
        item = item.strip()
        value = _int_or_none(item)
        if value is None:
            raise UserError(
                option,
                f"{_short(text)!r} is not a comma-separated list of integers "
                f"({_short(item, 20)!r} is not an integer)",
            )
        if value <= 0:
            raise UserError(option, f"every value must be positive, got {_short(item)}")
        if value > maximum:
            raise UserError(option, f"{_short(item)} is too large (at most {maximum:,})")
        values.add(value)
    return sorted(values)


def _int_or_none(item: str) -> int | None:
    """Plain decimal digits with an optional sign: no '1_000', no '١٢' (int() takes both)."""
    digits = item[1:] if item[:1] in "+-" else item
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 4000:
        return None
    return int(item)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# Every integer option ends in Python ints, torch sizes or numpy seeds: 64 bits at most.
INT_MAX = 2**63 - 1


def check_numbers(values: dict, options: dict[str, str]) -> None:
    """No command takes NaN, infinity or an integer past 64 bits: a UserError naming the
    option. values: a command's parsed parameters; options: their names on the command line."""
    for name, value in values.items():
        option = options.get(name, f"--{name.replace('_', '-')}")
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(option, f"must be a finite number, got {value}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX:
            raise UserError(option, f"{_short(str(value))} is too large (at most {INT_MAX:,})")


def build_config(
    preset: str | None, config: Path | None, default: str = "article", **overrides
) -> configs.ModelConfig:
    """A preset or a config.json (not both), then any explicit --hidden, --layers, ..."""
    if preset is not None and config is not None:
        raise UserError("--config", "give either --preset or --config, not both")
    base = configs.from_hf_config(config) if config else configs.preset(preset or default)
    changes = {k: v for k, v in overrides.items() if v is not None}
    return base.replace(**changes) if changes else base


def model_option(preset: str | None, config: Path | None, overrides: dict) -> str:
    """The option(s) that made the model's shape, for errors about its size."""
    given = [f"--{k.replace('_', '-')}" for k, v in overrides.items() if v is not None]
    return ", ".join(given) or ("--config" if config is not None else "--preset")


def check_model_fits(cfg: configs.ModelConfig, target: device.Target, option: str) -> None:
    """Refuse, before building it, a model whose weights (and rotary tables, built in
    float64) exceed the memory free on the device: the allocator would crash or swap."""
    need = accounting.weight_bytes(cfg, target.dtype_name) + 16 * cfg.max_context * cfg.head_dim
    free = device.free_memory_bytes(target.device)
    if need > free:
        where = "free on the GPU" if target.device.type == "cuda" else "of available RAM"
        raise UserError(
            option,
            f"the model ({cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, max context "
            f"{cfg.max_context:,}) needs {need / 2**30:,.1f} GiB, more than the "
            f"{free / 2**30:,.1f} GiB {where}",
        )


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
    """Finish the run's metadata however the body ends. Ctrl-C or SIGTERM exits 130 with
    every measured row on disk, metadata.json saying 'interrupted' and no temporary file
    left; a second Ctrl-C cannot cut these last writes short."""
    with interrupts_raise():
        try:
            yield run
            with signals_held():
                run.finish("complete", telemetry_after=telemetry.snapshot(target.device))
        except KeyboardInterrupt:
            with signals_held():
                run.flush()
                run.finish("interrupted", telemetry_after=telemetry.snapshot(target.device))
                results.remove_temporaries(run.folder)
            err_console.print(f"[yellow]interrupted[/]: rows measured so far are in {run.folder}")
            raise typer.Exit(130) from None
        except BaseException as e:
            if not isinstance(e, typer.Exit):
                with signals_held():
                    run.finish("failed", error=f"{type(e).__name__}: {e}")
                    results.remove_temporaries(run.folder)
            raise


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interrupts_raise():
    """SIGTERM (a scheduler's kill, `timeout`) raises KeyboardInterrupt, as Ctrl-C does."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def signals_held():
    """Ignore Ctrl-C and SIGTERM for a few milliseconds of writing that must finish."""
    if not _in_main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def throttle_watch(target: device.Target) -> telemetry.ThrottleWatch:
    """Flags rows measured while the GPU slowed its clocks; on a CPU it never does."""
    return telemetry.ThrottleWatch(target.device)


def untrusted(rows: list[dict], name) -> dict[str, list[str]]:
    """Rows whose times are hard to trust, by name(row): noisy (CV over the threshold) and
    throttled (the GPU slowed its clocks meanwhile)."""
    return {flag: [name(r) for r in rows if r.get(flag) is True] for flag in ("noisy", "throttled")}


def warn_untrusted(flagged: dict[str, list[str]]) -> None:
    """Say which rows are noisy or throttled, and what to try."""
    if flagged.get("noisy"):
        err_console.print(
            f"[yellow]warning:[/] noisy (CV over {DEFAULT_CV_THRESHOLD:.0%}): "
            f"{', '.join(flagged['noisy'])}; something else may be using the device: "
            "try more --repeats or --min-time."
        )
    if flagged.get("throttled"):
        err_console.print(
            "[yellow]warning:[/] the GPU slowed its clocks (thermal or power limit) during: "
            f"{', '.join(flagged['throttled'])}; those times are pessimistic: let it cool or "
            "check its power limit (nvidia-smi -q -d PERFORMANCE) and rerun, with more "
            "--repeats or --min-time."
        )


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
    out_console.out(json.dumps(results.json_safe(document), indent=2), highlight=False)
