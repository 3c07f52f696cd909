"""Figures 10 and 11: how a checkpoint's cost grows with its size (analysis.scaling's fits):
stall and time to durability against size, log-log, with the fit and the model; and the host
memory each path held against size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from analysis.figures.common import (
    COL2,
    color,
    engine_label,
    footer,
    marker,
    new_figure,
    size_ticks,
    styled,
)
from analysis.model.predict import predict
from analysis.model.profiles import Profile
from analysis.runs import Run, order_engines
from analysis.scaling import METRICS, fits, medians


@styled
def times_figure(run: Run, prof: Profile | None) -> Figure:
    """Stall and time to durability against checkpoint size, log-log, per engine: medians
    (markers), the fitted power law (solid) and the model calibrated from the run (dashed)."""
    fig, axes = new_figure(COL2, 2.8, ncols=2)
    m = medians(run)
    table = fits(run)
    n = int(m["n_targets"].min()) if not m.empty else 1
    m = m[m["n_targets"] == n]
    sizes = sorted(int(s) for s in m["total_bytes"].unique())
    xs = np.geomspace(min(sizes), max(sizes), 40) if sizes else np.array([])
    for ax, metric in zip(axes[0], METRICS, strict=True):
        for e in order_engines(m["engine"]):
            g = m[m["engine"] == e].sort_values("total_bytes")
            fit = table[
                (table["engine"] == e) & (table["metric"] == metric) & (table["n_targets"] == n)
            ]
            lab = engine_label(run.ok, e)
            if not fit.empty:
                f = fit.iloc[0]
                lab += f" (slope {f['slope']:.2f})"
                ax.plot(xs, np.exp(f["intercept"]) * xs ** f["slope"], color=color(e))
            ax.plot(
                g["total_bytes"],
                g[metric],
                linestyle="none",
                marker=marker(e),
                color=color(e),
                label=lab,
            )
            if prof is not None and run.traits(e) is not None:
                key = "stall_s" if metric == "stall_s" else "durable_s"
                ys = [getattr(predict(prof, e, n, x, run.traits(e)), key) for x in xs]
                ax.plot(xs, ys, color=color(e), linestyle="--", linewidth=0.9, alpha=0.7)
        ax.set_yscale("log")
        if sizes:
            size_ticks(ax, sizes)
        ax.set_xlabel("checkpoint size")
        ax.set_ylabel(f"{METRICS[metric]} (s, log scale)")
        ax.set_title(f"{METRICS[metric]} against size, {n} target(s)")
        ax.legend(loc="lower right", fontsize=5.5)
    _finish(
        fig,
        axes,
        run,
        "markers: measured medians; solid: power-law fit (slope in the legend; 1 = linear); "
        "dashed: model calibrated from this run",
    )
    return fig


@styled
def memory_figure(run: Run) -> Figure:
    """What each path held in host memory against checkpoint size: pinned staging, the
    page-cache peak and the process's RSS peak (which holds the state when emulated)."""
    cols = {
        "pinned_bytes": "staging held (pinned on CUDA)",
        "page_cache_peak_bytes": "page-cache peak",
        "rss_peak_bytes": "RSS peak (the state included)",
    }
    fig, axes = new_figure(COL2, 2.6, ncols=3, sharey=True)
    m = medians(run)
    n = int(m["n_targets"].min()) if not m.empty else 1
    m = m[m["n_targets"] == n]
    sizes = sorted(int(s) for s in m["total_bytes"].unique())
    for ax, (col, title) in zip(axes[0], cols.items(), strict=True):
        for e in order_engines(m["engine"]):
            g = m[m["engine"] == e].sort_values("total_bytes")
            if col not in g:
                continue
            held = g[col].where(g[col] > 0)  # none held: not drawn on a log scale
            if held.isna().all():
                continue
            ax.plot(
                g["total_bytes"],
                held / 2**30,
                marker=marker(e),
                color=color(e),
                label=engine_label(run.ok, e),
            )
        if sizes:
            ax.plot(sizes, [s / 2**30 for s in sizes], color="black", linestyle=":", label="1x S")
        ax.set_yscale("log")
        if sizes:
            size_ticks(ax, sizes)
        ax.set_xlabel("checkpoint size")
        ax.set_title(title)
    axes[0][0].set_ylabel("GiB (log scale)")
    axes[0][-1].legend(loc="upper left")
    _finish(
        fig,
        axes,
        run,
        "medians over repetitions (an engine that held none is not drawn); RSS is the "
        "process's during the save: the state and the staging of every engine warmed on it; "
        "dotted: the checkpoint's own size",
    )
    return fig


def _finish(fig: Figure, axes: Any, run: Run, text: str) -> None:
    """Size labels turned so that neighbours do not run together, and the run's footer."""
    for ax in axes[0]:
        ax.tick_params(axis="x", labelrotation=45)
    footer(fig, run, text)
