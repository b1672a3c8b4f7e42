"""The project experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.optkit import MOST_GIB, check_number, opt, require
from benchbatch.errors import UserError
from benchbatch.experiments.fields import (
    context_field,
    decode_batch_field,
)

PROJECTION = "Machine"
# The slowest link --nvlink-gbps and --busbw take: a kilobyte a second. Slower, an
# all-reduce of a few megabytes takes longer than a float holds (1e-320 GB/s: infinite).
MIN_LINK_GBPS = 1e-6
MAX_LINK_GBPS = 1e6  # a petabyte a second: a thousand times NVLink 5


# A probe.csv whose ceilings are under this share of --gpu's datasheet was measured on
# something else (a GPU's probe reaches 60-90% of its datasheet; a CPU's a thousandth).
FOREIGN_SHARE = 0.05
DEFAULT_LATENCY_US = 20.0  # per all-reduce: what gpt-fast's A100 numbers imply (16-26 us)


@dataclass(frozen=True)
class ProjectOptions:
    gpu: str = opt(
        "H100 SXM",
        "The GPU to project for, by datasheet name (H200, H100 SXM, H100 NVL, A100 80GB SXM, "
        "L40S, ...; an unknown name is refused with the list).",
        panel=PROJECTION,
    )
    tp: tuple[int, ...] = opt(
        (1, 2, 4, 8), "Tensor-parallel GPU counts, comma-separated.", parse="ints",
        panel=PROJECTION,
    )  # fmt: skip
    decode_batch: tuple[int, ...] = decode_batch_field()
    context: tuple[int, ...] = context_field()
    dtype: str = opt("bf16", "Weights and KV cache dtype.", choices=("fp16", "bf16", "fp32"))
    nvlink_gbps: float | None = opt(
        None,
        "GPU-to-GPU bandwidth per GPU, both directions together, GB/s; default the --gpu's "
        "datasheet NVLink (900 on H100/H200 SXM, 600 on A100 SXM). The all-reduce's bus "
        "bandwidth is taken as half of it (one direction).",
        panel=PROJECTION,
    )
    busbw: float | None = opt(
        None,
        "All-reduce bus bandwidth in GB/s as nccl-tests (or `torchrun ... benchbatch probe`) "
        "measure it, instead of half of --nvlink-gbps.",
        panel=PROJECTION,
    )
    # Held in microseconds; typed as every latency option (20us, 0.02ms, or a bare number of
    # milliseconds), the old --allreduce-latency-us (a bare number of microseconds) hidden.
    allreduce_latency_us: float | None = opt(
        None,
        f"Fixed cost of one all-reduce, default {DEFAULT_LATENCY_US:g}us: 20us, 0.05ms, or a "
        f"bare number of milliseconds ({DEFAULT_LATENCY_US:g}us is what gpt-fast's published "
        "A100 tokens/s at 2-8 GPUs imply; a --ceilings probe.csv from torchrun gives a "
        "measured one).",
        panel=PROJECTION,
        flag="--allreduce-latency",
        parse="time_us0",
        aliases=("--allreduce-latency-us:us",),
    )
    efficiency: float = opt(
        1.0,
        "Fraction of the roofline a decode step reaches (1: the roof itself; gpt-fast's "
        "Llama-2-7B at batch 1 on an A100 reached about 0.69 of its memory bandwidth).",
        panel=PROJECTION,
    )
    ceilings: Path | None = opt(
        None,
        "A probe.csv measured on the GPU in question: its matmul and memory ceilings (and, "
        "measured under torchrun, its all-reduce) replace the datasheet's.",
        panel=PROJECTION,
    )
    memory_gib: float | None = opt(
        None, "Memory per GPU in GiB (default: the datasheet's).", panel=PROJECTION
    )

    def __post_init__(self) -> None:
        check_number("efficiency", self.efficiency, 0, open_low=True)
        require(self.efficiency <= 1, "efficiency", f"must be at most 1, got {self.efficiency}")
        for name in ("nvlink_gbps", "busbw", "memory_gib"):
            if getattr(self, name) is not None:
                gib = name == "memory_gib"  # a byte count of it must stay finite
                most, unit = (MOST_GIB, " GiB") if gib else (MAX_LINK_GBPS, " GB/s")
                check_number(name, getattr(self, name), 0, open_low=True, most=most, unit=unit)
                if not gib:  # a link slower than this prices an all-reduce past a float's range
                    require(getattr(self, name) >= MIN_LINK_GBPS, name,
                            f"{getattr(self, name):g} GB/s is slower than any link worth "
                            f"projecting (at least {MIN_LINK_GBPS:g} GB/s, a kilobyte a "
                            "second)")  # fmt: skip
        if self.allreduce_latency_us is not None:  # at most a second: 1e6 us
            check_number("allreduce_latency_us", self.allreduce_latency_us, most=1e6,
                         unit=" us")  # fmt: skip
        require(max(self.tp) <= 4096, "tp", f"at most 4,096 GPUs, got {max(self.tp):,}")

    def machine(self):
        """The GPU and its link as the projection prices them, each number's source kept."""
        from benchbatch.core import peaks
        from benchbatch.core.projection import Machine

        peak = peaks.lookup(self.gpu)
        if peak is None:
            known = ", ".join(dict.fromkeys(p.name for _, p in peaks.KNOWN))
            raise UserError("gpu", f"unknown GPU {self.gpu!r} (known: {known})")
        require(self.dtype in peak.tflops, "dtype", f"{peak.name} has no {self.dtype} rate")
        sheet = f"datasheet {peak.name}"
        tflops, gbps = peak.tflops[self.dtype], peak.gbps
        sources = {"tflops": sheet, "gbps": sheet}
        link = None
        if self.ceilings is not None:
            tflops, gbps, link = self._measured(sources)
        busbw, latency = self._link(peak, link, sources)
        memory = self.memory_gib or peak.memory_gib
        sources["memory"] = "given" if self.memory_gib else sheet
        return Machine(peak.name, tflops, gbps, memory * 2**30 if memory else None, busbw,
                       latency, self.efficiency, tuple(sources.items()))  # fmt: skip

    def _measured(self, sources: dict):
        from benchbatch.core.projection import interconnect_from_csv
        from benchbatch.core.roofline import ceilings_from_csv

        c = ceilings_from_csv(self.ceilings, option="ceilings")
        require(
            c.dtype == self.dtype,
            "ceilings",
            f"{self.ceilings} was measured in {c.dtype}, the projection is {self.dtype}",
        )
        sources["tflops"] = f"measured ({self.ceilings}: {c.tflops_source})"
        sources["gbps"] = f"measured ({self.ceilings}: {c.gbps_source})"
        return c.peak_tflops, c.peak_gbps, interconnect_from_csv(self.ceilings)

    def foreign_ceilings(self) -> str | None:
        """What says --ceilings' probe.csv was not measured on --gpu: rows timed on a CPU's
        clock, or ceilings under FOREIGN_SHARE of the datasheet's (a laptop's probe.csv
        priced as an H100's). None when nothing does, or without --ceilings."""
        import csv

        from benchbatch.core import peaks
        from benchbatch.core.roofline import ceilings_from_csv

        if self.ceilings is None:
            return None
        peak = peaks.lookup(self.gpu)
        c = ceilings_from_csv(self.ceilings, option="ceilings")
        with open(self.ceilings, newline="") as f:
            cpu = any(r.get("clock") == "cpu" for r in csv.DictReader(f))
        shares = (c.peak_tflops / peak.tflops[self.dtype], c.peak_gbps / peak.gbps)
        if not cpu and min(shares) >= FOREIGN_SHARE:
            return None
        how = "timed on a CPU's clock" if cpu else (
            f"at {shares[0]:.1%} of its datasheet {self.dtype} TFLOP/s and {shares[1]:.1%} of "
            "its GB/s")
        return (f"--ceilings {self.ceilings} was {how}: the projection prices {peak.name}s at "
                "another device's ceilings; pass a probe.csv measured on that GPU")

    def _link(self, peak, link, sources: dict) -> tuple[float, float]:
        """Bus bandwidth and latency: given, measured (probe.csv), or the datasheet's."""
        latency = self.allreduce_latency_us
        sources["latency"] = "given"
        if latency is None and link is not None:
            latency, sources["latency"] = link.latency_us, link.source
        if latency is None:
            latency, sources["latency"] = DEFAULT_LATENCY_US, "assumed (gpt-fast's A100s)"
        if self.busbw is not None:
            sources["busbw"] = "given"
            return self.busbw, latency
        if link is not None:
            sources["busbw"] = link.source
            return link.busbw_gbps, latency
        nvlink = self.nvlink_gbps or peak.nvlink_gbps
        if nvlink is None:
            raise UserError(
                "nvlink_gbps",
                f"{peak.name} has no NVLink figure in benchbatch's table (PCIe?); give "
                "--nvlink-gbps or --busbw",
            )
        where = "given" if self.nvlink_gbps else f"datasheet {peak.name}"
        sources["busbw"] = f"half of {nvlink:g} GB/s NVLink per GPU, both ways ({where})"
        return nvlink / 2, latency
