"""The serving curve's figures: p50 and p99 TTFT and TPOT, output throughput and mean batch
against the request rate per policy (so the largest rate within the SLO reads off the x-axis),
and the Pareto front of tokens/s per user against tokens/s per device with each point's rate
written beside it; simulated and measured overlaid."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchbatch.core.serving import concurrency_sweep
from benchbatch.output.plots import plt, save, tight

COLORS = {"static": "tab:red", "continuous": "tab:blue", "chunked": "tab:green"}
# One marker per policy, so a policy drawn under another still shows its own shape.
MARKERS = {"static": "s", "continuous": "o", "chunked": "^"}
# A policy's points are nudged sideways by this fraction of the rate axis's step, so points
# of equal value at one rate sit side by side instead of on top of each other.
NUDGE = {"static": -0.12, "continuous": 0.0, "chunked": 0.12}
# source -> (line style, filled, size, z-order, label): the real engine on top
STYLES = {
    "sim": ("-", True, 5, 2, "simulated"),
    "sim-matched": (":", False, 6, 3, "simulated, the real run's requests"),
    "real": ("--", True, 8, 4, "real engine"),
    "endpoint": ("--", True, 8, 4, "measured server"),
}
MEASURED = ("real", "endpoint")  # drawn bolder than the simulations
PANELS = (
    ("ttft_p50_s", "p50 TTFT (s, log)", True),
    ("ttft_p99_s", "p99 TTFT (s, log)", True),
    ("output_throughput_tps", "output throughput (tokens/s)", False),
    ("tpot_p50_s", "p50 TPOT (ms)", False),
    ("tpot_p99_s", "p99 TPOT (ms)", False),
    ("mean_batch", "mean batch (sequences per step)", False),
)
MS = {"tpot_p50_s", "tpot_p99_s"}
MAX_LABEL = "max"
RATE_LABEL = "request rate (req/s; max: every request queued at once)"


class RateAxis:
    """Where each request rate sits on the x-axis: a finite rate at itself, `max` (inf) at the
    right edge, one step past the largest finite rate, labelled "max"."""

    column, label = "rate_rps", RATE_LABEL

    def __init__(self, rates):
        rates = np.asarray([float(r) for r in rates], dtype=float)
        finite = np.unique(rates[np.isfinite(rates)])
        self.step = float(np.median(np.diff(finite))) if finite.size > 1 else (
            float(finite[0]) if finite.size else 1.0)  # fmt: skip
        self.largest = float(finite.max()) if finite.size else 0.0
        self.has_max = bool(np.isinf(rates).any())
        self.edge = self.largest + 1.5 * self.step

    def x(self, rate: float) -> float:
        return self.edge if math.isinf(float(rate)) else float(rate)

    def apply(self, ax) -> None:
        """Ticks at the rates' own scale, plus "max" at the edge and a dotted boundary."""
        ax.set_xlim(0, self.edge + 0.5 * self.step if self.has_max else self.largest * 1.08)
        if self.has_max:
            ticks = [t for t in ax.get_xticks() if 0 <= t <= self.largest + 0.3 * self.step]
            labels = [f"{t:g}" for t in ticks] + [MAX_LABEL]
            ax.set_xticks([*ticks, self.edge], labels)
            ax.axvline(self.largest + 0.75 * self.step, color="gray", ls=":", lw=0.8)


class CapAxis:
    """A concurrency sweep's x-axis (several --max-concurrency caps at one rate): each cap at
    its log2, ticks labelled with the caps."""

    column, label = "max_concurrency", "requests in flight (the client's cap; log scale)"
    step = 1.0

    def __init__(self, caps):
        self.caps = sorted({int(c) for c in caps if c == c})

    def x(self, cap) -> float:
        return math.log2(float(cap))

    def apply(self, ax) -> None:
        xs = [self.x(c) for c in self.caps]
        ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
        ax.set_xticks(xs, [str(c) for c in self.caps])


def x_axis(df: pd.DataFrame):
    """The x-axis the rows are drawn against: the client's caps in a concurrency sweep, else
    the request rates."""
    if concurrency_sweep(df.to_dict("records")):
        return CapAxis(df["max_concurrency"])
    return RateAxis(df["rate_rps"])


