"""Energy and cost per token: the arithmetic, and the RAPL counters of the Linux kernel.

Energy comes from a cumulative counter read before and after a measured span: NVML's total
energy of an NVIDIA GPU (nvmlDeviceGetTotalEnergyConsumption, millijoules since the driver
loaded, read in runtime/telemetry.py), or on a CPU the kernel's RAPL package counters
(/sys/class/powercap/intel-rapl:N/energy_uj, microjoules, wrapping to 0 after
max_energy_range_uj). Where neither is readable (no NVIDIA GPU, RAPL absent or readable by
root only, as on most machines since 2020) the columns say "not available" and why, never
a silent blank.

A span covers the whole measurement of a group of steps (warm-up included), so a row's
energy is the span's average power times the row's own step time:
joules per token = (energy / seconds) x step seconds / tokens per step. NVML's counter is
updated every few tens of milliseconds and RAPL's every millisecond: a span shorter than a
second reads coarsely (energy_span_s is kept beside it).

Cost: a device rented at `price_per_hour` USD costs price / 3600 per second, so a million
tokens made in `seconds` per `tokens` cost price / 3600 x seconds / tokens x 1e6.

No torch here (tests/test_torch_free.py imports core/ with torch blocked)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.units import figure

NOT_AVAILABLE = "not available"
RAPL_ROOT = Path("/sys/class/powercap")
NAN = float("nan")


@dataclass(frozen=True)
class Reading:
    """What one counter saw over one span: joules (None when no counter) over seconds, and
    where it came from (or "not available: why")."""

    joules: float | None
    seconds: float
    source: str

    @property
    def available(self) -> bool:
        return self.joules is not None

    @property
    def power_w(self) -> float:
        """The span's average power (NaN without a counter or a span)."""
        if self.joules is None or not self.seconds > 0:
            return NAN
        return self.joules / self.seconds


def unavailable(reason: str) -> str:
    """The source text of a device without a counter, said plainly."""
    return f"{NOT_AVAILABLE}: {reason}"


def counter_growth(before: float, after: float, wrap: float | None = None) -> float:
    """How much a cumulative counter grew: after - before, or, when it went past its range
    (after < before) and wraps at `wrap` (RAPL's max_energy_range_uj), the growth through
    the wrap. A counter that went down and does not wrap was reset: an error."""
    if after >= before:
        return after - before
    if wrap is None or wrap <= 0:
        raise ValueError(f"energy counter went down ({before} -> {after}) and has no range")
    return wrap - before + after


def joules_per_token(joules: float | None, tokens: float) -> float:
    if joules is None or not tokens or not math.isfinite(joules):
        return NAN
    return joules / tokens


def cost_per_million_tokens(price_per_hour: float, seconds: float, tokens: float) -> float:
    """USD per million tokens from the device's hourly price, made at `tokens` per
    `seconds` (NaN when nothing was made)."""
    if not tokens or not math.isfinite(seconds) or not math.isfinite(tokens):
        return NAN
    return price_per_hour / 3600 * seconds / tokens * 1e6


# --- columns of the rows ----------------------------------------------------------------------


def step_energy_columns(row: dict, reading: Reading | None, tokens_key: str = "batch") -> dict:
    """A timed step's energy columns: the span's average power times the row's step time
    over the tokens a step makes (`tokens_key`: a decode step makes one per sequence). A row
    not timed (skipped, oom) or a span without a counter gets NaN, and says why."""
    ok = str(row.get("status", "ok")) == "ok"
    if reading is None:
        source = unavailable("the step was not timed")
    else:
        source = reading.source
    power = reading.power_w if reading is not None and ok else NAN
    step_s = _number(row.get("step_ms")) / 1e3
    tokens = _number(row.get(tokens_key))
    per_token = power * step_s / tokens if tokens and math.isfinite(power) else NAN
    return {
        "joules_per_token": per_token,
        "avg_power_w": power,
        "energy_span_s": reading.seconds if reading is not None else NAN,
        "energy_source": source,
    }


def with_step_energy(row: dict, reading: Reading | None, tokens_key: str = "batch") -> dict:
    return {**row, **step_energy_columns(row, reading, tokens_key)}


def step_cost_columns(row: dict, price_per_hour: float | None, tokens_key: str = "batch") -> dict:
    """usd_per_million_tokens of a timed step at `price_per_hour` (nothing when no price is
    given): the step's seconds over the tokens it makes."""
    if price_per_hour is None:
        return {}
    ok = str(row.get("status", "ok")) == "ok"
    seconds, tokens = _number(row.get("step_ms")) / 1e3, _number(row.get(tokens_key))
    cost = cost_per_million_tokens(price_per_hour, seconds, tokens) if ok else NAN
    return {"usd_per_million_tokens": cost, "price_per_hour_usd": price_per_hour}


def serve_cost_columns(row: dict, price_per_hour: float | None) -> dict:
    """serve-sweep's cost of one point: the point's duration over its output tokens at
    `price_per_hour` (nothing when no price is given)."""
    if price_per_hour is None:
        return {}
    cost = cost_per_million_tokens(
        price_per_hour, _number(row.get("duration_s")), _number(row.get("output_tokens"))
    )
    return {"usd_per_million_output_tokens": cost, "price_per_hour_usd": price_per_hour}


