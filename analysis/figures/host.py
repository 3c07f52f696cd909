"""The report's figures, as matplotlib Figure objects (Agg backend), and saving them as PNG + PDF.

Publication style: one column (3.5 in) or two (7.1 in) wide, 8 pt text, labelled axes with
units (GB/s = 1e9 B/s), error bars = interquartile range over repetitions, one colour and marker
per engine throughout. Emulated and compat rows carry "[emulated]" / "[compat]" in every legend,
and a footer says when a whole run is host-emulated or its targets share one device.
"""

from __future__ import annotations

import functools
import os
import textwrap
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from analysis import contention as contention_mod
from analysis import training
from analysis.model.planning import plan
from analysis.model.predict import break_even, break_even_ssds, predict, stall_ratio
from analysis.model.profiles import Profile
from analysis.model.render import fmt_bytes
from analysis.runs import Run, label, order_engines
from analysis.stats import case_stats, median_row
from bench.sizes import format_size

COL1, COL2 = 3.5, 7.1  # inches: one and two columns
COLORS = {
    "gds": "#d62728",
    "cpu-single": "#1f77b4",
    "cpu-double": "#2ca02c",
    "torch-save": "#7f7f7f",
    "dcp": "#9467bd",
}
MARKERS = {"gds": "o", "cpu-single": "s", "cpu-double": "^", "torch-save": "D", "dcp": "v"}
CONTENTION = "#ff7f0e"  # no engine's colour
PROFILE_STYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1))]
STYLE = {
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

FIGURES = ("bandwidth_vs_tensor_size", "stall_vs_ssds", "host_memory", "feasibility", "timeline")


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


def _new(
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
    fig.get_layout_engine().set(h_pad=0.04)
    fig.supxlabel(text, fontsize=5.5, color="#aa0000" if run.emulated else "0.3", x=0.0, ha="left")


def _empty(ax: Any, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])


def _size_ticks(ax: Any, sizes: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([format_size(s) for s in sizes])
    ax.minorticks_off()
    lo, hi = min(sizes), max(sizes)
    ax.set_xlim(lo / 1.6, hi * 1.6)


def _engine_label(df: pd.DataFrame, engine: str) -> str:
    tags = set(df.loc[df["engine"] == engine, "tag"]) - {""}
    return label(engine, "/".join(sorted(tags)))


def _line(ax: Any, x: Any, st: pd.DataFrame, engine: str, lab: str, **kw: Any) -> None:
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


@styled
def bandwidth_vs_tensor_size(run: Run) -> Figure:
    """(a) write bandwidth to durability and (b) restore bandwidth against tensor size."""
    fig, axes = _new(COL2, 2.5, ncols=2)
    df, total, n = synthetic_subset(run)
    panels = [
        ("write_GBps", "write bandwidth to durability (GB/s)", "(a) write: bytes / total_s"),
        ("restore_GBps", "restore bandwidth (GB/s)", "(b) restore: bytes / restore_s"),
    ]
    if not df.empty:
        fig.suptitle(f"{format_size(total)} checkpoint, {n} target(s)", fontsize=8)
    for ax, (metric, ylabel, title) in zip(axes[0], panels, strict=True):
        if df.empty:
            _empty(ax, "no synthetic workloads in this run")
            continue
        st = case_stats(df, metric, ["engine", "tensor_bytes"])
        for e in order_engines(st["engine"]):
            s = st[st["engine"] == e].sort_values("tensor_bytes")
            _line(ax, s["tensor_bytes"], s, e, _engine_label(df, e))
        _size_ticks(ax, sorted(int(x) for x in df["tensor_bytes"].unique()))
        ax.set_xlabel("tensor size (log scale)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_title(title)
    if not df.empty:
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside right upper")
    footer(fig, run, "median of repetitions; error bars: interquartile range")
    return fig


@styled
def stall_vs_ssds(run: Run, prof: Profile | None) -> Figure:
    """Stall against SSD count per workload, measured (markers, IQR bars) beside the model."""
    wls = list(dict.fromkeys(run.ok["workload"]))
    ncols = min(len(wls), 3)
    nrows = (len(wls) + ncols - 1) // ncols
    fig, axes = _new(
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
            _line(ax, s["n_targets"], s, e, _engine_label(run.ok, e), linestyle="none")
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
        ax.set_title(f"{wl} ({format_size(int(size))})")
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


@styled
def host_memory(run: Run) -> Figure:
    """Pinned staging and page-cache peak per engine, as multiples of the checkpoint size."""
    fig, axes = _new(COL1, 2.7)
    ax = axes[0][0]
    ok = run.ok
    engines = order_engines(ok["engine"])
    pinned = ok.groupby("engine")["pinned_x"].median()
    cache = case_stats(ok, "page_cache_x", ["engine"]).set_index("engine")
    x = np.arange(len(engines))
    p = [pinned[e] for e in engines]
    c = [cache.loc[e, "median"] for e in engines]
    ax.bar(x, p, color=[color(e) for e in engines], width=0.6, label="pinned staging")
    ax.bar(
        x,
        c,
        bottom=p,
        color=[color(e) for e in engines],
        alpha=0.35,
        hatch="///",
        edgecolor="white",
        width=0.6,
        label="page-cache peak",
    )
    err = [
        [cache.loc[e, "median"] - cache.loc[e, "q25"] for e in engines],
        [cache.loc[e, "q75"] - cache.loc[e, "median"] for e in engines],
    ]
    ax.errorbar(x, np.add(p, c), yerr=err, fmt="none", ecolor="black", elinewidth=0.7, capsize=2)
    pred = [
        predict(_unit_profile(), e, 1, 1.0, run.traits(e)).host_bytes if run.traits(e) else np.nan
        for e in engines
    ]
    (mline,) = ax.plot(
        x,
        pred,
        linestyle="none",
        marker="_",
        markersize=14,
        markeredgewidth=1.5,
        color="black",
        label="model",
    )
    ax.set_xticks(x)
    ax.set_xticklabels([_engine_label(ok, e).replace(" [", "\n[") for e in engines])
    ax.set_ylabel("host memory / checkpoint size (x S)")
    ax.set_ylim(0, max(2.9, float(np.nanmax(np.add(p, c))) * 1.3))
    ax.grid(axis="x", visible=False)
    handles = [
        Patch(facecolor="0.4", label="pinned staging"),
        Patch(
            facecolor="0.4",
            alpha=0.35,
            hatch="///",
            edgecolor="white",
            label="page-cache peak (bar: IQR)",
        ),
        mline,
    ]
    ax.legend(handles=handles, loc="upper left", ncols=2)
    ax.set_title("host memory per engine (median of all repetitions)")
    footer(fig, run, "dcp's staging copy is unpinned host memory: not counted as pinned")
    return fig


@styled
def host_cpu(run: Run) -> Figure:
    """CPU cost against write bandwidth, each engine through the tensor sizes of the largest
    checkpoint (smallest SSD count, as Figure 1): (a) in the stall, (b) while persisting;
    filled: the whole host (other processes and the idle baseline taken away), hollow: the
    process and its children. A run without the host columns draws the process alone."""
    from analysis import cost

    fig, axes = _new(COL2, 2.6, ncols=2, sharey=True)
    df, total, n = synthetic_subset(run)
    if df.empty:
        df, total, n = run.ok, int(run.ok["total_bytes"].max()), int(run.ok["n_targets"].min())
        df = df[(df["total_bytes"] == total) & (df["n_targets"] == n)]
    rows = cost.per_row(df)
    host = rows["host_cpu_s_per_GB"].notna().any()
    proc_stall = rows["stall_cpu_s_per_GB"]
    proc_persist = rows["process_cpu_s_per_GB"] - proc_stall
    panels = [
        ("(a) stall: save() called until it returned", "stall_host_cpu_s_per_GB", proc_stall),
        ("(b) persist: until durable", "persist_host_cpu_s_per_GB", proc_persist),
    ]
    sizes = sorted(int(x) for x in rows["tensor_bytes"].unique())
    for ax, (title, col, proc) in zip(axes[0], panels, strict=True):
        frame = rows.assign(process=proc)
        g = frame.groupby(["engine", "tensor_bytes"], sort=False).median(numeric_only=True)
        for e in order_engines(frame["engine"]):
            if e not in g.index.get_level_values(0):
                continue
            s = g.loc[e].sort_index()
            c = color(e)
            if host:
                ax.plot(
                    s["write_GBps"], s[col], color=c, marker=marker(e), label=_engine_label(df, e)
                )
            ax.plot(
                s["write_GBps"],
                s["process"],
                color=c,
                marker=marker(e),
                markerfacecolor="white",
                linestyle=":" if host else "-",
                label=None if host else _engine_label(df, e),
            )
            # the smallest and the largest tensor size, at their points
            for t in (s.index[0], s.index[-1]):
                y = s.loc[t, col] if host else s.loc[t, "process"]
                if np.isfinite(y) and y != 0:  # none for a path with no persist phase
                    ax.annotate(
                        format_size(int(t)),
                        (s.loc[t, "write_GBps"], y),
                        fontsize=5,
                        xytext=(2, 2),
                        textcoords="offset points",
                        color=c,
                    )
        ax.set_xlabel("write bandwidth to durability (GB/s)")
        ax.set_title(title)
        ax.set_xlim(left=0)
    axes[0][0].set_ylabel("CPU-seconds per GB durable")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [
        Line2D([], [], color="0.3", marker="o", label="whole host" if host else "process"),
        *(
            [
                Line2D(
                    [],
                    [],
                    color="0.3",
                    marker="o",
                    markerfacecolor="white",
                    linestyle=":",
                    label="this process and its children",
                )
            ]
            if host
            else []
        ),
    ]
    fig.legend(handles=handles, loc="outside right upper")
    fig.suptitle(
        f"{format_size(total)} checkpoint, {n} target(s), tensor sizes "
        f"{format_size(sizes[0])}-{format_size(sizes[-1])}"
        if sizes
        else "",
        fontsize=8,
    )
    footer(
        fig,
        run,
        "median of repetitions per tensor size; whole host = /proc/stat busy time less other "
        "processes' CPU and the run's idle baseline"
        + ("" if host else "; this run predates the host columns: process CPU only"),
    )
    return fig


def _unit_profile() -> Profile:
    """A profile whose host-memory predictions are in units of S (bandwidths do not matter)."""
    return Profile("unit", "", 1.0, 1.0, 1, 1, 1.0, 1)


@styled
def feasibility(profiles: list[Profile], run: Run | None = None, max_ssds: int = 20) -> Figure:
    """GDS stall / CPU-centric stall against SSDs per GPU, one line per hardware profile, with
    each break-even point and today's ~1 data SSD per GPU marked."""
    fig, axes = _new(COL1, 3.6)
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


@styled
def lost_fraction(
    prof: Profile,
    traits: dict[str, Any] | None = None,
    restart_s: float = 0.0,
    run: Run | None = None,
) -> Figure:
    """Expected fraction of training time lost to checkpoint stalls and rework against the mean
    time between failures, per engine, each at its own best interval (`model.plan`); with the
    run the profile was calibrated from, its footer (run id, HOST-EMULATED when it was)."""
    fig, axes = _new(COL1, 2.7)
    ax = axes[0][0]
    hours = np.logspace(0, 3, 40)
    plans = [plan(prof, h * 3600, restart_s, traits=traits) for h in hours]
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
    how = (
        "Young/Daly interval with the stall as the checkpoint cost; a "
        "background persist bounds the interval from below"
    )
    if run is not None:
        footer(fig, run, how + "; calibrated from this run")
    else:
        fig.text(0.01, 0.01, how, fontsize=5)
    return fig


def timeline_case(run: Run) -> pd.DataFrame:
    """Rows of the case the timeline draws: the largest synthetic checkpoint with its largest
    tensors, at the smallest SSD count (else the largest model workload)."""
    df, _, _ = synthetic_subset(run)
    if df.empty:
        ok = run.ok
        df = ok[ok["total_bytes"] == ok["total_bytes"].max()]
        df = df[df["n_targets"] == df["n_targets"].min()]
    wl = df.sort_values("tensor_bytes", ascending=False, kind="stable")["workload"].iloc[0]
    return df[df["workload"] == wl]


@styled
def timeline(run: Run) -> Figure:
    """One checkpoint per engine on a time axis: stall (training waits), persist (background),
    checksum time inside persist; from the median repetition of one case."""
    df = timeline_case(run)
    wl, n = str(df["workload"].iloc[0]), int(df["n_targets"].iloc[0])
    engines = order_engines(df["engine"])
    fig, axes = _new(COL2, 0.42 * len(engines) + 1.1)
    ax = axes[0][0]
    for i, e in enumerate(engines):
        r = median_row(df[df["engine"] == e])
        y = len(engines) - 1 - i
        stall, tot = float(r["stall_s"]), float(r["total_s"])
        t = run.traits(e)
        whole_stall = t is not None and t.stall == "durable"
        ax.barh(y, tot if whole_stall else stall, left=0, height=0.6, color=color(e))
        if not whole_stall and tot > stall:
            ax.barh(
                y,
                tot - stall,
                left=stall,
                height=0.6,
                color=color(e),
                alpha=0.3,
                hatch="///",
                edgecolor="white",
            )
            h = float(r["hash_s"])
            if h > 0:
                ax.barh(y, min(h, tot - stall), left=stall, height=0.18, color="black")
        ax.text(tot, y, f"  stall {stall:.3g} s, durable {tot:.3g} s", va="center", fontsize=6)
    ax.set_yticks(range(len(engines)))
    ax.set_yticklabels([_engine_label(df, e) for e in reversed(engines)])
    ax.set_xlabel("time from save() (s)")
    ax.set_xlim(0, float(df["total_s"].max()) * 1.45)
    ax.grid(axis="y", visible=False)
    ax.set_title(
        f"one checkpoint per engine: {wl}, {n} target(s), the median repetition by total_s"
    )
    handles = [
        Patch(facecolor="0.3", label="stall: training waits"),
        Patch(
            facecolor="0.3",
            alpha=0.3,
            hatch="///",
            edgecolor="white",
            label="persist: in the background",
        ),
        Patch(facecolor="black", label="checksums (within persist; placement indicative)"),
    ]
    ax.legend(handles=handles, loc="lower right")
    footer(
        fig,
        run,
        "phases from each row's stall_s, total_s and hash_s; gds and torch-save stall until durable",
    )
    return fig


@styled
def compare_bandwidth(runs: list[Run], table: pd.DataFrame, metric: str, xlabel: str) -> Figure:
    """(a) each run's write-bandwidth curves over tensor size; (b) run / A with its 95% CI per
    shared case."""
    fig, axes = _new(COL2, 2.9, ncols=2)
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
            _line(
                ax,
                s["tensor_bytes"],
                s,
                e,
                f"{chr(65 + i)}: {_engine_label(df, e)}",
                linestyle=styles[i % 4],
            )
        sizes |= {int(x) for x in df["tensor_bytes"].unique()}
    if sizes:
        _size_ticks(ax, sorted(sizes))
        ax.set_ylim(bottom=0)
        fig.legend(*ax.get_legend_handles_labels(), loc="outside upper center", ncols=3)
    else:
        _empty(ax, "no synthetic workloads")
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
                f"{r.run}/A {r.engine} {r.workload.replace('synthetic-', '')} x{r.n_targets}"
                for r in table.itertuples()
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
    top_fig, bot_fig = fig.subfigures(2, 1, height_ratios=[1.35 * nrows + 0.6, 2.3])
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


MAP_STYLES = {"shared": "-", "dedicated": "--", "dedicated-subfolders": "--"}


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
    fig, axes = _new(COL2, 2.4 * len(counts) + 0.3, ncols=2, nrows=len(counts))
    mappings = contention_mod.maps(t)
    ceil = run.env.get("ceilings", {}) if isinstance(run.env.get("ceilings"), dict) else {}
    for row, n in zip(axes, counts, strict=True):
        ax, bx = row
        if t.empty:
            _empty(ax, "no multi-rank cases in this run")
            _empty(bx, "no multi-rank cases in this run")
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
                        label=f"{_engine_label(run.ranked, e)}, {m}",
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
        c = ceil.get("per_ssd_count", {}).get(str(n), {}) if ceil else {}
        if c.get("direct_write_Bps"):
            bx.axhline(
                c["direct_write_Bps"] / 1e9,
                color="0.4",
                linewidth=0.7,
                linestyle=(0, (1, 2)),
                label=f"O_DIRECT ceiling, {n} target(s), 1 process",
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
            label=_engine_label(run.ranked, e),
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
