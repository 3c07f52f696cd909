"""Figure 12: restore bandwidth (the checkpoint read back from a cold page cache into the device)
(a) against tensor size and (b) against SSD count, one line per engine, with the read ceiling
each engine is judged against dashed in its colour where the run measured it.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.figures.common import (
    COL2,
    color,
    empty_panel,
    engine_label,
    footer,
    iqr_line,
    new_figure,
    size_ticks,
    styled,
    synthetic_subset,
)
from analysis.runs import GB, Run, order_engines
from analysis.stats import case_stats, read_ceiling_Bps
from bench.common.sizes import format_size


def ssd_workload(run: Run) -> str:
    """The workload panel (b) follows across SSD counts: the synthetic one of the largest
    checkpoint with the largest tensors (bandwidth, not per-tensor cost), else the first."""
    syn = run.ok[run.ok["tensor_bytes"] > 0]
    if syn.empty:
        return str(run.ok["workload"].iloc[0])
    big = syn[syn["total_bytes"] == syn["total_bytes"].max()]
    return str(big.sort_values("tensor_bytes")["workload"].iloc[-1])


def _ceiling(ax: Any, run: Run, engine: str, xs: list[float], ns: list[int]) -> bool:
    """The engine's read ceiling at each point (its target count `ns`), dashed in its colour;
    whether the run had one."""
    ys = [read_ceiling_Bps(run.env, run.traits(engine), n) for n in ns]
    if not any(ys):
        return False
    ax.plot(
        xs,
        [np.nan if y is None else y / GB for y in ys],
        color=color(engine),
        linestyle="--",
        linewidth=0.9,
        alpha=0.8,
        label="_ceiling",
        gid="ceiling",
    )
    return True


@styled
def restore_figure(run: Run) -> Figure:
    """(a) restore GB/s against tensor size (the largest checkpoint, the fewest targets) and (b)
    against SSD count (one workload), measured medians with IQR bars, read ceilings dashed."""
    fig, axes = new_figure(COL2, 2.6, ncols=2)
    ax, bx = axes[0]
    df, total, n = synthetic_subset(run)
    drawn = False
    if df.empty:
        empty_panel(ax, "no synthetic workloads in this run")
    else:
        st = case_stats(df, "restore_GBps", ["engine", "tensor_bytes"])
        for e in order_engines(st["engine"]):
            s = st[st["engine"] == e].sort_values("tensor_bytes")
            iqr_line(ax, s["tensor_bytes"], s, e, engine_label(df, e))
            xs = [float(x) for x in s["tensor_bytes"]]
            drawn |= _ceiling(ax, run, e, xs, [n] * len(xs))
        size_ticks(ax, sorted(int(x) for x in df["tensor_bytes"].unique()))
        ax.set_xlabel("tensor size (log scale)")
        ax.set_title(f"(a) {format_size(total)} checkpoint, {n} target(s)")
    ax.set_ylabel("restore bandwidth (GB/s)")
    wl = ssd_workload(run)
    rows = run.ok[run.ok["workload"] == wl]
    st = case_stats(rows, "restore_GBps")
    for e in order_engines(st["engine"]):
        s = st[st["engine"] == e].sort_values("n_targets")
        iqr_line(bx, s["n_targets"], s, e, engine_label(rows, e))
        ns = [int(x) for x in s["n_targets"]]
        drawn |= _ceiling(bx, run, e, [float(x) for x in ns], ns)
    counts = sorted(int(x) for x in rows["n_targets"].unique())
    bx.set_xticks(counts)
    bx.set_xlim(min(counts) - 0.3, max(counts) + 0.3)
    bx.set_xlabel("SSDs (targets)")
    bx.set_ylabel("restore bandwidth (GB/s)")
    size = int(pd.to_numeric(rows["total_bytes"]).median())
    bx.set_title("\n".join(textwrap.wrap(f"(b) {wl} ({format_size(size)})", 44)))
    for a in (ax, bx):
        a.set_ylim(bottom=0)
    handles, labels = (bx if df.empty else ax).get_legend_handles_labels()
    if drawn:
        handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.9))
        labels.append("read ceiling (same colour)")
    fig.legend(handles, labels, loc="outside right upper")
    extra = (
        "restore = checkpoint bytes / restore_s, from a cold page cache; median of repetitions, "
        "bars: IQR; dashed: the read ceiling that judges the engine (O_DIRECT read, or buffered "
        "read of a cold file for page-cache paths), the run's best"
        if drawn
        else "restore = checkpoint bytes / restore_s; median of repetitions, bars: IQR; this run "
        "measured no read ceilings"
    )
    if run.shared_device:
        extra += ". ALL TARGETS ON ONE DEVICE: SSD-count scaling on this run is not real scaling"
    footer(fig, run, extra)
    return fig