def _lines(ax, df: pd.DataFrame, axis, y: str, scale: float = 1.0) -> None:
    """One line per (policy, source), points in the axis's order, nudged per policy."""
    for (policy, source), g in df.groupby(["policy", "source"], sort=False):
        style, filled, size, z, label = STYLES.get(source, STYLES["sim"])
        g = g.sort_values(axis.column)
        color = COLORS.get(policy, "gray")
        xs = [axis.x(r) + NUDGE.get(policy, 0.0) * axis.step for r in g[axis.column]]
        ax.plot(xs, g[y] * scale, ls=style, marker=MARKERS.get(policy, "D"), color=color,
                markerfacecolor=color if filled else "white", markeredgecolor=color,
                markersize=size, lw=1.8 if source in MEASURED else 1.1, alpha=0.85,
                zorder=z, label=f"{policy} ({label})")  # fmt: skip


def _slo_line(ax, value: float, text: str) -> None:
    """A labelled SLO limit: the dashed line, and its value written just above it."""
    ax.axhline(value, color="black", ls="--", lw=1.2, zorder=5, label="SLO limit")
    ax.annotate(text, (0.01, value), xycoords=("axes fraction", "data"), xytext=(0, 3),
                textcoords="offset points", fontsize=9, ha="left", va="bottom",
                bbox=dict(facecolor="white", edgecolor="none", pad=1, alpha=0.8))  # fmt: skip


def serve_figure(rows: list[dict], path: Path, title: str, slo_ttft: float, slo_tpot: float):
    """Six panels against the request rate: p50 and p99 TTFT, output throughput (top); p50
    and p99 TPOT, mean batch (bottom). The SLO limits are dashed and labelled on the p99
    panels; the `max` points sit at the right edge."""
    df = pd.DataFrame(rows)
    axis = x_axis(df)
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    for ax, (key, name, log) in zip(axes.flat, PANELS, strict=True):
        _lines(ax, df, axis, key, 1e3 if key in MS else 1.0)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(name)
        ax.set_xlabel(axis.label)
        ax.grid(True, which="both", alpha=0.3)
    _slo_line(axes[0, 1], slo_ttft, f"SLO: p99 TTFT {slo_ttft:g} s")
    _slo_line(axes[1, 1], slo_tpot * 1e3, f"SLO: p99 TPOT {slo_tpot * 1e3:g} ms")
    for ax in (axes[0, 2], axes[1, 0], axes[1, 1], axes[1, 2]):
        ax.set_ylim(bottom=0)
    _fit_log(axes[0, 0], df["ttft_p50_s"])
    _fit_log(axes[0, 1], pd.concat([df["ttft_p99_s"], pd.Series([slo_ttft])]))
    # the SLO's own height where no point has a TPOT (every request failed, or one token each)
    tpots = pd.to_numeric(df["tpot_p99_s"], errors="coerce").to_numpy(dtype=float)
    top = float(np.nanmax(np.append(tpots, slo_tpot))) * 1e3
    axes[1, 1].set_ylim(0, top * 1.12)
    for ax in axes.flat:  # after the limits: the ticks are those of the final range
        axis.apply(ax)
    handles, labels = axes[0, 1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=10, frameon=False)
    each = (
        f"each point a cap on the requests in flight, at {rate_text(df['rate_rps'].iloc[0])} "
        "req/s (max: every request queued). The most within the SLO"
        if isinstance(axis, CapAxis)
        else "each point a request rate (Poisson arrivals; max: every request queued). The "
        "largest rate within the SLO"
    )
    fig.suptitle(f"{title}\n{each}: the last point under both dashed lines", fontsize=10)
    rows_of_legend = math.ceil(len(labels) / 4)
    tight(fig, rect=(0, 0.035 * rows_of_legend + 0.01, 1, 1))
    save(fig, path)


def _fit_log(ax, values) -> None:
    """A log axis spanning its data (and the SLO) with a little room."""
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size:
        ax.set_ylim(v.min() / 1.5, v.max() * 1.5)


