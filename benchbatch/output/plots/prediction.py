"""prediction.png: the simulation against the measurement, one panel per metric (log-log),
each point a measured run beside its simulation, the identity line (a perfect prediction)
and the target band shaded around it (core/prediction.py's TARGETS)."""

from __future__ import annotations

import math
from pathlib import Path

from benchbatch.core.prediction import NAMES
from benchbatch.core.units import figure
from benchbatch.output.plots import plt, save, ticker, tight

IDENTITY_LABEL = "identity (simulated = measured)"
BAND_LABEL = "target band"


def prediction_figure(rows: list[dict], path: Path | None, title: str):
    """The figure from prediction_rows(); written to path (None: returned open, for tests)."""
    metrics = [m for m in dict.fromkeys(r["metric"] for r in rows) if _finite(rows, m)]
    cols = min(3, max(1, len(metrics)))
    nrows = max(1, math.ceil(len(metrics) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 4.2 * nrows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        _panel(ax, [r for r in rows if r["metric"] == metric], metric)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    fig.suptitle(f"{title}\nsimulated against measured, each point a run beside its "
                 "simulation of the same requests", fontsize=10)  # fmt: skip
    tight(fig)
    if path is None:
        return fig
    save(fig, path)
    return None


def _finite(rows: list[dict], metric: str) -> bool:
    return any(_ok(r) for r in rows if r["metric"] == metric)


def _ok(r: dict) -> bool:
    return all(isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] > 0
               for k in ("simulated", "measured"))  # fmt: skip


def _panel(ax, rows: list[dict], metric: str) -> None:
    ok = [r for r in rows if _ok(r)]
    xs, ys = [r["simulated"] for r in ok], [r["measured"] for r in ok]
    lo, hi = min(xs + ys) / 1.5, max(xs + ys) * 1.5
    grid = [lo * (hi / lo) ** (i / 50) for i in range(51)]
    ax.plot(grid, grid, color="black", lw=1, label=IDENTITY_LABEL)
    band_lo, band_hi = rows[0].get("target_low"), rows[0].get("target_high")
    if band_lo is not None and math.isfinite(band_lo):
        ax.fill_between(grid, [g * band_lo for g in grid], [g * band_hi for g in grid],
                        color="tab:green", alpha=0.2, label=f"{BAND_LABEL} "
                        f"x{band_lo:g}-x{band_hi:g}")  # fmt: skip
    inside = [r.get("within") is not False for r in ok]
    saturated = [r.get("below_saturation", True) is False for r in ok]
    for flag, color, name in ((True, "tab:blue", "within"), (False, "tab:red", "outside")):
        for sat in (False, True):
            pts = [(x, y) for x, y, f, s in zip(xs, ys, inside, saturated, strict=True)
                   if f == flag and s == sat]  # fmt: skip
            if pts:
                face = "none" if sat else color
                ax.scatter(
                    *zip(*pts, strict=True),
                    edgecolors=color,
                    facecolors=face,
                    s=28,
                    zorder=3,
                    label=f"{name}{' (saturated: not judged)' if sat else ''}",
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    # minor ticks unlabelled where a power of ten is in range; labelled where none is (an
    # axis of 0.18-0.84 had no number on it)
    decade = math.floor(math.log10(hi)) >= math.ceil(math.log10(lo))
    minor = ticker.NullFormatter() if decade else ticker.FuncFormatter(lambda v, _: figure(v))
    for which in (ax.xaxis, ax.yaxis):
        which.set_minor_formatter(minor)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("simulated (s)")
    ax.set_ylabel("measured (s)")
    ax.set_title(NAMES.get(metric, metric), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")  # where it hides the fewest points (upper left hid some)


def record(rec, pairs: list[dict], title: str) -> dict:
    """prediction.csv, prediction.png and metadata's prediction (its verdict line) of a run's
    pairs (core/prediction.py). Pairs flagged below_saturation False (a serving point whose
    measured throughput fell over 10% short of the offered rate: its queue grows with the
    run's length, so no model predicts its latencies) are kept in the table, and left out of
    the verdict when others are below saturation."""
    from benchbatch.core import prediction

    rows = prediction.prediction_rows(pairs)
    rec.put("prediction", rows)
    below = [r for r in rows if r.get("below_saturation", True)]
    out = prediction.summary(below or rows)
    if out["verdict"] and below and len(below) < len(rows):
        points = {r["point"] for r in rows}
        kept = {r["point"] for r in below}
        out["verdict"] = f"{out['verdict']}; below saturation: {len(kept)} of {len(points)} points"
    sure = prediction.how_sure(below or rows)
    if sure:
        out["how_sure"] = sure
        rec.note(sure)
    near = prediction.amplified(below or rows)
    if near:
        out["amplified"] = near
        rec.note(near)
    speed = prediction.at_speed(below or rows)
    if speed:
        out["at_speed"] = speed
        rec.note(speed)
    rec.meta["prediction"] = out
    if any(_ok(r) for r in rows):
        prediction_figure(rows, rec.folder / "prediction.png", title)
    return out
