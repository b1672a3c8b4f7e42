"""The roofline figure: every measured step placed under the device's own roofs."""

from __future__ import annotations

import math
from pathlib import Path

from benchbatch import roofline
from benchbatch.peaks import Peak
from benchbatch.plots import plt, save

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}
PROBE_COLOR = "tab:gray"
SOURCE_MARKERS = {"phases": "o", "sweep": "s", "probe": "x"}
OTHER_MARKER = "^"


def roofline_figure(
    rows: list[dict],
    ceilings: roofline.Ceilings,
    path: Path,
    datasheet_peak: Peak | None = None,
    title: str = "roofline",
) -> None:
    """Log-log arithmetic intensity (FLOP/byte) against achieved TFLOP/s.

    The measured roof is solid, the datasheet's (in the same dtype) dashed where known.
    Rows need label, arithmetic_intensity and tflops; colour follows `phase` (probe rows
    with a `kind` are grey) and the marker follows `source` (phases, sweep, probe), so the
    caller tags rows with their command when it mixes them.
    """
    points = [p for p in (_point(r) for r in rows) if p is not None]
    sheet = roofline.from_datasheet(datasheet_peak, ceilings.dtype)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = roofline.log_space(*_x_range(points, ceilings, sheet))
    ax.plot(xs, roofline.roof(xs, ceilings), "-", color="black", lw=2, label=_roof_label(ceilings))
    if sheet is not None:
        ax.plot(
            xs, roofline.roof(xs, sheet), "--", color="tab:red", lw=1.2, label=_sheet_label(sheet)
        )
    ax.axvline(ceilings.ridge, color="black", lw=0.6, ls=":")
    _draw_points(ax, points)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    save(fig, path)


def _point(row: dict) -> dict | None:
    """The row's place on the plot, or None when it cannot be placed on log axes."""
    if row.get("status", "ok") != "ok":
        return None
    x, y = _num(row.get("arithmetic_intensity")), _num(row.get("tflops"))
    if x is None or y is None or x <= 0 or y <= 0:
        return None
    source = row.get("source") or ("probe" if row.get("kind") else "phases")
    color = PROBE_COLOR if source == "probe" else PHASE_COLORS.get(row.get("phase"), "tab:green")
    group = source if source == "probe" else f"{source}: {row.get('phase', 'step')}"
    return {
        "x": x,
        "y": y,
        "label": str(row.get("label", "")),
        "color": color,
        "marker": SOURCE_MARKERS.get(source, OTHER_MARKER),
        "group": group,
    }


def _num(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _x_range(points, ceilings, sheet) -> tuple[float, float]:
    """Intensities from well below to well above the ridges and every point."""
    xs = [p["x"] for p in points] + [ceilings.ridge] + ([sheet.ridge] if sheet else [])
    return min(xs) / 4, max(xs) * 4


def _draw_points(ax, points: list[dict]) -> None:
    labelled = set()
    for i, p in enumerate(points):
        label = None if p["group"] in labelled else p["group"]
        labelled.add(p["group"])
        ax.scatter(
            p["x"], p["y"], color=p["color"], marker=p["marker"], s=36, zorder=3, label=label
        )
        # alternate above/below so neighbouring labels (a batch sweep) do not overlap
        dy = 6 if i % 2 == 0 else -11
        ax.annotate(
            p["label"], (p["x"], p["y"]), textcoords="offset points", xytext=(5, dy), fontsize=7
        )


def _roof_label(c: roofline.Ceilings) -> str:
    return (
        f"measured roof: {c.peak_tflops:.3g} TFLOP/s, {c.peak_gbps:.3g} GB/s, "
        f"ridge {c.ridge:.3g} FLOP/B"
    )


def _sheet_label(c: roofline.Ceilings) -> str:
    return (
        f"datasheet roof ({c.tflops_source}): {c.peak_tflops:.3g} TFLOP/s, "
        f"{c.peak_gbps:.3g} GB/s, ridge {c.ridge:.3g} FLOP/B"
    )
