"""The projection's figure (project.png): where a decode step's time goes on 1, 2, 4, 8 GPUs
(the model's own share, the all-reduces, the logits gather) and the speedup it buys against
the ideal (n GPUs, n times faster). Drawn from project.csv's rows; nothing is measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

from benchbatch.output.plots import plt, save
from benchbatch.output.plots.spread import plain

PARTS = (
    ("model_ms", "model (roofline / efficiency)", 1.0),
    ("allreduce_ms", "all-reduces", 0.55),
    ("gather_ms", "logits gather", 0.3),
)
NOT_FIT = "does not fit"


def case_name(batch: int, context: int) -> str:
    return f"batch {int(batch):,}, context {int(context):,}"


def project_figure(rows: list[dict], path: Path, title: str) -> None:
    """Left: the projected step time per GPU count, stacked by where it goes, one bar per
    (batch, context), its all-reduce share written above it (a count that does not fit its
    memory says so instead). Right: the speedup over the fewest GPUs that fit, against the
    ideal line."""
    df = pd.DataFrame(rows)
    tps = sorted(int(t) for t in df["tp"].unique())
    cases = list(dict.fromkeys(zip(df["batch"], df["context"], strict=True)))
    cmap = plt.get_cmap("tab10")
    fig, (time_ax, speed_ax) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    width = 0.8 / max(len(cases), 1)
    x = np.arange(len(tps))
    for i, (batch, context) in enumerate(cases):
        mine = df[(df["batch"] == batch) & (df["context"] == context)].set_index("tp")
        where = x + (i - (len(cases) - 1) / 2) * width
        bottom = np.zeros(len(tps))
        fit = [t in mine.index and _may_fit(mine["fits"].get(t)) for t in tps]
        for key, _name, alpha in PARTS:
            part = np.array([float(mine[key].get(t, np.nan)) for t in tps])
            bars = time_ax.bar(where, np.nan_to_num(part), width, bottom=bottom,
                               color=cmap(i % 10), alpha=alpha, edgecolor="white",
                               )  # fmt: skip
            for bar, ok in zip(bars, fit, strict=True):
                if not ok:  # the step a memory cannot hold: drawn faint and hatched
                    bar.set_alpha(0.25)
                    bar.set_hatch("//")
            bottom += np.nan_to_num(part)
        for at, t, top in zip(where, tps, bottom, strict=True):
            fits = t in mine.index and _may_fit(mine["fits"].get(t))
            share = float(mine["allreduce_share"].get(t, np.nan))
            text = NOT_FIT if not fits else f"AR {share:.0%}"
            time_ax.annotate(text, (at, top), xytext=(0, 3), textcoords="offset points",
                             ha="center", va="bottom", fontsize=7, rotation=90)  # fmt: skip
        fitting = mine[mine["fits"].map(_may_fit).astype(bool)]
        speed_ax.plot(fitting.index, fitting["speedup"], marker="o", color=cmap(i % 10),
                      label=case_name(batch, context))  # fmt: skip
        for t, s in fitting["speedup"].items():
            if pd.notna(s):
                # cases alternate above and below their line, so near ones do not collide
                speed_ax.annotate(f"{plain(s)}x", (t, s), xytext=(5, 5 if i % 2 else -12),
                                  textcoords="offset points", fontsize=7, color=cmap(i % 10),
                                  bbox=dict(facecolor="white", edgecolor="none", pad=0.5,
                                            alpha=0.85))  # fmt: skip
    time_ax.set_xticks(x, [f"{t} GPU" + ("s" if t > 1 else "") for t in tps])
    time_ax.set_ylabel("projected decode step (ms)")
    top = max(float(df["step_ms"].max()), 1e-9)
    time_ax.set_ylim(0, top * 1.35)  # room for the labels above the tallest bar
    time_ax.set_title("where a decode step's time goes (shade: model, all-reduces, gather; "
                      "colour: batch and context)", fontsize=9)  # fmt: skip
    shades = [Patch(facecolor="gray", alpha=a, label=name) for _, name, a in PARTS]
    shades.append(Patch(facecolor="gray", alpha=0.25, hatch="//", label=NOT_FIT))
    time_ax.legend(handles=shades, fontsize=8, loc="upper right")
    time_ax.grid(True, axis="y", alpha=0.3)
    _speedup_axes(speed_ax, df, tps)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def _may_fit(fits) -> bool:
    """A row drawn as fitting: it fits, or the GPU's memory is unknown (None, NaN read back)."""
    return fits is None or fits != fits or bool(fits)


def _speedup_axes(ax, df: pd.DataFrame, tps: list[int]) -> None:
    """The ideal line from the fewest GPUs that fit (n / n0), log-2 GPU counts."""
    fits = df[df["fits"].map(_may_fit).astype(bool)]
    base = int(fits["speedup_over_tp"].min()) if fits["speedup_over_tp"].notna().any() else 1
    ideal = [t for t in tps if t >= base]
    ax.plot(ideal, [t / base for t in ideal], color="gray", ls="--", lw=1,
            label=f"ideal: n / {base} GPU" + ("s" if base > 1 else ""))  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(tps))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(tps) / 1.25, max(tps) * 1.45)  # room for the last point's label
    ax.set_xlabel("GPUs (tensor parallel)")
    ax.set_ylabel(f"speedup over {base} GPU" + ("s" if base > 1 else "") + " (same batch)")
    ax.set_ylim(bottom=0)
    ax.set_title("speedup: what the all-reduces leave of the ideal", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.3)
