"""The report's summary section: which engine holds training least and which is durable first,
in a sentence, then Figure 2, the per-case table's first columns (analysis.stats; the whole
table stands under All columns and in summary.csv), Figures 1 and 5.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import stats
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc, columns

FIRST = [
    "workload",
    "SSDs",
    "engine",
    "mode",
    "n",
    "stall s",
    "durable s",
    "write GB/s",
    "restore GB/s",
    "x best baseline stall",
]


def headline(table: pd.DataFrame) -> str:
    """The summary in one sentence: the shortest stall (and how much shorter than torch-save's)
    and the fastest write to durability, with their cases."""
    if table.empty:
        return "0 cases have a timed repetition that succeeded: nothing to summarise."
    short = table.nsmallest(1, "stall_s").iloc[0]
    fast = table.nlargest(1, "write_GBps").iloc[0]
    ts = short["speedup_stall"]
    vs = f", {ts:.1f}x shorter than torch-save's" if math.isfinite(ts) and ts != 1 else ""
    return (
        f"The shortest stall is by {short['engine']}, {stats.fmt(short['stall_s'])} s at "
        f"{stats.case(short)}{vs}; the fastest to durability is {fast['engine']}, "
        f"{fast['write_GBps']:.2f} GB/s at {stats.case(fast)}."
    )


def summary_section(d: Doc, table: pd.DataFrame, trained: bool) -> None:
    """The answer, Figure 2, the table's first columns, Figures 1 and 5 (and where a training
    loop's Figure 6 is)."""
    d.h(2, "Summary")
    d.p(headline(table))
    if not table["write_eff"].notna().any():
        d.p("No device ceilings in env.json: no efficiency column.")
    d.img("stall_vs_ssds.png", CAPTIONS["stall_vs_ssds"])
    d.table(*columns(stats.summary_rows(table), FIRST))
    d.img("bandwidth_vs_tensor_size.png", CAPTIONS["bandwidth_vs_tensor_size"])
    d.img("timeline.png", CAPTIONS["timeline"])
    d.p(
        "PDF versions sit beside the PNGs. Figure 5 times one checkpoint alone; Figure 6 "
        "(below) shows checkpoint phases against the steps of a training loop."
        if trained
        else "PDF versions sit beside the PNGs. Figure 5 times one checkpoint alone; checkpoint "
        "phases against the steps of a real training loop come from `ckptbench train "
        "configs/training.yaml`, whose report draws them (Figure 6)."
    )


def summary_columns(d: Doc, table: pd.DataFrame) -> None:
    """The whole summary table, every column (summary.csv has the unrounded numbers)."""
    d.h(3, "Summary, every column")
    d.table(*stats.summary_rows(table))
