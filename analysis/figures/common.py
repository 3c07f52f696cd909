"""The report's figures, as matplotlib Figure objects (Agg backend), and saving them as PNG + PDF.

Publication style: one column (3.5 in) or two (7.1 in) wide, 8 pt text, labelled axes with
units (GB/s = 1e9 B/s), error bars = interquartile range over repetitions, one colour and marker
per engine throughout. Emulated and compat rows carry "[emulated]" / "[compat]" in every legend,
and a footer says when a whole run is host-emulated or its targets share one device.

This module is what every figure shares: the house style (`STYLE`, `styled`), one colour and
marker per engine, the run's footer, the panel helpers and `save`. It imports analysis.runs
only.
"""

from __future__ import annotations

import functools
import os
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType  # matplotlib >= 3.9; mypy checks the keys with it

from analysis.runs import Run, label
from bench.common.sizes import format_size

COL1, COL2 = 3.5, 7.1  # inches: one and two columns
COLORS = {
    "gds": "#d62728",
    "cpu-single": "#1f77b4",
    "cpu-double": "#2ca02c",
    "torch-save": "#7f7f7f",
    "dcp": "#9467bd",
}
MARKERS = {"gds": "o", "cpu-single": "s", "cpu-double": "^", "torch-save": "D", "dcp": "v"}
STYLE: dict[RcKeyType, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 6.5,
    "legend.frameon": False,
    "lines.linewidth": 1.3,
    "lines.markersize": 4,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "pdf.fonttype": 42,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure inside the house style (fonts and sizes apply when artists are made)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with plt.rc_context(STYLE):
            return fn(*args, **kwargs)

    return wrapper


def color(engine: str) -> str:
    return COLORS.get(engine, "black")


def marker(engine: str) -> str:
    return MARKERS.get(engine, "x")


def new_figure(
    width: float, height: float, ncols: int = 1, nrows: int = 1, **kw: Any
) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def footer(fig: Figure, run: Run, extra: str = "") -> None:
    """The run id, and loud words when the numbers are not real GPU / GDS / multi-SSD numbers."""
    parts = [f"run {run.run_id}"]
    if run.emulated:
        parts.append(
            "HOST-EMULATED (no GPU): host memory stands in for GPU memory; "
            "gds = O_DIRECT emulation, not GPUDirect Storage"
        )
    if "compat" in set(run.ok["tag"]):
        parts.append("gds [compat]: kvikio compat mode, NOT GPUDirect Storage")
    if extra:
        parts.append(extra)
    text = "\n".join(textwrap.fill(p, 120 if fig.get_figwidth() > 5 else 70) for p in parts)
    layout = fig.get_layout_engine()
    assert isinstance(layout, ConstrainedLayoutEngine)  # new_figure() makes it constrained
    layout.set(h_pad=0.04)
    fig.supxlabel(text, fontsize=5.5, color="#aa0000" if run.emulated else "0.3", x=0.0, ha="left")


def empty_panel(ax: Any, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])


def size_ticks(ax: Any, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([format_size(s) for s in sizes])
    ax.minorticks_off()
    lo, hi = min(sizes), max(sizes)
    ax.set_xlim(lo / 1.6, hi * 1.6)


def engine_label(df: pd.DataFrame, engine: str) -> str:
    tags = set(df.loc[df["engine"] == engine, "tag"]) - {""}
    return label(engine, "/".join(sorted(tags)))


def iqr_line(ax: Any, x: Any, st: pd.DataFrame, engine: str, lab: str, **kw: Any) -> None:
    """A median line with IQR error bars; only the line carries the legend label."""
    c = color(engine)
    ax.plot(x, st["median"], color=c, marker=marker(engine), label=lab, **kw)
    err = [st["median"] - st["q25"], st["q75"] - st["median"]]
    ax.errorbar(x, st["median"], yerr=err, fmt="none", ecolor=c, elinewidth=0.8, capsize=2)


def synthetic_subset(run: Run) -> tuple[pd.DataFrame, int, int]:
    """Rows for the tensor-size sweep: synthetic workloads of the largest total size, at the
    smallest SSD count (where the baselines run). Returns (rows, total_bytes, n_targets)."""
    syn = run.ok[run.ok["tensor_bytes"] > 0]
    if syn.empty:
        return syn, 0, 0
    total = int(syn["total_bytes"].max())
    syn = syn[syn["total_bytes"] == total]
    n = int(syn["n_targets"].min())
    return syn[syn["n_targets"] == n], total, n


def save(fig: Figure, outdir: str, stem: str) -> list[str]:
    """Write `stem`.png and `stem`.pdf into outdir; returns the paths."""
    os.makedirs(outdir, exist_ok=True)
    paths = []
    with plt.rc_context(STYLE):
        for ext in ("png", "pdf"):
            path = os.path.join(outdir, f"{stem}.{ext}")
            fig.savefig(path)
            paths.append(path)
    return paths
