"""The phases figure: achieved FLOP/s and cost per token of each step."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from benchbatch.core.units import flop_unit
from benchbatch.output.plots import plt, save
from benchbatch.output.plots.spread import (
    BARS_LABEL,
    NOISY_LABEL,
    number,
    plain,
    plain_log_axis,
    rate_bounds,
    seconds_log_axis,
    seconds_text,
    time_bounds,
    time_scaled_bounds,
    yerr,
)
from benchbatch.output.plots.spread import noisy as is_noisy

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}
NOISY_HATCH, NOISY_EDGE = "///", "tab:red"


def phases_figure(rows: list[dict], path: Path, title: str) -> None:
    """Achieved FLOP/s and cost per token (step time over the tokens it made) of each step,
    with the repeats' 10th-90th percentile as error bars and noisy steps hatched in red; a
    step that was not measured keeps its place, marked on the axis with its status."""
    ok = [r for r in rows if r.get("status", "ok") == "ok" and number(r.get("tflops"))]
    unit = flop_unit(r["tflops"] for r in ok)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    labels = [str(r["label"]) for r in rows]
    for ax, key, scale, name, text in (
        (ax1, "tflops", unit.per_tflops, f"achieved {unit.name}", plain),
        (ax2, "us_per_token", 1e-6, "cost per token", seconds_text),
    ):
        _bars(ax, rows, labels, key, scale, text)
        if ok:  # a log scale needs a positive value to show
            ax.set_yscale("log")
            # plain numbers and units on the ticks, never 10^2 or 1e-4
            (plain_log_axis if key == "tflops" else seconds_log_axis)(ax.yaxis)
        ax.set_ylabel(name + ", log scale")
        ax.tick_params(axis="x", rotation=20)
        ax.grid(True, axis="y", alpha=0.3)
    ax1.set_title(bars_title(rows, unit.name), fontsize=9)
    ax2.set_title("cost per token: step time / tokens made (batching cuts it)", fontsize=9)
    handles = [Patch(facecolor="white", edgecolor=NOISY_EDGE, hatch=NOISY_HATCH,
                     label=NOISY_LABEL)] if any(is_noisy(r) for r in ok) else []  # fmt: skip
    if any(time_bounds(r) for r in ok):
        handles.append(Line2D([], [], color="black", lw=1, label=BARS_LABEL))
    if handles:
        fig.legend(handles=handles, fontsize=8, loc="outside lower left", frameon=False)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def _bars(ax, rows: list[dict], labels: list[str], key: str, scale: float, text) -> None:
    values, bounds, colors = [], [], []
    for r in rows:
        v = number(r.get(key)) if r.get("status", "ok") == "ok" else None
        values.append(v * scale if v is not None else math.nan)
        # A rate goes as 1 / time (FLOP/s), a cost per token as the time itself.
        b = rate_bounds(r, v) if key == "tflops" and v is not None else time_scaled_bounds(r, v)
        bounds.append((b[0] * scale, b[1] * scale) if b else None)
        colors.append(PHASE_COLORS.get(r.get("phase"), "tab:green"))
    x = list(range(len(rows)))
    bars = ax.bar(x, values, color=colors)
    for bar, r in zip(bars, rows, strict=True):
        if is_noisy(r):
            bar.set_hatch(NOISY_HATCH)
            bar.set_edgecolor(NOISY_EDGE)
    ax.errorbar(x, values, yerr=yerr(values, bounds), fmt="none", ecolor="black", capsize=3,
                elinewidth=1)  # fmt: skip
    ax.set_xticks(x, labels)
    bottom = ax.get_xaxis_transform()
    for i, (r, v) in enumerate(zip(rows, values, strict=True)):
        if r.get("status", "ok") != "ok":  # no bar: its status on the axis
            ax.plot([i], [0.0], "x", color="black", ms=9, clip_on=False, transform=bottom)
            ax.text(i, 0.05, str(r["status"]), ha="center", fontsize=8, transform=bottom)
        elif not math.isnan(v):  # the value at the bar's foot, clear of the error bar
            ax.text(i, 0.03, text(v), ha="center", fontsize=8, transform=bottom,
                    bbox=dict(facecolor="white", edgecolor="none", pad=1, alpha=0.85))  # fmt: skip


def bars_title(rows: list[dict], unit: str) -> str:
    """The FLOP/s panel's title: what its bars are, and what the ceilings say of each phase
    (a bar chart, not the roofline figure: roofline.png draws that)."""
    bounds = bound_title(rows)
    if not bounds.startswith("roofline: "):
        return f"achieved {unit} of each step (no ceilings: no bound)"
    return f"achieved {unit} of each step ({bounds.removeprefix('roofline: ')})"


def bound_title(rows: list[dict]) -> str:
    """What the roofline says of each phase, from the rows' own bound labels."""
    said = {}
    for phase in ("prefill", "decode"):
        bounds = {r.get("bound") for r in rows if r.get("phase") == phase}
        bounds = {b for b in bounds if isinstance(b, str) and b}
        if bounds:
            said[phase] = " and ".join(sorted(bounds))
    if not said:
        return "achieved FLOP/s (no roofline: no ceilings)"
    return "roofline: " + ", ".join(f"{p} {b}-bound" for p, b in said.items())
