"""Figure 4: GDS stall / CPU-centric stall against SSDs per GPU for each hardware profile, with
the break-even points: the figure that answers "is GDS worth it".
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from analysis.figures.common import COL1, footer, new_figure, styled
from analysis.model.predict import break_even, break_even_ssds, stall_ratio
from analysis.model.profiles import Profile
from analysis.runs import Run

PROFILE_STYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1))]


@styled
def feasibility(profiles: list[Profile], run: Run | None = None, max_ssds: int = 20) -> Figure:
    """GDS stall / CPU-centric stall against SSDs per GPU, one line per hardware profile, with
    each break-even point and today's ~1 data SSD per GPU marked."""
    fig, axes = new_figure(COL1, 3.6)
    ax = axes[0][0]
    xs = np.arange(1, max_ssds + 1)
    top = max(float(np.max(stall_ratio(p, xs))) for p in profiles) if profiles else 10
    today = ax.axvspan(
        0.75,
        1.25,
        color="#ffd27f",
        alpha=0.6,
        linewidth=0,
        label="today's 8-GPU servers: ~1 data SSD per GPU",
    )
    below = ax.axhspan(
        0.5,
        1,
        color="#c7e9c0",
        alpha=0.6,
        linewidth=0,
        label="GDS stalls no longer than CPU-centric",
    )
    ax.axhline(1, color="black", linewidth=0.6)
    for i, p in enumerate(profiles):
        ys = stall_ratio(p, xs)
        name = p.name + (" (one shared device)" if p.shared_device else "")
        (ln,) = ax.plot(
            xs, ys, linestyle=PROFILE_STYLES[i % len(PROFILE_STYLES)], label=name, color=f"C{i}"
        )
        be = break_even(p)
        if np.isfinite(be) and be <= max_ssds:
            ax.plot([be], [1], marker="o", color=ln.get_color(), markersize=4, label="_nolegend_")
            ax.annotate(
                f"{break_even_ssds(p)}",
                (be, 1),
                textcoords="offset points",
                xytext=(0, -8),
                ha="center",
                va="top",
                fontsize=6,
                fontweight="bold",
                color=ln.get_color(),
            )
    ax.set_yscale("log")
    ax.set_ylim(0.55, top * 1.6)
    ax.set_xlim(0.6, max_ssds + 0.4)
    ax.set_xticks([1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20][:max_ssds])
    ax.set_xlabel("SSDs per GPU, n")
    ax.set_ylabel("GDS stall / CPU-centric stall (log scale)")
    ax.set_title("R(n) = b / min(L, n w); dots: break-even SSDs per GPU")
    handles = [h for h in ax.get_legend_handles_labels()[0] if h not in (today, below)]
    fig.legend(handles=[*handles, today, below], loc="outside upper center", ncols=2, fontsize=5.8)
    text = "model; profiles: configs/hardware/*.yaml, figures from shared/reference/figures.md"
    if run is not None:
        footer(fig, run, text + "; this-machine calibrated from this run")
    else:
        fig.supxlabel(text, fontsize=5.5, color="0.3", x=0.0, ha="left")
    return fig