def serve_energy_columns(reading: Reading | None, output_tokens: float,
                         duration_s: float | None = None,
                         why: str = "simulated (no device ran)") -> dict:  # fmt: skip
    """serve-sweep's energy of one point: the counter's average power over the span that
    held the point's run times the point's own duration (the span's length when none is
    given), per output token. A point no local device ran (simulated, or an --endpoint
    server's) has none, and `why` says so."""
    if reading is None:
        return {"joules_per_output_token": NAN, "avg_power_w": NAN, "energy_j": NAN,
                "energy_source": unavailable(why)}  # fmt: skip
    seconds = duration_s if duration_s is not None and math.isfinite(duration_s) else None
    joules = reading.power_w * seconds if seconds is not None else reading.joules
    joules = joules if joules is not None and math.isfinite(joules) else None
    return {
        "joules_per_output_token": joules_per_token(joules, output_tokens),
        "avg_power_w": reading.power_w,
        "energy_j": joules if joules is not None else NAN,
        "energy_source": reading.source,
    }


def serve_columns(row: dict, reading: Reading | None, price_per_hour: float | None,
                  why: str = "simulated (no device ran)") -> dict:  # fmt: skip
    """Every energy and cost column of one serve.csv row: `reading` the counter over the
    point's real run (None for a point no local device ran: `why`), `price_per_hour`
    --price-per-hour (None: no cost column)."""
    return {
        **serve_energy_columns(
            reading, _number(row.get("output_tokens")), _number(row.get("duration_s")), why
        ),  # fmt: skip
        **serve_cost_columns(row, price_per_hour),
    }


def summary(rows: list[dict], per_token: str = "joules_per_token") -> dict:
    """For metadata: whether energy was measured, from which counter, or why not."""
    sources = [str(r.get("energy_source", "")) for r in rows if r.get("energy_source")]
    measured = [r for r in rows if math.isfinite(_number(r.get(per_token)))]
    if measured:
        return {"available": True, "source": str(measured[0]["energy_source"])}
    why = next((s for s in sources if s.startswith(NOT_AVAILABLE)), unavailable("no row timed"))
    return {"available": False, "source": why}


def summary_lines(rows: list[dict], per_token: str = "joules_per_token",
                  cost: str = "usd_per_million_tokens", name=None) -> list[str]:  # fmt: skip
    """The lines a view prints under its table: energy per token of each measured row (or
    "not available" and why) and, with a price, the cost per million tokens."""
    name = name or (lambda r: f"batch {r.get('batch')}")
    said = summary(rows, per_token)
    if not said["available"]:
        lines = [f"energy per token: {said['source']}"]
    else:
        parts = [f"{name(r)} {figure(r[per_token])} J" for r in rows
                 if math.isfinite(_number(r.get(per_token)))]  # fmt: skip
        lines = [f"energy per token ({said['source']}): " + ", ".join(parts)]
    priced = [r for r in rows if math.isfinite(_number(r.get(cost)))]
    if priced:
        price = priced[0].get("price_per_hour_usd")
        parts = [f"{name(r)} ${figure(r[cost])}" for r in priced]
        lines.append(f"cost per million tokens at ${price:g}/h: " + ", ".join(parts))
    return lines


def _number(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return NAN
    return v


# --- RAPL (Linux powercap) -----------------------------------------------------------------------


@dataclass(frozen=True)
class RaplZone:
    """One package's counter: its folder, name and the range it wraps at (microjoules)."""

    folder: Path
    name: str
    max_range_uj: int


def rapl_zones(root: Path = RAPL_ROOT) -> tuple[list[RaplZone], str | None]:
    """The package-level RAPL zones (intel-rapl:N, not their subzones intel-rapl:N:M, which
    are parts of the package: summing both would count twice) whose counter this process
    can read, and otherwise why none: (zones, None) or ([], reason)."""
    if not root.is_dir():
        return [], f"no RAPL counters ({root} is absent)"
    folders = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
    if not folders:
        return [], f"no RAPL package zone under {root}"
    zones, errors = [], []
    for folder in folders:
        try:
            int((folder / "energy_uj").read_text().strip())
            wrap = int((folder / "max_energy_range_uj").read_text().strip())
            name = (folder / "name").read_text().strip() if (folder / "name").exists() else ""
        except (OSError, ValueError) as e:  # PermissionError: root only (CVE-2020-8694)
            errors.append(f"{folder / 'energy_uj'}: {getattr(e, 'strerror', None) or e}")
            continue
        zones.append(RaplZone(folder, name or folder.name, wrap))
    if not zones:
        return [], "RAPL counters not readable (" + "; ".join(errors) + ")"
    return zones, None


def read_rapl_uj(zones: list[RaplZone]) -> list[int]:
    return [int((z.folder / "energy_uj").read_text().strip()) for z in zones]


def rapl_joules(zones: list[RaplZone], before: list[int], after: list[int]) -> float:
    """The packages' energy between two reads, each through its own wraparound."""
    total_uj = sum(
        counter_growth(b, a, z.max_range_uj) for z, b, a in zip(zones, before, after, strict=True)
    )
    return total_uj / 1e6


def measured_points(rows: list[dict]) -> list[dict]:
    """A serving curve's points whose energy is said: the measured ones (a real engine's,
    a server's), else the simulated max points; the terminal and metadata say the same."""
    shown = [r for r in rows if r.get("source") in ("real", "endpoint")]
    return shown or [r for r in rows if r.get("rate") == "max"]
