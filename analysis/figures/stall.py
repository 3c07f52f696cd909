"""Figure 2: stall against SSD count per workload, measured beside the model."""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.figures.common import (
    COL1,
    COL2,
    color,
    engine_label,
    footer,
    iqr_line,
    new_figure,
    styled,
)
from analysis.model.predict import predict
from analysis.model.profiles import Profile
from analysis.runs import Run, order_engines
from analysis.stats import case_stats
from bench.common.sizes import format_size

# Characters a panel title's line may hold at the house title size (8 pt): a panel of the
# two-column figure is a third of it wide when there are three, and titles longer than their
# panel ran into their neighbours'.
TITLE_CHARS = {1: 60, 2: 44, 3: 28}


def panel_title(workload: str, size: int, ncols: int) -> str:
    """A panel's title, the workload and its size, wrapped to lines that fit the panel (at
    spaces, hyphens and underscores; a name without any is cut where it must)."""
    width = TITLE_CHARS.get(ncols, 28)
    words = workload.replace("_", "_ ").split(" ")
    lines = textwrap.wrap(" ".join(words) + f" ({format_size(size)})", width, break_on_hyphens=True)
    # put back the underscores' own spaces: "a_ b" was one word cut after its underscore
    return "\n".join(ln.replace("_ ", "_") for ln in lines)


@styled
def stall_vs_ssds(run: Run, prof: Profile | None) -> Figure:
    """Stall against SSD count per workload, measured (markers, IQR bars) beside the model."""
    wls = list(dict.fromkeys(run.ok["workload"]))
    ncols = min(len(wls), 3)
    nrows = (len(wls) + ncols - 1) // ncols
    fig, axes = new_figure(
        COL2 if ncols > 1 else COL1 + 1.5, 2.3 * nrows, ncols=ncols, nrows=nrows, sharey=True
    )
    flat = list(axes.flat)
    st = case_stats(run.ok, "stall_s")
    counts = sorted(int(x) for x in run.ok["n_targets"].unique())
    # the model between the measured SSD counts (a short dash when there is only one)
    xs = (
        np.linspace(min(counts), max(counts), 50)
        if len(counts) > 1
        else counts[0] + np.array([-0.2, 0.2])
    )
    xs_n = np.clip(xs, min(counts), max(counts))
    for ax, wl in zip(flat, wls, strict=False):
        s_wl = st[st["workload"] == wl]
        size = float(run.ok.loc[run.ok["workload"] == wl, "total_bytes"].median())
        for e in order_engines(s_wl["engine"]):
            s = s_wl[s_wl["engine"] == e].sort_values("n_targets")
            iqr_line(ax, s["n_targets"], s, e, engine_label(run.ok, e), linestyle="none")
            if prof is not None and run.traits(e) is not None:
                ys = [predict(prof, e, x, size, run.traits(e)).stall_s for x in xs_n]
                ax.plot(
                    xs,
                    ys,
                    color=color(e),
                    linestyle="--",
                    linewidth=0.9,
                    alpha=0.8,
                    label="_model",
                    gid="model",
                )
        ax.set_yscale("log")
        ax.set_xticks(counts)
        ax.set_xlim(min(counts) - 0.3, max(counts) + 0.3)
        ax.set_xlabel("SSDs (targets)")
        ax.set_title(panel_title(wl, int(size), ncols))
    for ax in flat[len(wls) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("stall (s, log scale)")
    handles, labels = flat[0].get_legend_handles_labels()
    if prof is not None:
        handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.9))
        labels.append("model (same colour)")
    fig.legend(handles, labels, loc="outside right upper")
    extra = "markers: measured median, bars: IQR; dashed: model calibrated from this run"
    if run.shared_device:
        extra += ". ALL TARGETS ON ONE DEVICE: SSD-count scaling on this run is not real scaling"
    footer(fig, run, extra)
    return fig
