"""Figure 1: write bandwidth to durability and restore bandwidth against tensor size."""

from __future__ import annotations

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
from analysis.runs import Run, order_engines
from analysis.stats import case_stats
from bench.common.sizes import format_size


@styled
def bandwidth_vs_tensor_size(run: Run) -> Figure:
    """(a) write bandwidth to durability and (b) restore bandwidth against tensor size."""
    fig, axes = new_figure(COL2, 2.5, ncols=2)
    df, total, n = synthetic_subset(run)
    panels = [
        ("write_GBps", "write bandwidth to durability (GB/s)", "(a) write: bytes / total_s"),
        ("restore_GBps", "restore bandwidth (GB/s)", "(b) restore: bytes / restore_s"),
    ]
    if not df.empty:
        fig.suptitle(f"{format_size(total)} checkpoint, {n} target(s)", fontsize=8)
    for ax, (metric, ylabel, title) in zip(axes[0], panels, strict=True):
        if df.empty:
            empty_panel(ax, "no synthetic workloads in this run")
            continue
        st = case_stats(df, metric, ["engine", "tensor_bytes"])
        for e in order_engines(st["engine"]):
            s = st[st["engine"] == e].sort_values("tensor_bytes")
            iqr_line(ax, s["tensor_bytes"], s, e, engine_label(df, e))
        size_ticks(ax, sorted(int(x) for x in df["tensor_bytes"].unique()))
        ax.set_xlabel("tensor size (log scale)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_title(title)
    if not df.empty:
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside right upper")
    footer(fig, run, "median of repetitions; error bars: interquartile range")
    return fig
