"""Figure 6: stall in a real training loop, step times against the step and the inflation
per checkpoint (analysis.training).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from analysis import training
from analysis.figures.common import COL2, color, styled
from bench.common.sizes import format_size

CONTENTION = "#ff7f0e"  # no engine's colour


def _step_x(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Times (s from the loop's start) and step positions: step s spans x in [s-0.5, s+0.5]."""
    st = steps.sort_values("step")
    t = np.column_stack([st["t_start_s"], st["t_end_s"]]).ravel()
    x = np.column_stack([st["step"] - 0.5, st["step"] + 0.5]).ravel()
    return t, x


@styled
def training_stall(tr: training.TrainingRun) -> Figure:
    """(a) step time against step number, one panel per engine (checkpoint steps marked, persist
    windows shaded, `none`'s median dashed); (b) measured inflation per checkpoint beside the
    engine's median stall_s."""
    engines = tr.engines
    ncols = 2 if len(engines) > 1 else 1
    nrows = -(-len(engines) // ncols)
    fig = Figure(figsize=(COL2, 1.35 * nrows + 2.9), layout="constrained")
    top_fig, bot_fig = fig.subfigures(2, 1, squeeze=False, height_ratios=[1.35 * nrows + 0.6, 2.3])[
        :, 0
    ]
    base = tr.steps.loc[tr.steps["engine"] == training.NONE, "step_s"]
    base_med = float(base.median()) if len(base) else None
    top = float(tr.steps["step_s"].max()) * 1.08
    first = None
    for i, e in enumerate(engines):
        ax = top_fig.add_subplot(nrows, ncols, i + 1, sharex=first, sharey=first)
        first = first or ax
        st = tr.steps[tr.steps["engine"] == e].sort_values("step")
        c = color(e) if e != training.NONE else "0.35"
        t, x = _step_x(st)
        for _, r in tr.timed_ckpts[tr.timed_ckpts["engine"] == e].iterrows():
            x0, x1 = np.interp([r["t_return_s"], r["t_durable_s"]], t, x)
            if x1 - x0 > 1e-6:
                ax.axvspan(x0, x1, color=c, alpha=0.15, linewidth=0)
        ax.plot(
            st["step"],
            st["step_s"],
            color=c,
            marker=".",
            markersize=2.5,
            linewidth=0.9,
            label=tr.label(e),
        )
        ck = st[st["checkpoint"]]
        if len(ck):
            ax.plot(
                ck["step"],
                ck["step_s"],
                linestyle="none",
                marker="v",
                color="black",
                markersize=3.5,
                label="_checkpoint",
            )
        if base_med is not None:
            ax.axhline(base_med, color="black", linestyle="--", linewidth=0.7, label="_none")
        ax.set_title(tr.label(e), loc="left", pad=2)
        ax.set_ylim(0, top)
        if i % ncols == 0:
            ax.set_ylabel("step time (s)")
        if i >= len(engines) - ncols:
            ax.set_xlabel("training step")
    handles = [
        Line2D([], [], color="0.3", marker=".", linewidth=0.9, label="step time"),
        Line2D(
            [],
            [],
            linestyle="none",
            marker="v",
            color="black",
            label="step with a save() (stall inside)",
        ),
        Patch(facecolor="0.3", alpha=0.15, label="background persist running"),
        Line2D(
            [],
            [],
            color="black",
            linestyle="--",
            linewidth=0.7,
            label="median step time without checkpoints (none)",
        ),
    ]
    top_fig.legend(handles=handles, loc="outside lower center", ncols=4)
    top_fig.suptitle(
        "(a) step time against training step, one panel per engine", fontsize=8, x=0.0, ha="left"
    )

    bx = bot_fig.add_subplot(1, 1, 1)
    table = training.summary(tr)
    table = table[table["engine"] != training.NONE]
    xs = np.arange(len(table))
    w = 0.27
    cols = [color(e) for e in table["engine"]]
    bx.bar(xs - w, table["inflation_vs_none_s"], width=w, color=cols, label="inflation vs none")
    bx.bar(
        xs,
        table["save_step_s"],
        width=w,
        color=cols,
        alpha=0.55,
        label="inflation vs quiet steps: the save() step",
    )
    bx.bar(
        xs,
        table["contention_s"],
        bottom=table["save_step_s"].clip(lower=0),
        width=w,
        color=CONTENTION,
        label="inflation vs quiet steps: contention beside the persist",
    )
    bx.bar(
        xs + w,
        table["stall_s"],
        width=w,
        color=cols,
        alpha=0.45,
        hatch="///",
        edgecolor="white",
        label="engine: median stall_s",
    )
    bx.axhline(0, color="black", linewidth=0.6)
    bx.set_xticks(xs)
    bx.set_xticklabels([lab.replace(" [", "\n[") for lab in table["label"]])
    bx.set_ylabel("seconds per checkpoint")
    bx.grid(axis="x", visible=False)
    bx.legend(
        handles=[
            Patch(facecolor="0.3", label="inflation vs none: sum of step times - none's"),
            Patch(
                facecolor="0.3", alpha=0.55, label="inflation vs own quiet steps: the save() step"
            ),
            Patch(facecolor=CONTENTION, label="  + contention beside the persist"),
            Patch(
                facecolor="0.3",
                alpha=0.45,
                hatch="///",
                edgecolor="white",
                label="engine: median stall_s",
            ),
        ],
        loc="upper left",
        ncols=2,
    )
    lo, hi = bx.get_ylim()
    bx.set_ylim(lo, hi + 0.45 * (hi - lo))  # room for the legend above the bars
    bx.set_title("(b) what training felt against what the engine reports", loc="left")
    size = format_size(int(table["bytes"].max())) if len(table) and table["bytes"].max() else "?"
    parts = [f"run {tr.run_id}; checkpoint {size} (params + AdamW states)"]
    if tr.emulated:
        parts.append(
            "HOST-EMULATED (no GPU): the model trains in host memory; "
            "gds = O_DIRECT emulation, not GPUDirect Storage"
        )
    fig.supxlabel(
        "\n".join(textwrap.fill(p, 120) for p in parts),
        fontsize=5.5,
        x=0.0,
        ha="left",
        color="#aa0000" if tr.emulated else "0.3",
    )
    return fig
