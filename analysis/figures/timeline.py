"""Figure 5: one checkpoint per engine on a time axis, stall and persist phases."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis.figures.common import (
    COL2,
    color,
    engine_label,
    footer,
    new_figure,
    styled,
    synthetic_subset,
)
from analysis.runs import Run, order_engines
from analysis.stats import median_row


def timeline_case(run: Run) -> pd.DataFrame:
    """Rows of the case the timeline draws: the largest synthetic checkpoint with its largest
    tensors, at the smallest SSD count (else the largest model workload)."""
    df, _, _ = synthetic_subset(run)
    if df.empty:
        ok = run.ok
        df = ok[ok["total_bytes"] == ok["total_bytes"].max()]
        df = df[df["n_targets"] == df["n_targets"].min()]
    wl = df.sort_values("tensor_bytes", ascending=False, kind="stable")["workload"].iloc[0]
    return df[df["workload"] == wl]


@styled
def timeline(run: Run) -> Figure:
    """One checkpoint per engine on a time axis: stall (training waits), persist (background),
    checksum time inside persist; from the median repetition of one case."""
    df = timeline_case(run)
    wl, n = str(df["workload"].iloc[0]), int(df["n_targets"].iloc[0])
    engines = order_engines(df["engine"])
    fig, axes = new_figure(COL2, 0.42 * len(engines) + 1.1)
    ax = axes[0][0]
    for i, e in enumerate(engines):
        r = median_row(df[df["engine"] == e])
        y = len(engines) - 1 - i
        stall, tot = float(r["stall_s"]), float(r["total_s"])
        t = run.traits(e)
        whole_stall = t is not None and t.stall == "durable"
        ax.barh(y, tot if whole_stall else stall, left=0, height=0.6, color=color(e))
        if not whole_stall and tot > stall:
            ax.barh(
                y,
                tot - stall,
                left=stall,
                height=0.6,
                color=color(e),
                alpha=0.3,
                hatch="///",
                edgecolor="white",
            )
            h = float(r["hash_s"])
            if h > 0:
                ax.barh(y, min(h, tot - stall), left=stall, height=0.18, color="black")
        ax.text(tot, y, f"  stall {stall:.3g} s, durable {tot:.3g} s", va="center", fontsize=6)
    ax.set_yticks(range(len(engines)))
    ax.set_yticklabels([engine_label(df, e) for e in reversed(engines)])
    ax.set_xlabel("time from save() (s)")
    ax.set_xlim(0, float(df["total_s"].max()) * 1.45)
    ax.grid(axis="y", visible=False)
    ax.set_title(
        f"one checkpoint per engine: {wl}, {n} target(s), the median repetition by total_s"
    )
    handles = [
        Patch(facecolor="0.3", label="stall: training waits"),
        Patch(
            facecolor="0.3",
            alpha=0.3,
            hatch="///",
            edgecolor="white",
            label="persist: in the background",
        ),
        Patch(facecolor="black", label="checksums (within persist; placement indicative)"),
    ]
    ax.legend(handles=handles, loc="lower right")
    footer(
        fig,
        run,
        "phases from each row's stall_s, total_s and hash_s; gds and torch-save stall until durable",
    )
    return fig
