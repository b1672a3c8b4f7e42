"""The device's own ceilings in one dtype: matmul FLOP/s and memory bandwidth, measured.

A datasheet says what the vendor promises; mfu and mbu should say how close a step comes
to what this device, this torch build and this dtype actually reach. Three kinds of probe:

- matmul: square n x n products on random data (zeros run faster on some GPUs), a few
  sizes, the best median taken: 2 n^3 FLOPs; bytes are the least traffic (A, B read,
  C written), so a matmul row's intensity is where it sits on the roofline. Where the
  engine may run its projections packed (a CPU with oneDNN's prepacked linear for the
  dtype: runtime/layout.py), each size is timed that way too ("matmul n packed"): oneDNN
  ran 1.1x MKL's fp32 products on the 2-core AMD EPYC CPU, and a ceiling under the
  engine's own kernel would put its steps past 100% MFU;
- copy: one buffer into another, bytes read plus bytes written counted (on a CPU the
  write-allocate read of the destination is real traffic but not counted, as in STREAM);
- read: a sum over one buffer, bytes read counted: the pattern of a weight read in decode.

Buffers are far larger than the last-level cache (about 256 MB on a CPU, 1 GiB on a GPU),
so the memory rows time DRAM/HBM and not a cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from benchbatch.core.config import DTYPE_BYTES
from benchbatch.core.probe_options import ProbeOptions as Options
from benchbatch.core.roofline import Ceilings, ceilings_from_rows
from benchbatch.core.units import significant
from benchbatch.errors import UserError
from benchbatch.runtime import device as devices
from benchbatch.runtime import timing
from benchbatch.runtime.timing import Measurement, TimingOptions, measure

__all__ = ["Options", "plan", "plan_for", "run", "ceilings"]

MiB = 2**20
# What the probe measures, in the ceilings cache's key: a cached probe of another revision
# is measured again (2: the packed matmuls, 2026-12-07).
PROBE_REVISION = 2

# Sized to finish in seconds on a 2-core CPU (a 4096 fp32 product takes ~0.8 s there)
# and to reach the tensor-core plateau on a GPU.
MATMUL_SIZES = {"cpu": (1024, 2048), "cuda": (2048, 4096, 8192)}
BUFFER_BYTES = {"cpu": 256 * MiB, "cuda": 1024 * MiB}


@dataclass(frozen=True)
class Probe:
    kind: str  # "matmul", "copy" or "read"
    size: int  # matrix side n (matmul) or buffer bytes (copy, read)
    packed: bool = False  # a matmul through oneDNN's prepacked linear (layout.PACKED's)

    @property
    def label(self) -> str:
        if self.kind == "matmul":
            return f"matmul {self.size}" + (" packed" if self.packed else "")
        return f"{self.kind} {significant(self.size / MiB, 4)} MiB"


def plan(matmul_sizes: list[int] | tuple[int, ...], buffer_bytes: int,
         packed: bool = False) -> list[Probe]:  # fmt: skip
    """Every matmul size (each packed too, if `packed`), then a copy and a read of one
    buffer size."""
    assert matmul_sizes and all(n > 0 for n in matmul_sizes) and buffer_bytes > 0
    kinds = (False, True) if packed else (False,)
    return [Probe("matmul", n, p) for n in sorted(set(matmul_sizes)) for p in kinds] + [
        Probe("copy", buffer_bytes),
        Probe("read", buffer_bytes),
    ]


def packs(dev: torch.device, dtype: str | None) -> bool:
    """Whether the engine may run this device's projections packed (layout.packable)."""
    from benchbatch.runtime import layout

    return dtype is not None and layout.packable(dev, devices.DTYPES[dtype])


