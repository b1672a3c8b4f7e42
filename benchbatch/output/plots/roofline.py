"""The roofline figure: every measured step placed under the device's own roofs."""

from __future__ import annotations

from pathlib import Path

from benchbatch.core import roofline
from benchbatch.core.peaks import Peak
from benchbatch.core.units import figure, flop_unit
from benchbatch.output.plots import plt, save
from benchbatch.output.plots.spread import BARS_LABEL, number, rate_bounds, ring, yerr
from benchbatch.output.plots.spread import noisy as is_noisy

PHASE_COLORS = {"prefill": "tab:orange", "decode": "tab:blue", "mixed": "tab:purple"}
PROBE_COLOR = "tab:gray"
SOURCE_MARKERS = {"phases": "o", "sweep": "s", "probe": "x", "piggyback": "D"}
OTHER_MARKER = "^"
LABEL_GAP = 0.045  # axes fraction between two labels in the column beside the plot


def roofline_figure(
    rows: list[dict],
    ceilings: roofline.Ceilings,
    path: Path,
    datasheet_peak: Peak | None = None,
    title: str = "roofline",
) -> None:
    """Log-log arithmetic intensity (FLOP/byte) against achieved FLOP/s (GFLOP/s where no
    rate reaches a TFLOP/s).

    The measured roof is solid, the datasheet's (in the same dtype) dashed where known.
    Rows need label, arithmetic_intensity and tflops; colour follows `phase` (probe rows
    with a `kind` are grey) and the marker follows `source` (phases, sweep, probe), so the
    caller tags rows with their command when it mixes them. Each point's label sits in a
    column beside the plot, joined to it by a thin line, so no two labels overlap; a step
    that was not measured (skipped, oom) is a mark on the bottom axis at its intensity,
    labelled with its status. Error bars span the repeats' 10th to 90th percentile; a noisy
    point is ringed.
    """
    points = [p for p in (_point(r) for r in rows) if p is not None]
    placed = [p for p in points if p["y"] is not None]
    sheet = roofline.from_datasheet(datasheet_peak, ceilings.dtype)
    unit = flop_unit([p["y"] for p in placed] + [ceilings.peak_tflops])
    fig, ax = plt.subplots(figsize=(9, 5.5))
    xs = roofline.log_space(*_x_range(points, ceilings, sheet))
    ax.plot(xs, [unit(y) for y in roofline.roof(xs, ceilings)], "-", color="black", lw=2,
            label=_roof_label("measured roof", ceilings, unit))  # fmt: skip
    if sheet is not None:
        label = _roof_label(f"datasheet roof ({sheet.tflops_source})", sheet, unit)
        ax.plot(xs, [unit(y) for y in roofline.roof(xs, sheet)], "--", color="tab:red", lw=1.2,
                label=label)  # fmt: skip
    ax.axvline(ceilings.ridge, color="black", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _draw_points(ax, placed, unit)
    _draw_unmeasured(ax, [p for p in points if p["y"] is None])
    _label_column(ax, points, unit)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"achieved {unit.name}")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    # Below the plot: the labels take the right-hand side, the points the inside.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=2, frameon=False)
    save(fig, path)


def _point(row: dict) -> dict | None:
    """The row's place on the plot (y None: not measured, drawn on the axis), or None when
    it cannot be placed at all (no positive intensity)."""
    x = number(row.get("arithmetic_intensity"))
    if x is None or x <= 0:
        return None
    source = row.get("source") or ("probe" if row.get("kind") else "phases")
    color = PROBE_COLOR if source == "probe" else PHASE_COLORS.get(row.get("phase"), "tab:green")
    group = source if source == "probe" else f"{source}: {row.get('phase', 'step')}"
    status = str(row.get("status", "ok"))
    y = number(row.get("tflops")) if status == "ok" else None
    if y is not None and y <= 0:
        return None
    label = str(row.get("label", ""))
    return {
        "x": x,
        "y": y,
        "label": label if status == "ok" else f"{label}: {status}",
        "color": color,
        "marker": SOURCE_MARKERS.get(source, OTHER_MARKER),
        "group": group,
        "bounds": rate_bounds(row, y) if y is not None else None,
        "noisy": is_noisy(row) and status == "ok",
    }


