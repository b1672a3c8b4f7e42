"""Datasheet peaks of common GPUs: dense matmul TFLOP/s per dtype and memory GB/s.

Used for the roofline's predicted ridge point until the device's own ceilings are
measured. An unknown device gets None, never a guess. fp16/bf16 figures are dense tensor
core rates with fp32 accumulation (what torch uses); fp32 is the non-tensor rate, since
torch does not use TF32 for fp32 matmuls by default. memory_gib is the datasheet memory
(NVIDIA's "80 GB" is 80 GiB of HBM, less what the driver keeps); None where one name covers
cards of different sizes (V100: 16 or 32 GB).

For `benchbatch project` (machines nobody here has): where a GPU has one, its NVLink
bandwidth per GPU, both directions together as datasheets give it (NVLink 4 on H100/H200
SXM: 900 GB/s; NVLink 3 on A100 SXM: 600 GB/s); None where the GPUs talk over PCIe or the
figure is not known (the projection then asks for it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    name: str
    tflops: dict[str, float]  # by dtype name
    gbps: float
    memory_gib: float | None = None
    nvlink_gbps: float | None = None  # per GPU, both directions together (datasheet)

    def ridge(self, dtype: str) -> float | None:
        """FLOP per byte where the roofline turns from memory- to compute-bound."""
        t = self.tflops.get(dtype)
        return None if t is None else t * 1e12 / (self.gbps * 1e9)


def _p(name, fp16, bf16, fp32, gbps, memory_gib=None, nvlink_gbps=None) -> Peak:
    rates = {"fp16": fp16, "bf16": bf16, "fp32": fp32}
    rates = {k: v for k, v in rates.items() if v is not None}
    return Peak(name, rates, gbps, memory_gib, nvlink_gbps)


# Matched in order against the whole device name (see lookup): more specific names first.
KNOWN: list[tuple[str, Peak]] = [
    ("h200", _p("H200 SXM", 989, 989, 67, 4800, 141, 900)),
    ("h200 nvl", _p("H200 NVL", 835, 835, 60, 4800, 141, 900)),
    ("h100 nvl", _p("H100 NVL", 835, 835, 60, 3900, 94, 600)),
    ("h100 pcie", _p("H100 PCIe", 756, 756, 51, 2000, 80)),
    ("h100", _p("H100 SXM", 989, 989, 67, 3350, 80, 900)),
    ("a100-sxm4-40gb", _p("A100 40GB", 312, 312, 19.5, 1555, 40, 600)),
    ("a100-pcie-40gb", _p("A100 40GB PCIe", 312, 312, 19.5, 1555, 40)),
    ("a100 80gb pcie", _p("A100 80GB PCIe", 312, 312, 19.5, 1935, 80)),
    ("a100", _p("A100 80GB SXM", 312, 312, 19.5, 2039, 80, 600)),
    ("l40s", _p("L40S", 362, 362, 91.6, 864, 48)),
    ("l40", _p("L40", 181, 181, 90.5, 864, 48)),
    ("l4", _p("L4", 121, 121, 30.3, 300, 24)),
    ("a10g", _p("A10G", 70, 70, 31.2, 600, 24)),
    ("a10", _p("A10", 125, 125, 31.2, 600, 24)),
    ("rtx 5080", _p("RTX 5080", 113, 113, 56.3, 960, 16)),
    ("rtx 4090", _p("RTX 4090", 165, 165, 82.6, 1008, 24)),
    ("rtx 3090", _p("RTX 3090", 71, 71, 35.6, 936, 24)),
    ("v100", _p("V100", 125, None, 15.7, 900)),
    ("t4", _p("T4", 65, None, 8.1, 320, 16)),
]


def names() -> list[str]:
    """The names lookup() knows, as a user may type them."""
    return [key for key, _ in KNOWN]


# Words of a device name that do not change what the card is: the vendor and brand, the
# SXM form factor, the HBM generation, a memory size the entry itself does not name.
_NEUTRAL = {"nvidia", "tesla", "geforce", "sxm", "sxm2", "sxm4", "sxm5"}
_NEUTRAL |= {"hbm2", "hbm2e", "hbm3", "hbm3e"}


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", name.lower()) if w}


def _neutral(word: str) -> bool:
    return word in _NEUTRAL or re.fullmatch(r"\d+gb", word) is not None


def lookup(device_name: str) -> Peak | None:
    """The entry whose words are all in the name, with nothing else in the name but neutral
    words: "NVIDIA H200 NVL" is not an H200 SXM (its clocks and power differ), "GH200" is
    not an H200, and a name with a word no entry accounts for is unknown, never a guess."""
    words = _words(device_name)
    for key, peak in KNOWN:
        mine = _words(key)
        if mine <= words and all(_neutral(w) for w in words - mine):
            return peak
    return None
