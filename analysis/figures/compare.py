"""`ckptbench compare`'s figure: each run's write bandwidth curves and the ratio per shared case."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from analysis.figures.common import (
    COL2,
    empty_panel,
    engine_label,
    iqr_line,
    new_figure,
    size_ticks,
    styled,
    synthetic_subset,
)
from analysis.runs import Run, order_engines
from analysis.stats import case_stats


@styled
def compare_bandwidth(runs: list[Run], table: pd.DataFrame, metric: str, xlabel: str) -> Figure:
    """(a) each run's write-bandwidth curves over tensor size; (b) run / A with its 95% CI per
    shared case."""
    fig, axes = new_figure(COL2, 2.9, ncols=2)
    ax, bx = axes[0]
    styles = ["-", "--", ":", "-."]
    sizes: set[int] = set()
    for i, r in enumerate(runs):
        df, _, _ = synthetic_subset(r)
        if df.empty:
            continue
        st = case_stats(df, "write_GBps", ["engine", "tensor_bytes"])
        for e in order_engines(st["engine"]):
            s = st[st["engine"] == e].sort_values("tensor_bytes")
            iqr_line(
                ax,
                s["tensor_bytes"],
                s,
                e,
                f"{chr(65 + i)}: {engine_label(df, e)}",
                linestyle=styles[i % 4],
            )
        sizes |= {int(x) for x in df["tensor_bytes"].unique()}
    if sizes:
        size_ticks(ax, sorted(sizes))
        ax.set_ylim(bottom=0)
        fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", ncols=3)
    else:
        empty_panel(ax, "no synthetic workloads")
    ax.set_xlabel("tensor size (log scale)")
    ax.set_ylabel("write bandwidth to durability (GB/s)")
    ax.set_title("(a) write bandwidth (smallest SSD count, largest checkpoint)")
    y = np.arange(len(table))
    if len(table):
        lo = (table["ratio"] - table["ci_low"]).fillna(0).to_numpy()
        hi = (table["ci_high"] - table["ratio"]).fillna(0).to_numpy()
        sig = table["significant"].to_numpy(dtype=bool)
        ratio = table["ratio"].to_numpy()
        for flag, mk in ((True, "o"), (False, "x")):
            m = sig == flag
            if m.any():
                bx.errorbar(
                    ratio[m],
                    y[m],
                    xerr=[lo[m], hi[m]],
                    fmt=mk,
                    capsize=2,
                    color="black" if flag else "0.55",
                    label="significant" if flag else "not significant",
                )
        bx.set_yticks(y)
        bx.set_yticklabels(
            [
                f"{r['run']}/A {r['engine']} {r['workload'].replace('synthetic-', '')}"
                f" x{r['n_targets']}"
                for r in table.to_dict("records")
            ],
            fontsize=6,
        )
        bx.invert_yaxis()
        bx.legend(loc="best")
    bx.axvline(1, color="black", linewidth=0.8)
    bx.set_xscale("log")
    finite = table[["ci_low", "ci_high", "ratio"]].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    lo_x, hi_x = (min(finite.min(), 1.0), max(finite.max(), 1.0)) if finite.size else (0.5, 2.0)
    ticks = [
        t
        for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)
        if lo_x / 1.3 <= t <= hi_x * 1.3
    ]
    bx.set_xlim(lo_x / 1.3, hi_x * 1.3)
    bx.set_xticks(ticks, [f"{t:g}" for t in ticks])
    bx.xaxis.set_minor_formatter(NullFormatter())
    bx.set_xlabel(xlabel)
    bx.set_title("(b) ratio of medians per shared case, 95% bootstrap CI")
    ids = "; ".join(f"{chr(65 + i)} = {r.run_id}" for i, r in enumerate(runs))
    loud = " HOST-EMULATED rows: not GPU numbers." if any(r.emulated for r in runs) else ""
    fig.supxlabel(
        textwrap.fill(ids + "." + loud, 140),
        fontsize=5.5,
        x=0.0,
        ha="left",
        color="#aa0000" if loud else "0.3",
    )
    return fig
