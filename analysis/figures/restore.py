"""Figure 12: restore bandwidth (the checkpoint read back from a cold page cache into the device)
(a) against tensor size and (b) against SSD count, one line per engine, with the read ceiling
each engine is judged against dashed in grey (one line for the engines that share it) where
the run measured it.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.figures.common import (
    COL2,
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


CEILING_STYLES = ["--", ":", "-.", (0, (5, 1, 1, 1))]


def _ceilings(ax: Any, run: Run, points: dict[str, tuple[list[float], list[int]]]) -> bool:
    """The read ceiling of each engine at its points (x, its target count there), dashed in
    grey: one line for the engines judged against the same ceiling, labelled with them (a
    single point as a short dash); whether the run had any."""
    lines: dict[tuple[tuple[float, float], ...], list[str]] = {}
    for e, (xs, ns) in points.items():
        ys = [read_ceiling_Bps(run.env, run.traits(e), n) for n in ns]
        if any(ys):
            key = tuple((x, np.nan if y is None else y / GB) for x, y in zip(xs, ys, strict=True))
            lines.setdefault(key, []).append(e)
    for i, (key, engines) in enumerate(lines.items()):
        ax.plot(
            [x for x, _ in key],
            [y for _, y in key],
            color="0.35",
            linestyle=CEILING_STYLES[i % len(CEILING_STYLES)],
            linewidth=0.9,
            marker="_" if len(key) == 1 else "none",
            markersize=14,
            label="read ceiling: " + ", ".join(engines),
            gid="ceiling",
        )
    return bool(lines)


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
        at: dict[str, tuple[list[float], list[int]]] = {}
        for e in order_engines(st["engine"]):
            s = st[st["engine"] == e].sort_values("tensor_bytes")
            iqr_line(ax, s["tensor_bytes"], s, e, engine_label(df, e))
            xs = [float(x) for x in s["tensor_bytes"]]
            at[e] = (xs, [n] * len(xs))
        drawn |= _ceilings(ax, run, at)
        size_ticks(ax, sorted(int(x) for x in df["tensor_bytes"].unique()))
        ax.set_xlabel("tensor size (log scale)")
        ax.set_title(f"(a) {format_size(total)} checkpoint, {n} target(s)")
    ax.set_ylabel("restore bandwidth (GB/s)")
    wl = ssd_workload(run)
    rows = run.ok[run.ok["workload"] == wl]
    st = case_stats(rows, "restore_GBps")
    by_n: dict[str, tuple[list[float], list[int]]] = {}
    for e in order_engines(st["engine"]):
        s = st[st["engine"] == e].sort_values("n_targets")
        iqr_line(bx, s["n_targets"], s, e, engine_label(rows, e))
        ns = [int(x) for x in s["n_targets"]]
        by_n[e] = ([float(x) for x in ns], ns)
    drawn |= _ceilings(bx, run, by_n)
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
    if not df.empty:  # panel (b)'s ceilings group the engines as (a)'s may not
        for h, lab in zip(*bx.get_legend_handles_labels(), strict=True):
            if lab.startswith("read ceiling") and lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside right upper")
    extra = (
        "restore = checkpoint bytes / restore_s, from a cold page cache; median of repetitions, "
        "bars: IQR; grey, dashed or dotted: the read ceiling that judges the engines named (O_DIRECT read, "
        "or buffered read of a cold file for page-cache paths), the run's best"
        if drawn
        else "restore = checkpoint bytes / restore_s; median of repetitions, bars: IQR; this run "
        "measured no read ceilings"
    )
    if run.shared_device:
        extra += ". ALL TARGETS ON ONE DEVICE: SSD-count scaling on this run is not real scaling"
    footer(fig, run, extra)
    return fig
