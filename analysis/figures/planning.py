"""Figure 8: the fraction of training time lost against the mean time between failures, per
engine at its Young/Daly interval (analysis.model.planning).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from analysis.figures.common import COL1, color, footer, marker, new_figure, styled
from analysis.model.planning import plan
from analysis.model.profiles import Profile
from analysis.model.render import fmt_bytes
from analysis.runs import Run


@styled
def lost_fraction(
    prof: Profile,
    traits: dict[str, Any] | None = None,
    restart_s: float = 0.0,
    run: Run | None = None,
    restores: dict[str, float] | None = None,
) -> Figure:
    """Expected fraction of training time lost to checkpoint stalls and rework against the mean
    time between failures, per engine, each at its own best interval (`analysis.model.planning.plan`),
    a restart costing `restart_s` plus the path's restore (`restores`: measured, else the
    model's); with the run the profile was calibrated from, its footer (run id, HOST-EMULATED
    when it was)."""
    fig, axes = new_figure(COL1, 2.7)
    ax = axes[0][0]
    hours = np.logspace(0, 3, 40)
    plans = [plan(prof, h * 3600, restart_s, traits=traits, restores=restores) for h in hours]
    for i, e in enumerate(pl.engine for pl in plans[0]):
        ys = [100 * p[i].lost_fraction for p in plans]
        ax.plot(
            hours,
            ys,
            color=color(e),
            marker=marker(e),
            markevery=8,
            markersize=3,
            linewidth=1.0,
            label=e,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean time between failures (hours, log scale)")
    ax.set_ylabel("training time lost (%, log scale)")
    ax.set_title(
        f"{prof.name}: {fmt_bytes(prof.size_bytes)} per GPU, "
        f"{prof.gpus_sharing_host} GPU(s) at once",
        fontsize=7,
    )
    ax.legend(fontsize=6)
    where = {pl.restore_from for pl in plans[0]}
    back = (
        "each path's measured restore"
        if where == {"measured"}
        else "each path's restore as measured, else as modelled"
        if "measured" in where
        else "each path's modelled restore"
    )
    how = (
        "Young/Daly interval with the stall as the checkpoint cost; a "
        f"background persist bounds the interval from below; restart: {restart_s:g} s + {back}"
    )
    if run is not None:
        footer(fig, run, how + "; calibrated from this run")
    else:
        fig.text(0.01, 0.01, how, fontsize=5)
    return fig