def default_plan(dev: torch.device, dtype: str | None = None) -> list[Probe]:
    """The default sizes of this kind of device (a CPU's for `dtype`: cpu_sizes); a copy
    needs two buffers, so at most a quarter of the free memory each."""
    kind = "cuda" if dev.type == "cuda" else "cpu"
    free = devices.free_memory_bytes(dev)
    buffer = min(BUFFER_BYTES[kind], max(free // 4, MiB) // MiB * MiB)
    sizes = MATMUL_SIZES[kind] if kind == "cuda" else cpu_sizes(dev, dtype)
    return plan(sizes, buffer, packs(dev, dtype or "fp32"))


# A CPU's products in a dtype it may run hundreds of times slower than fp32 (no fp16 units:
# about 0.4 GFLOP/s against 165 on the 2-core VMs, a 2048 product 43 s a call and the probe
# minutes): each default size halved until one call takes at most MAX_CALL_S, priced from
# one SMALLEST product timed first (n^3).
MAX_CALL_S = 0.5
SMALLEST = 256


def cpu_sizes(dev: torch.device, dtype: str | None) -> tuple[int, ...]:
    if dtype in (None, "fp32"):
        return MATMUL_SIZES["cpu"]
    a = torch.randn(SMALLEST, SMALLEST, device=dev).to(devices.DTYPES[dtype])
    quick = TimingOptions(min_repeats=1, min_time_s=0.0, warmup=1, warmup_s=0.0, l2_flush=False)
    call_s = measure(lambda: a @ a, dev, quick).min_ms / 1e3
    sizes = []
    for n in MATMUL_SIZES["cpu"]:
        while n > SMALLEST and call_s * (n / SMALLEST) ** 3 > MAX_CALL_S:
            n //= 2
        sizes.append(n)
    return tuple(sorted(set(sizes)))


def plan_for(target, opts: Options) -> list[Probe]:
    """The probes of a run: the given sizes, else this kind of device's; refused when no
    memory holds them (an n x n matmul keeps three matrices, a copy two buffers)."""
    default = default_plan(target.device, target.dtype_name)
    matmuls = opts.sizes or [p.size for p in default if p.kind == "matmul"]
    buffer = opts.buffer_mb * MiB if opts.buffer_mb is not None else default[-1].size
    free = devices.free_memory_bytes(target.device)
    elem = DTYPE_BYTES[target.dtype_name]
    n = max(matmuls)
    if 3 * n**2 * elem > free:
        raise UserError(
            "sizes",
            f"a {n:,} x {n:,} matmul needs {3 * n**2 * elem / 2**30:,.1f} GiB, more than the "
            f"{free / 2**30:,.1f} GiB free",
        )
    if 2 * buffer > free:
        raise UserError(
            "buffer_mb",
            f"two buffers of {buffer / MiB:,.0f} MiB exceed the {free / MiB:,.0f} MiB free",
        )
    return plan(matmuls, buffer, packs(target.device, target.dtype_name))


def ceilings(rows: list[dict], option: str = "sizes") -> Ceilings:
    """The ceilings the rows give; a UserError when no matmul or memory row was measured."""
    try:
        return ceilings_from_rows(rows)
    except ValueError as e:
        raise UserError(option, f"no ceiling could be measured: {e}") from None


def cost(probe: Probe, dtype: str) -> tuple[int, int]:
    """(FLOPs, bytes) one call of the probe does and moves."""
    elem = torch.empty((), dtype=devices.DTYPES[dtype]).element_size()
    if probe.kind == "matmul":
        n = probe.size
        return 2 * n**3, 3 * n * n * elem
    numel = probe.size // elem
    if probe.kind == "copy":
        return 0, 2 * numel * elem
    return numel, numel * elem  # read: one add per element


def work(probe: Probe, dev: torch.device, dtype: str, seed: int = 0):
    """The call to time, on random operands allocated (and kept alive) once."""
    dt = devices.DTYPES[dtype]
    gen = torch.Generator(device=dev).manual_seed(seed)
    if probe.kind == "matmul":
        n = probe.size
        a, b = (torch.randn(n, n, device=dev, dtype=dt, generator=gen) for _ in range(2))
        if probe.packed:  # a @ b as the engine's packed projections run it: b is W.t()
            from benchbatch.runtime import layout

            w = layout.pack(b.t())
            return lambda: layout.packed_linear(a, w, None)
        c = torch.empty(n, n, device=dev, dtype=dt)
        return lambda: torch.matmul(a, b, out=c)
    numel = probe.size // torch.empty((), dtype=dt).element_size()
    src = _random_buffer(numel, dev, dt, gen)
    if probe.kind == "copy":
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    assert probe.kind == "read", probe.kind
    return lambda: src.sum()


def _random_buffer(numel: int, dev, dt, gen, block: int = 2**20) -> torch.Tensor:
    """Random values, not zeros (GPUs compress zeros), tiled from one random block: drawing
    hundreds of millions of normals costs seconds on a CPU, a tiled copy a few ms."""
    tile = torch.randn(min(numel, block), device=dev, dtype=dt, generator=gen)
    reps = -(-numel // tile.numel())
    return tile.repeat(reps)[:numel].contiguous()


def time_probe(probe: Probe, dev: torch.device, dtype: str, opts: TimingOptions) -> Measurement:
    timing.prepare(dev, opts)  # the L2-flush buffer first: it must not be what runs out
    with torch.inference_mode():
        return measure(work(probe, dev, dtype), dev, opts)


def probe_row(probe: Probe, dtype: str, m: Measurement | None, status: str = "ok") -> dict:
    """One row: time, counted work and the rates it implies (median time)."""
    flops, nbytes = cost(probe, dtype)
    stats = m.summary() if m is not None else timing.unmeasured()
    seconds = stats.pop("step_ms") / 1e3
    return {
        "kind": probe.kind,
        "label": probe.label,
        "size": probe.size,
        "dtype": dtype,
        "step_ms": seconds * 1e3,
        "tflops": flops / seconds / 1e12,
        "gbps": nbytes / seconds / 1e9,
        "flops": flops,
        "bytes": nbytes,
        "arithmetic_intensity": flops / nbytes,
        **stats,
        "status": status,
    }


def run(probes: list[Probe], dev: torch.device, dtype: str, opts: TimingOptions) -> Iterator[dict]:
    """One row per probe, yielded as soon as it is measured; out of memory is a row."""
    for probe in probes:
        timed = lambda p=probe: time_probe(p, dev, dtype, opts)  # noqa: E731
        m, status = devices.measured_or_oom(timed, dev)
        yield probe_row(probe, dtype, m, status)


def measure_ceilings(
    dev: torch.device,
    dtype: str,
    opts: TimingOptions | None = None,
    probes: list[Probe] | None = None,
) -> tuple[list[dict], Ceilings]:
    """All the probes at once: their rows and the ceilings taken from them."""
    rows = list(run(probes or default_plan(dev, dtype), dev, dtype, opts or TimingOptions()))
    return rows, ceilings_from_rows(rows)


def complete(probes: list[Probe], rows: list[dict]) -> bool:
    """Was every probe of the plan measured, each into its own row? A probe cut short (an
    interrupt, a signal that ended the generator early) is not: it is no probe to keep."""
    return sorted(p.label for p in probes) == sorted(str(r.get("label")) for r in rows)