def _x_range(points, ceilings, sheet) -> tuple[float, float]:
    """Intensities from well below to well above the ridges and every point."""
    xs = [p["x"] for p in points] + [ceilings.ridge] + ([sheet.ridge] if sheet else [])
    return min(xs) / 4, max(xs) * 4


def _draw_points(ax, points: list[dict], unit) -> None:
    labelled = set()
    for p in points:
        label = None if p["group"] in labelled else p["group"]
        labelled.add(p["group"])
        y = unit(p["y"])
        ax.scatter(p["x"], y, color=p["color"], marker=p["marker"], s=36, zorder=4, label=label)
        if p["bounds"] is not None:
            bounds = (unit(p["bounds"][0]), unit(p["bounds"][1]))
            ax.errorbar([p["x"]], [y], yerr=yerr([y], [bounds]), fmt="none", ecolor=p["color"],
                        elinewidth=1, capsize=2, alpha=0.7, zorder=3)  # fmt: skip
    if any(p["bounds"] for p in points):
        ax.errorbar([], [], yerr=[[], []], fmt="none", ecolor="black", capsize=2,
                    label=BARS_LABEL)  # fmt: skip
    noisy = [p for p in points if p["noisy"]]
    ring(ax, [p["x"] for p in noisy], [unit(p["y"]) for p in noisy])


def _draw_unmeasured(ax, points: list[dict]) -> None:
    """A step without a time: a mark on the bottom axis at its intensity (no made-up y)."""
    if not points:
        return
    ax.scatter([p["x"] for p in points], [0.0] * len(points), marker="x", color="black",
               s=40, clip_on=False, zorder=5, transform=ax.get_xaxis_transform(),
               label="not measured (status beside it)")  # fmt: skip


def _label_column(ax, points: list[dict], unit) -> None:
    """Every label in a column right of the plot, in the order of the points' heights, at
    least LABEL_GAP apart, each joined to its point."""
    if not points:
        return
    ax.figure.canvas.draw()  # the axes' final limits
    to_axes = ax.transAxes.inverted()
    spots = []
    for p in points:
        if p["y"] is None:
            spots.append((0.0, p, ax.get_xaxis_transform(), (p["x"], 0.0)))
            continue
        display = ax.transData.transform((p["x"], unit(p["y"])))
        spots.append((to_axes.transform(display)[1], p, ax.transData, (p["x"], unit(p["y"]))))
    spots.sort(key=lambda s: s[0])
    for (_, p, transform, xy), y in zip(spots, spread_out([s[0] for s in spots]), strict=True):
        ax.annotate(
            p["label"], xy=xy, xycoords=transform, xytext=(1.03, y), textcoords="axes fraction",
            fontsize=7, va="center", color="black" if p["y"] is None else p["color"],
            arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=3),
            annotation_clip=False,
        )  # fmt: skip


def spread_out(wanted: list[float], gap: float = LABEL_GAP) -> list[float]:
    """Positions as near the wanted ones (sorted, axes fraction) as keeps them `gap` apart,
    within 0..1 when they fit there (a long list runs on past the top)."""
    out: list[float] = []
    for w in wanted:
        out.append(max(w, out[-1] + gap) if out else max(w, 0.0))
    top = max(1.0, gap * (len(out) - 1))
    for i in range(len(out) - 1, -1, -1):
        limit = top if i == len(out) - 1 else out[i + 1] - gap
        out[i] = min(out[i], limit)
    return out


def _roof_label(name: str, c: roofline.Ceilings, unit) -> str:
    return (
        f"{name}: {figure(unit(c.peak_tflops))} {unit.name}, {figure(c.peak_gbps)} GB/s, "
        f"ridge {figure(c.ridge)} FLOP/B"
    )
