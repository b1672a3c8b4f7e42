"""The roofline: where a measured step sits against the device's own ceilings. No torch.

A step that does F FLOPs and moves B bytes has arithmetic intensity F/B. Below the ridge
point (peak FLOP/s over peak bytes/s) it cannot be faster than its bytes allow
(memory-bound); above it, than its FLOPs allow (compute-bound). The ceilings come from
`benchbatch probe` (measured, probe.csv) or, as a dashed promise, from the datasheet.

Units: TFLOP/s, GB/s (1e9 bytes/s), intensity in FLOP per byte.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchbatch.core.peaks import Peak
from benchbatch.errors import UserError

MATMUL_KINDS = ("matmul",)
MEMORY_KINDS = ("copy", "read")


@dataclass(frozen=True)
class Ceilings:
    """The two roofs in one dtype, and the probe rows (labels) they were taken from."""

    dtype: str
    peak_tflops: float
    peak_gbps: float
    tflops_source: str = "datasheet"
    gbps_source: str = "datasheet"

    @property
    def ridge(self) -> float:
        """FLOP per byte where the roof turns from memory- to compute-bound."""
        return ridge(self.peak_tflops, self.peak_gbps)

    def to_dict(self) -> dict:
        return {**asdict(self), "ridge": self.ridge}


def ridge(peak_tflops: float, peak_gbps: float) -> float:
    return peak_tflops * 1e12 / (peak_gbps * 1e9)


def attainable_tflops(intensity: float, peak_tflops: float, peak_gbps: float) -> float:
    """The roof at one intensity: min(peak FLOP/s, intensity x bandwidth), in TFLOP/s."""
    return min(peak_tflops, intensity * peak_gbps / 1e3)


def roof(intensities: list[float], ceilings: Ceilings) -> list[float]:
    """The roof (TFLOP/s) at each intensity."""
    return [attainable_tflops(x, ceilings.peak_tflops, ceilings.peak_gbps) for x in intensities]


def log_space(lo: float, hi: float, n: int = 200) -> list[float]:
    """n intensities evenly spaced on a log axis, lo and hi included."""
    assert 0 < lo < hi and n >= 2
    step = (math.log10(hi) - math.log10(lo)) / (n - 1)
    return [10 ** (math.log10(lo) + i * step) for i in range(n)]


def bound(intensity: float | None, ridge_point: float) -> str | None:
    """'memory' below the ridge point, 'compute' at or above it; None if unknown."""
    if intensity is None or not math.isfinite(intensity):
        return None
    return "compute" if intensity >= ridge_point else "memory"


def annotate(row: dict, ceilings: Ceilings) -> dict:
    """A copy of a phases/sweep row with mfu, mbu (fractions, not %) and bound added.

    mfu: achieved FLOP/s over the measured matmul peak; mbu: achieved bytes/s over the
    measured bandwidth. A step that was not measured (oom, skipped) keeps NaN for both and
    no bound: nothing placed it under either roof.
    """
    measured = row.get("status", "ok") == "ok"
    intensity = _number(row.get("arithmetic_intensity")) if measured else None
    return {
        **row,
        "mfu": _ratio(row.get("tflops"), ceilings.peak_tflops) if measured else math.nan,
        "mbu": _ratio(row.get("gbps"), ceilings.peak_gbps) if measured else math.nan,
        "bound": bound(intensity, ceilings.ridge),
    }


def raised(ceilings: Ceilings, row: dict) -> Ceilings | None:
    """The ceilings raised to a measured row that beat them, or None when it did not.

    A step cannot run faster than the device can: a row over a roof (an MFU or MBU above
    100%) shows the probe measured that roof low (another process took the device while it
    ran, or its sizes missed the device's best). The roof is then what the row reached, so
    every MFU and MBU stays at or below 100% and says how far a step is from the best seen.
    """
    if row.get("status", "ok") != "ok":
        return None
    label = str(row.get("label", "a step"))
    tflops, gbps = _number(row.get("tflops")), _number(row.get("gbps"))
    changes = {}
    if tflops is not None and math.isfinite(tflops) and tflops > ceilings.peak_tflops:
        changes.update(peak_tflops=tflops, tflops_source=f"{label} (over the probe)")
    if gbps is not None and math.isfinite(gbps) and gbps > ceilings.peak_gbps:
        changes.update(peak_gbps=gbps, gbps_source=f"{label} (over the probe)")
    return replace(ceilings, **changes) if changes else None


def _ratio(value, peak: float) -> float:
    value = _number(value)
    return math.nan if value is None else value / peak


def _number(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def from_datasheet(peak: Peak | None, dtype: str) -> Ceilings | None:
    """The datasheet's ceilings in a dtype, or None when the device or dtype is unknown."""
    if peak is None or dtype not in peak.tflops:
        return None
    return Ceilings(dtype, peak.tflops[dtype], peak.gbps, peak.name, peak.name)


def ceilings_from_rows(rows: list[dict]) -> Ceilings:
    """Best median of the matmul rows and of the copy/read rows the probe measured.

    Raises ValueError when the rows hold no measured matmul or no measured memory row.
    """
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    flops = _best(ok, MATMUL_KINDS, "tflops")
    mem = _best(ok, MEMORY_KINDS, "gbps")
    if flops is None:
        raise ValueError("no measured matmul row (kind matmul with a positive tflops)")
    if mem is None:
        raise ValueError("no measured memory row (kind copy or read with a positive gbps)")
    dtypes = {r.get("dtype") for r in ok} - {None}
    if len(dtypes) > 1:
        raise ValueError(f"rows in several dtypes: {sorted(dtypes)}")
    dtype = dtypes.pop() if dtypes else "unknown"
    return Ceilings(dtype, flops["tflops"], mem["gbps"], flops["label"], mem["label"])


def _best(rows: list[dict], kinds: tuple[str, ...], key: str) -> dict | None:
    candidates = [r for r in rows if r.get("kind") in kinds and _positive(r.get(key))]
    return max(candidates, key=lambda r: r[key], default=None)


def _positive(value) -> bool:
    value = _number(value)
    return value is not None and math.isfinite(value) and value > 0


PROBE_COLUMNS = ("kind", "label", "dtype", "tflops", "gbps", "status")


def ceilings_from_csv(path: Path, option: str = "--probe") -> Ceilings:
    """Read a probe.csv back; a missing or corrupt file, or ceilings no device has, is a
    UserError naming it."""
    from benchbatch.core.inputs import read_text

    path = Path(path)
    if not path.exists():
        raise UserError(option, f"{path} does not exist (run `benchbatch probe` first)")
    text = read_text(path, option)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = [(reader.line_num, r) for r in reader]
    except csv.Error as e:
        raise UserError(option, f"cannot read {path}: {e}") from None
    missing = [c for c in PROBE_COLUMNS if not rows or c not in rows[0][1]]
    if missing:
        what = (f"lacks column(s) {', '.join(missing)}" if rows else
                "is empty" if not text.strip() else "has no rows under a header")  # fmt: skip
        raise UserError(option, f"{path} {what}: not a probe.csv written by benchbatch probe")
    try:
        ceilings = ceilings_from_rows([_parse(r, line) for line, r in rows])
    except ValueError as e:
        raise UserError(option, f"{path} is corrupt: {e}") from None
    for name, value, least in (("tflops", ceilings.peak_tflops, MIN_TFLOPS),
                               ("gbps", ceilings.peak_gbps, MIN_GBPS)):  # fmt: skip
        if value < least:
            raise UserError(option, f"{path}: a {name} ceiling of {value:g} is below {least:g}: "
                            "no device is that slow")  # fmt: skip
    return ceilings


# What a probe.csv may say: beyond any device made (a B200 does about 10 PFLOP/s in fp4 and
# 8 TB/s), or slower than a calculator, a ceiling is a corrupt or hand-edited file.
MAX_TFLOPS, MIN_TFLOPS = 1e5, 1e-6
MAX_GBPS, MIN_GBPS = 1e6, 1e-3


def _parse(row: dict, line: int = 0) -> dict:
    """CSV text to numbers; an empty cell (NaN as pandas writes it) becomes None."""
    out = dict(row)
    for key, most in (("tflops", MAX_TFLOPS), ("gbps", MAX_GBPS)):
        text = (row.get(key) or "").strip()
        if not text or text.lower() == "nan":
            out[key] = None
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"line {line}: {key} {text[:40]!r} is not a number") from None
        if not (math.isfinite(value) and 0 <= value <= most):
            raise ValueError(f"line {line}: {key} {value:g} is not in [0, {most:g}]")
        out[key] = value
    return out