def pareto_front(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The points no other point beats on both x and y (both larger is better), by x."""
    ordered = df.sort_values([x, y], ascending=[False, False])
    keep, best = [], -np.inf
    for i, row in ordered.iterrows():
        if row[y] > best:
            keep.append(i)
            best = row[y]
    return df.loc[keep].sort_values(x)


def rate_text(rate) -> str:
    """A rate as a point's label: 'max' for inf, else its value (req/s)."""
    r = float(rate)
    return MAX_LABEL if math.isinf(r) else f"{r:g}"


# Where a point's label may go, tried in order (offsets in points from the point).
PLACES = ((5, 4), (5, -11), (-18, 4), (-18, -11), (6, 12), (-20, 12), (6, -19), (-20, -19))


def pareto_figure(rows: list[dict], path: Path, title: str) -> None:
    """Tokens/s per user (output throughput over the requests in the system, Little's law)
    against tokens/s per device: every point (one marker per policy, chunked drawn under
    continuous), the front over all policies per source, and each point's request rate
    written beside it where it has room (the front's points first)."""
    df = pd.DataFrame(rows)
    x, y = "tokens_per_s_per_user", "output_throughput_tps"
    df = df[np.isfinite(df[x]) & np.isfinite(df[y])]
    fig, ax = plt.subplots(figsize=(10, 7))
    for (policy, source), g in df.groupby(["policy", "source"], sort=False):
        _, filled, size, z, label = STYLES.get(source, STYLES["sim"])
        color = COLORS.get(policy, "gray")
        big = policy == "chunked"  # larger and hollow, under the others: none hides another
        ax.scatter(g[x], g[y], marker=MARKERS.get(policy, "D"), s=(size * 1.6) ** 2 if big
                   else size**2 * 1.2, facecolors="none" if big or not filled else color,
                   edgecolors=color, linewidths=1.3, alpha=0.85, zorder=z - (1 if big else 0),
                   label=f"{policy} ({label})")  # fmt: skip
    fronts = []
    for source in ("sim", *MEASURED):
        mine = df[df["source"] == source]
        if len(mine):
            front = pareto_front(mine, x, y)
            fronts.append(front)
            # a front of one point (it dominates the rest) is a ring: a line of one point
            # is nothing drawn beside its legend entry
            ax.plot(front[x], front[y], ls=STYLES[source][0], color="black",
                    lw=1.2 if source in MEASURED else 0.8, zorder=1,
                    marker="o" if len(front) == 1 else None, markersize=14,
                    markerfacecolor="none",
                    label=f"Pareto front ({STYLES[source][4]})")  # fmt: skip
    ax.set_xlabel("tokens/s per user (output throughput / requests in the system)")
    ax.set_ylabel("tokens/s per device (output throughput)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # no point has a throughput when every one failed
        ax.legend(fontsize=9, loc="upper right")
    caps = isinstance(x_axis(df), CapAxis) if len(df) else False
    shown = "requests in flight" if caps else "request rate (req/s)"
    ax.set_title(f"{title}\nnumbers: each point's {shown}", fontsize=9)
    tight(fig)
    order = pd.concat([*fronts, df]) if fronts else df
    key = "max_concurrency" if caps else "rate_rps"
    label_points(fig, ax, order.drop_duplicates(subset=[x, y, key]), x, y, key)
    save(fig, path)


def label_points(fig, ax, points: pd.DataFrame, x: str, y: str, key: str = "rate_rps") -> None:
    """Each point's rate (key "rate_rps"; "max_concurrency": its cap) beside it, at the first
    place clear of every label placed so far, of the legend and of the axes' edge; a point
    with no clear place keeps no label (its rate is the same as a neighbour's, labelled)."""
    renderer = fig.canvas.get_renderer()
    taken = [ax.get_legend().get_window_extent(renderer)] if ax.get_legend() else []
    frame = ax.get_window_extent(renderer)
    for _, p in points.iterrows():
        for dx, dy in PLACES:
            words = rate_text(p[key]) if key == "rate_rps" else f"{int(p[key])}"
            text = ax.annotate(words, (p[x], p[y]), xytext=(dx, dy),
                               textcoords="offset points", fontsize=7,
                               color=COLORS.get(p["policy"], "gray"))  # fmt: skip
            text.set_parse_math(False)
            box = text.get_window_extent(renderer).padded(1.5)
            inside = frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
            if inside and not any(box.overlaps(b) for b in taken):
                taken.append(box)
                break
            text.remove()
