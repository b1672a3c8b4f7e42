"""The sweep figure: decode throughput and step latency against batch, one curve per context,
with the knees and the memory ceiling marked."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from benchbatch.output.plots import plt, save
from benchbatch.output.plots.spread import (
    BARS_LABEL,
    NOISY_LABEL,
    rate_bounds,
    ring,
    time_bounds,
    yerr,
)
from benchbatch.output.plots.spread import noisy as is_noisy

MATMUL_STYLE = (0, (5, 2, 1, 2))
LEGEND = {
    "knee": dict(marker="*", ls="", ms=12, color="white", mec="black", label="measured knee"),
    "roofline": dict(ls="--", color="black", label="roofline knee (accounted intensity)"),
    "matmul": dict(ls=MATMUL_STYLE, color="grey", label="weight matmuls reach the ridge"),
    "ceiling": dict(ls="-.", color="black", label="memory ceiling (shaded: over it)"),
    "skipped": dict(marker="x", ls="", color="black", label="skipped: over the ceiling"),
    "oom": dict(marker="X", ls="", color="black", label="out of memory"),
    "bars": dict(marker="", ls="-", color="black", lw=1, label=BARS_LABEL),
    "noisy": dict(marker="o", ls="", ms=11, mfc="none", mec="tab:red", label=NOISY_LABEL),
}


COLUMNS = ["context", "batch", "status", "tokens_per_s", "step_ms"]


def sweep_figure(rows: list[dict], summary: list[dict], path: Path, title: str) -> None:
    """Left: tokens/s (log-log) beside perfect batching; right: step ms. Per context.
    Batches that were not measured (skipped, oom, no time) are marked; with none measured
    the panels say so."""
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=COLUMNS)
    fig, (tput, lat) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained")
    batches = sorted(int(b) for b in df["batch"].unique())
    span = (batches[0] / 1.5, batches[-1] * 1.5) if batches else (0.5, 2)
    measured = bool(_measured(df).any())
    drawn: set[str] = set()
    for i, s in enumerate(summary):
        color = plt.get_cmap("tab10")(i % 10)
        mine = df[df["context"] == s["context"]].sort_values("batch")
        _curve(tput, lat, mine, s, color)
        drawn |= _marks(tput, lat, mine, s, color, span)
    timed = df[_measured(df)].to_dict("records") if len(df) else []
    if any(time_bounds(r) for r in timed):
        drawn.add("bars")
    if any(is_noisy(r) for r in timed):
        drawn.add("noisy")
    if summary and _vline((tput, lat), summary[0].get("matmul_knee"), span, "grey", MATMUL_STYLE):
        drawn.add("matmul")
    _axes(tput, lat, batches, span, measured)
    lat.set_ylim(0, _highest(df) * 1.12 if measured else 1)
    if not measured:
        _nothing_measured((tput, lat), df)
    # Legends below the panels: on a log-log plot any corner can hold data.
    below = dict(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.14), frameon=False)
    notes = [Line2D([], [], ls="", label=n) for n in _notes(summary)]
    handles = [Line2D([], [], **LEGEND[k]) for k in LEGEND if k in drawn] + notes
    if handles:
        tput.legend(handles=handles, **below)
    if summary:
        lat.legend(**below)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def _highest(df: pd.DataFrame) -> float:
    """The top of the step-time panel: the slowest median, or p90 where the bars go higher."""
    ok = df[_measured(df)]
    tops = [ok["step_ms"].max()]
    if "step_ms_p90" in ok.columns:
        tops.append(pd.to_numeric(ok["step_ms_p90"], errors="coerce").max())
    return max(t for t in tops if t == t)


def _measured(rows: pd.DataFrame) -> pd.Series:
    """Rows with a time: status ok and a positive throughput (NaN where it was lost)."""
    rate = pd.to_numeric(rows["tokens_per_s"], errors="coerce")
    step = pd.to_numeric(rows["step_ms"], errors="coerce")
    return (rows["status"] == "ok") & (rate > 0) & (step > 0)


def _nothing_measured(axes, df: pd.DataFrame) -> None:
    counts = df["status"].value_counts()
    what = ", ".join(f"{n} {status}" for status, n in counts.items()) or "no rows"
    for ax in axes:
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            f"nothing measured ({what})",
            transform=ax.transAxes,
            ha="center",
            bbox=dict(facecolor="white", edgecolor="none"),
        )


def _curve(tput, lat, rows: pd.DataFrame, s: dict, color) -> None:
    ok = rows[_measured(rows)]
    label = f"context {s['context']:,} (memory fits {s['predicted_max_batch']:,})"
    tput.plot(ok["batch"], ok["tokens_per_s"], "o-", color=color, label=label)
    lat.plot(ok["batch"], ok["step_ms"], "o-", color=color, label=label)
    records = ok.to_dict("records")
    rates = list(ok["tokens_per_s"])
    times = list(ok["step_ms"])
    for ax, values, bounds in (
        (tput, rates, [rate_bounds(r, v) for r, v in zip(records, rates, strict=True)]),
        (lat, times, [time_bounds(r) for r in records]),
    ):
        if any(bounds):
            ax.errorbar(list(ok["batch"]), values, yerr=yerr(values, bounds), fmt="none",
                        ecolor=color, capsize=3, elinewidth=1)  # fmt: skip
        noisy = [i for i, r in enumerate(records) if is_noisy(r)]
        ring(ax, [records[i]["batch"] for i in noisy], [values[i] for i in noisy], label=None)
    if len(ok):
        b0, t0 = ok["batch"].iloc[0], ok["tokens_per_s"].iloc[0]
        tput.plot(ok["batch"], t0 * ok["batch"] / b0, ":", color=color, alpha=0.6)
        threshold = ok["step_ms"].iloc[0] * (1 + s["knee_threshold"])
        lat.axhline(threshold, color=color, ls=":", lw=0.8, alpha=0.6)


def _marks(tput, lat, rows: pd.DataFrame, s: dict, color, span) -> set[str]:
    """Measured knee, roofline knee, memory ceiling, skipped and oom batches of one context."""
    drawn = set()
    knee = s.get("measured_knee")
    if knee is not None:
        at = rows[rows["batch"] == knee].iloc[0]
        for ax, col in ((tput, "tokens_per_s"), (lat, "step_ms")):
            ax.plot([knee], [at[col]], "*", ms=16, color=color, mec="black", zorder=5)
        drawn.add("knee")
    for status, marker in (("skipped", "x"), ("oom", "X")):
        for b in rows[rows["status"] == status]["batch"]:
            for ax in (tput, lat):
                axis = ax.get_xaxis_transform()
                ax.plot([b], [0.04], marker, ms=9, color=color, transform=axis)
                ax.text(b, 0.08, status, ha="center", fontsize=7, color=color, transform=axis)
            drawn.add(status)
    roofline = s.get("predicted_knee") if s.get("predicted_knee_fits") else None
    if _vline((tput, lat), roofline, span, color, "--"):
        drawn.add("roofline")
    if _vline((tput, lat), max(s["predicted_max_batch"], span[0]), span, color, "-.", True):
        drawn.add("ceiling")
    return drawn


def _vline(axes, batch, span, color, style, shade=False) -> bool:
    """A vertical line when it falls inside the plotted range (else the legend says where)."""
    if batch is None or not span[0] <= batch <= span[1]:
        return False
    for ax in axes:
        ax.axvline(batch, color=color, ls=style, lw=1.2)
        if shade:
            ax.axvspan(batch, span[1], color=color, alpha=0.07)
    return True


def _notes(summary: list[dict]) -> list[str]:
    """Roofline predictions the lines cannot show: not made, never reached, over memory."""
    unseen = [s for s in summary if not (s["predicted_knee"] and s["predicted_knee_fits"])]
    notes = {s["predicted_knee_note"] for s in unseen}
    if len(notes) == 1 and len(unseen) == len(summary):
        return [f"roofline: {notes.pop()}"]
    return [f"context {s['context']:,} roofline: {s['predicted_knee_note']}" for s in unseen]


def _axes(tput, lat, batches: list[int], span, measured: bool) -> None:
    tput.set_xscale("log")
    if measured:  # a log scale needs a positive value to show
        tput.set_yscale("log")
    lat.set_xscale("log")
    for ax in (tput, lat):
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(*span)
        ax.set_xlabel("batch (sequences per decode step)")
        ax.grid(True, which="both", alpha=0.3)
    tput.set_ylabel("decode throughput (tokens/s, log)")
    lat.set_ylabel("decode step time (ms): each user's wait per token")
    tput.set_title("throughput; dotted: perfect batching (flat step time)", fontsize=9)
    lat.set_title("step latency; dotted: knee threshold over the smallest batch", fontsize=9)
