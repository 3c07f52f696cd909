"""Figure 4: (a) GDS stall / CPU-centric stall against SSDs per GPU for each hardware profile, with
the break-even points: the figure that answers "is GDS worth it"; (b) the same question for
loading a checkpoint: CPU-centric restore time / GDS restore time, from the profiles' read
figures (cited, or marked assumed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from analysis.figures.common import COL2, footer, new_figure, styled
from analysis.model.predict import (
    break_even,
    break_even_ssds,
    restore_break_even,
    restore_gain,
    stall_ratio,
)
from analysis.model.profiles import Profile
from analysis.runs import Run

PROFILE_STYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1))]


@styled
def feasibility(profiles: list[Profile], run: Run | None = None, max_ssds: int = 20) -> Figure:
    """(a) GDS stall / CPU-centric stall and (b) CPU-centric restore / GDS restore against SSDs
    per GPU, one line per hardware profile, with each break-even point and today's ~1 data SSD
    per GPU marked."""
    fig, axes = new_figure(COL2, 3.6, ncols=2)
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
    ax.set_title("(a) saving: R(n) = d / min(L, n w)")
    restore_panel(axes[0][1], profiles, xs)
    handles = [h for h in ax.get_legend_handles_labels()[0] if h not in (today, below)]
    fig.legend(handles=[*handles, today, below], loc="outside upper center", ncols=2, fontsize=5.8)
    text = (
        "model; profiles: configs/hardware/*.yaml, figures from shared/reference/figures.md. "
        "(a) dots: break-even SSDs per GPU. (b) r one SSD's read, h the host-to-device link, "
        "h_g = min(h, C/g) a GPU's share of the host's memory; dots: from there GDS loads "
        "faster; 'read figures assumed': the profile cites no SSD read or host-to-device figure"
    )
    if run is not None:
        footer(fig, run, text + "; this-machine calibrated from this run")
    else:
        fig.supxlabel(text, fontsize=5.5, color="0.3", x=0.0, ha="left")
    return fig


def restore_label(p: Profile) -> str:
    """A profile's name in the restore panel, saying where its read figures are assumed or
    where it has none."""
    if p.ssd_read_Bps is None and not p.direct_read_by_n:
        return f"{p.name}: no read figure, not modelled"
    if p.h2d_Bps is None:
        return f"{p.name}: no host-to-device link (restores land in host memory)"
    return p.name + (" (read figures assumed)" if p.assumed("ssd_read_GBps", "h2d_GBps") else "")


def restore_panel(ax: Any, profiles: list[Profile], xs: np.ndarray) -> None:
    """(b): CPU-centric restore time / GDS restore time against SSDs per GPU, one line per
    profile (the same styles as (a)), a dot where GDS starts to load faster."""
    ax.axhline(1, color="black", linewidth=0.6)
    top = 1.0
    for i, p in enumerate(profiles):
        ys = restore_gain(p, xs)
        if not np.isfinite(ys).any():
            ys = np.full(len(xs), np.nan)
        else:
            top = max(top, float(np.nanmax(ys)))
        ax.plot(
            xs,
            ys,
            linestyle=PROFILE_STYLES[i % len(PROFILE_STYLES)],
            color=f"C{i}",
            label=restore_label(p),
        )
        n = restore_break_even(p)
        if np.isfinite(n) and n <= xs[-1]:
            ax.plot([n], [1], marker="o", color=f"C{i}", markersize=4, label="_nolegend_")
    ax.set_ylim(0.9, top * 1.15)
    ax.set_xlim(0.6, xs[-1] + 0.4)
    ax.set_xticks([1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20][: len(xs)])
    ax.set_xlabel("SSDs per GPU, n")
    ax.set_ylabel("CPU-centric restore / GDS restore")
    ax.set_title("(b) loading: min(n r, h) / min(n r, h_g)")
    ax.legend(fontsize=5.5, loc="lower right")
