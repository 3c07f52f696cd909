"""What each path costs the host: Figure 3 (host memory per engine, with the model's
estimate) and Figure 9 (CPU-seconds per GB against write bandwidth).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from analysis import cost
from analysis.figures.common import (
    COL1,
    COL2,
    color,
    engine_label,
    footer,
    marker,
    new_figure,
    styled,
    synthetic_subset,
)
from analysis.model.predict import predict
from analysis.model.profiles import Profile
from analysis.runs import Run, order_engines
from analysis.stats import case_stats
from bench.common.sizes import format_size


@styled
def host_memory(run: Run) -> Figure:
    """Pinned staging and page-cache peak per engine, as multiples of the checkpoint size."""
    fig, axes = new_figure(COL1, 2.7)
    ax = axes[0][0]
    ok = run.ok
    engines = order_engines(ok["engine"])
    pinned = ok.groupby("engine")["pinned_x"].median()
    cache = case_stats(ok, "page_cache_x", ["engine"]).set_index("engine")
    x = np.arange(len(engines))
    p = [pinned[e] for e in engines]
    c = [cache.loc[e, "median"] for e in engines]
    ax.bar(x, p, color=[color(e) for e in engines], width=0.6, label="pinned staging")
    ax.bar(
        x,
        c,
        bottom=p,
        color=[color(e) for e in engines],
        alpha=0.35,
        hatch="///",
        edgecolor="white",
        width=0.6,
        label="page-cache peak",
    )
    err = [
        [cache.loc[e, "median"] - cache.loc[e, "q25"] for e in engines],
        [cache.loc[e, "q75"] - cache.loc[e, "median"] for e in engines],
    ]
    ax.errorbar(x, np.add(p, c), yerr=err, fmt="none", ecolor="black", elinewidth=0.7, capsize=2)
    pred = [
        predict(_unit_profile(), e, 1, 1.0, run.traits(e)).host_bytes if run.traits(e) else np.nan
        for e in engines
    ]
    (mline,) = ax.plot(
        x,
        pred,
        linestyle="none",
        marker="_",
        markersize=14,
        markeredgewidth=1.5,
        color="black",
        label="model",
    )
    ax.set_xticks(x)
    ax.set_xticklabels([engine_label(ok, e).replace(" [", "\n[") for e in engines])
    ax.set_ylabel("host memory / checkpoint size (x S)")
    ax.set_ylim(0, max(2.9, float(np.nanmax(np.add(p, c))) * 1.3))
    ax.grid(axis="x", visible=False)
    handles = [
        Patch(facecolor="0.4", label="pinned staging"),
        Patch(
            facecolor="0.4",
            alpha=0.35,
            hatch="///",
            edgecolor="white",
            label="page-cache peak (bar: IQR)",
        ),
        mline,
    ]
    ax.legend(handles=handles, loc="upper left", ncols=2)
    ax.set_title("host memory per engine (median of all repetitions)")
    footer(fig, run, "dcp's staging copy is unpinned host memory: not counted as pinned")
    return fig


@styled
def host_cpu(run: Run) -> Figure:
    """CPU cost against write bandwidth, each engine through the tensor sizes of the largest
    checkpoint (smallest SSD count, as Figure 1): (a) in the stall, (b) while persisting;
    filled: the whole host (other processes and the idle baseline taken away), hollow: the
    process and its children. A run without the host columns draws the process alone."""
    fig, axes = new_figure(COL2, 2.6, ncols=3, sharey=True)
    df, total, n = synthetic_subset(run)
    if df.empty:
        df, total, n = run.ok, int(run.ok["total_bytes"].max()), int(run.ok["n_targets"].min())
        df = df[(df["total_bytes"] == total) & (df["n_targets"] == n)]
    rows = cost.per_row(df)
    host = rows["host_cpu_s_per_GB"].notna().any()
    proc_stall = rows["stall_cpu_s_per_GB"]
    proc_persist = rows["process_cpu_s_per_GB"] - proc_stall
    panels = [
        ("(a) stall: save() called until it returned", "stall_host_cpu_s_per_GB", proc_stall),
        ("(b) persist: until durable", "persist_host_cpu_s_per_GB", proc_persist),
    ]
    sizes = sorted(int(x) for x in rows["tensor_bytes"].unique())
    for ax, (title, col, proc) in zip(axes[0][:2], panels, strict=True):
        frame = rows.assign(process=proc)
        g = frame.groupby(["engine", "tensor_bytes"], sort=False).median(numeric_only=True)
        for e in order_engines(frame["engine"]):
            if e not in g.index.get_level_values(0):
                continue
            s = g.loc[e].sort_index()
            c = color(e)
            if host:
                ax.plot(
                    s["write_GBps"], s[col], color=c, marker=marker(e), label=engine_label(df, e)
                )
            ax.plot(
                s["write_GBps"],
                s["process"],
                color=c,
                marker=marker(e),
                markerfacecolor="white",
                linestyle=":" if host else "-",
                label=None if host else engine_label(df, e),
            )
            # the smallest and the largest tensor size, at their points
            for t in (s.index[0], s.index[-1]):
                y = s.loc[t, col] if host else s.loc[t, "process"]
                if np.isfinite(y) and y != 0:  # none for a path with no persist phase
                    ax.annotate(
                        format_size(int(t)),
                        (s.loc[t, "write_GBps"], y),
                        fontsize=5,
                        xytext=(2, 2),
                        textcoords="offset points",
                        color=c,
                    )
        ax.set_xlabel("write bandwidth to durability (GB/s)")
        ax.set_title(title)
        ax.set_xlim(left=0)
    _beside_floor(axes[0][2], run, rows, "host_cpu_s_per_GB" if host else "process_cpu_s_per_GB")
    axes[0][0].set_ylabel("CPU-seconds per GB durable")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [
        Line2D([], [], color="0.3", marker="o", label="whole host" if host else "process"),
        *(
            [
                Line2D(
                    [],
                    [],
                    color="0.3",
                    marker="o",
                    markerfacecolor="white",
                    linestyle=":",
                    label="this process and its children",
                )
            ]
            if host
            else []
        ),
    ]
    fig.legend(handles=handles, loc="outside right upper")
    fig.suptitle(
        f"{format_size(total)} checkpoint, {n} target(s), tensor sizes "
        f"{format_size(sizes[0])}-{format_size(sizes[-1])}"
        if sizes
        else "",
        fontsize=8,
    )
    footer(
        fig,
        run,
        "median of repetitions per tensor size; whole host = /proc/stat busy time less other "
        "processes' CPU and the run's idle baseline"
        + ("" if host else "; this run predates the host columns: process CPU only"),
    )
    return fig


def _beside_floor(ax: Any, run: Run, rows: pd.DataFrame, col: str) -> None:
    """Panel (c): each engine's whole save per GB (median over the checkpoint's repetitions) as
    a bar, its floor (analysis.cost.floor_of) as a black mark across it."""
    f = cost.floor(run)
    floors = cost.floor_table(run).set_index("engine") if f is not None else None
    names = [
        e for e in order_engines(rows["engine"]) if rows.loc[rows["engine"] == e, col].notna().any()
    ]
    for i, e in enumerate(names):
        v = float(rows.loc[rows["engine"] == e, col].median())
        ax.bar(i, v, color=color(e), width=0.7)
        if floors is not None and e in floors.index:
            fl = float(floors.loc[e, "floor_cpu_s_per_GB"])
            if np.isfinite(fl):
                ax.plot([i - 0.45, i + 0.45], [fl, fl], color="black", linewidth=1.5)
    ax.set_xticks(range(len(names)), names, rotation=60, fontsize=5)
    ax.set_title("(c) in all; black: its floor" if f is not None else "(c) in all (no floor)")


def _unit_profile() -> Profile:
    """A profile whose host-memory predictions are in units of S (bandwidths do not matter)."""
    return Profile("unit", "", 1.0, 1.0, 1, 1, 1.0, 1)
