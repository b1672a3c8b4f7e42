"""The ceiling probe's options as data (the `probe` command's; `reproduce` takes them too,
and runtime/ceilings.py measures with them). No typer and no torch here (see
core/options.py)."""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.optkit import check_count, opt

PROBE = "Device ceilings"


@dataclass(frozen=True)
class ProbeOptions:
    sizes: tuple[int, ...] | None = opt(
        None,
        "Square matmul sizes n of the ceiling probe, comma-separated. Default: 1024,2048 on a "
        "CPU, 2048,4096,8192 on CUDA.",
        panel=PROBE,
        parse="ints",
        aliases=("--probe-sizes",),
    )
    buffer_mb: int | None = opt(
        None,
        "MiB of each copy/read buffer of the ceiling probe; keep it far above the last-level "
        "cache. Default: 256 on a CPU, 1024 on CUDA.",
        panel=PROBE,
        aliases=("--probe-buffer-mb",),
    )

    def __post_init__(self) -> None:
        if self.buffer_mb is not None:
            check_count("buffer_mb", self.buffer_mb, 1, 2**40)
