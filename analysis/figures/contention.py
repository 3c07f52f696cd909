"""Figure 7: many ranks at once, the slowest rank's stall and the aggregate write bandwidth
against the ranks checkpointing together (analysis.contention).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis import contention as contention_mod
from analysis.figures.common import (
    COL2,
    color,
    empty_panel,
    engine_label,
    footer,
    marker,
    new_figure,
    styled,
)
from analysis.model.profiles import Profile
from analysis.runs import Run, order_engines
from bench.common.sizes import format_size
from bench.measure.ceilings import DIRECT_WRITE, RunCeilings

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

MAP_STYLES: dict[str, LineStyleType] = {
    "shared": "-",
    "dedicated": "--",
    "dedicated-subfolders": "--",
}


@styled
def contention(run: Run, prof: Profile | None) -> Figure:
    """Many ranks at once (multi-rank runs): (a) stall (the slowest rank) and (b) aggregate write
    bandwidth against the ranks checkpointing at once, one colour per engine, solid for shared
    targets and dashed for dedicated ones, the model's fair share dotted."""
    t = contention_mod.table(run, prof)
    wl_sizes = t.groupby("workload")["total_bytes"].max() if len(t) else pd.Series(dtype=float)
    wl = str(wl_sizes.idxmax()) if len(wl_sizes) else ""
    t = t[t["workload"] == wl]
    counts = sorted(int(x) for x in t["n_targets"].unique())[:3] or [1]
    fig, axes = new_figure(COL2, 2.4 * len(counts) + 0.3, ncols=2, nrows=len(counts))
    mappings = contention_mod.maps(t)
    ceil = RunCeilings.from_env(run.env).before
    for row, n in zip(axes, counts, strict=True):
        ax, bx = row
        if t.empty:
            empty_panel(ax, "no multi-rank cases in this run")
            empty_panel(bx, "no multi-rank cases in this run")
            continue
        ks = sorted(int(k) for k in t.loc[t["n_targets"] == n, "ranks_active"].unique())
        for e in order_engines(t["engine"]):
            drawn: list[tuple[float, ...]] = []
            for m in mappings:
                s = contention_mod.series(t, wl, n, e, m)
                if s.empty:
                    continue
                ls = MAP_STYLES.get(m, ":")
                face = color(e) if m == "shared" else "white"
                # the one-rank point is the first mapping's; later mappings leave its marker
                every = list(
                    range(1 if m != mappings[0] and s["ranks_active"].iloc[0] == 1 else 0, len(s))
                )
                for a, y, lo, hi in (
                    (ax, "stall_s", "stall_q25", "stall_q75"),
                    (bx, "agg_GBps", "agg_q25", "agg_q75"),
                ):
                    a.errorbar(
                        s["ranks_active"],
                        s[y],
                        yerr=[s[y] - s[lo], s[hi] - s[y]],
                        color=color(e),
                        linestyle=ls,
                        marker=marker(e),
                        markerfacecolor=face,
                        markevery=every,
                        capsize=2,
                        elinewidth=0.7,
                        label=f"{engine_label(run.ranked, e)}, {m}",
                    )
                key = tuple(np.round(s["model_stall_s"].to_numpy(dtype=float), 12))
                if key not in drawn and np.isfinite(s["model_stall_s"]).any():
                    drawn.append(key)
                    for a, y in ((ax, "model_stall_s"), (bx, "model_GBps")):
                        a.plot(
                            s["ranks_active"],
                            s[y],
                            color=color(e),
                            linestyle=":",
                            linewidth=0.9,
                            alpha=0.8,
                            label="_model",
                        )
        c = ceil.at(DIRECT_WRITE, n) if ceil else None
        if c is not None and c.Bps:
            bx.axhline(
                c.Bps / 1e9,
                color="0.4",
                linewidth=0.7,
                linestyle=(0, (1, 2)),
                label=f"{DIRECT_WRITE.label} ceiling, {n} target(s), 1 process",
            )
        for a in (ax, bx):
            a.set_xticks(ks)
            a.set_xlim(min(ks) - 0.4, max(ks) + 0.4)
            a.set_xlabel("ranks checkpointing at once")
        ax.set_yscale("log")
        ax.set_ylabel("stall, slowest rank (s, log)")
        bx.set_ylim(bottom=0)
        size = format_size(int(t["total_bytes"].max())) if len(t) else "?"
        ax.set_title(f"(a) stall, {size} in all, {n} SSD(s)", loc="left")
        bx.set_title("(b) aggregate write: all bytes / slowest total_s", loc="left")
        bx.set_ylabel("aggregate write (GB/s)")
    engines = order_engines(t["engine"]) if len(t) else []
    handles = [
        Line2D(
            [],
            [],
            color=color(e),
            marker=marker(e),
            linestyle="none",
            label=engine_label(run.ranked, e),
        )
        for e in engines
    ]
    handles += [
        Line2D(
            [],
            [],
            color="0.3",
            linestyle=MAP_STYLES.get(m, ":"),
            marker="o",
            markerfacecolor="0.3" if m == "shared" else "white",
            label=f"{m} targets",
        )
        for m in mappings
    ]
    handles.append(
        Line2D(
            [], [], color="0.3", linestyle=":", linewidth=0.9, label="model: fair share of the host"
        )
    )
    handles += [
        h for h in axes[0][1].get_legend_handles_labels()[0] if h.get_label().startswith("O_DIRECT")
    ]
    fig.legend(handles=handles, loc="outside upper center", ncols=4)
    extra = (
        "aggregate rows, median of repetitions, bars: IQR; one rank alone stands for every "
        "mapping; hollow markers: dedicated targets"
    )
    if run.shared_device:
        extra += ". ALL TARGETS ON ONE DEVICE: shared and dedicated targets share its bandwidth"
    footer(fig, run, extra)
    return fig
