"""The report's section on restores: which engine loads fastest, in a sentence, then Figure 12
and the restore table's first columns (against the read ceiling that judges each engine and
the best baseline, and the page cache it left behind); every column under All columns.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import stats
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc, columns
from analysis.runs import GB, Run


def fmt_cached(cached: float, size: float) -> str:
    """The page cache a restore left behind as a multiple of the checkpoint; "n/a" for a run
    made before it was recorded."""
    if cached is None or not math.isfinite(cached) or not size:
        return "n/a"
    return f"{cached / size:.2f}"


def restore_rows(run: Run, table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the restore table, one row per case."""
    headers = [
        "workload",
        "SSDs",
        "engine",
        "mode",
        "n",
        "restore s",
        "restore GB/s",
        "IQR",
        "read ceiling GB/s",
        "restore eff",
        "x best baseline restore",
        "page cache left xS",
    ]
    rows = []
    for _, r in table.iterrows():
        ceiling = stats.read_ceiling_Bps(run.env, run.traits(r["engine"]), int(r["n_targets"]))
        rows.append(
            [
                r["workload"],
                str(int(r["n_targets"])),
                r["engine"],
                (r["mode"] or "").upper() or "-",
                str(int(r["n"])),
                stats.fmt(r["restore_s"]),
                f"{r['restore_GBps']:.2f}",
                f"{r['restore_q75'] - r['restore_q25']:.2f}",
                "-" if ceiling is None else f"{ceiling / GB:.2f}",
                stats.fmt_eff(r["restore_eff"]),
                stats.fmt(r["x_best_baseline_restore"]),
                fmt_cached(r["restore_cached_bytes"], r["total_bytes"]),
            ]
        )
    return headers, rows


FIRST = [
    "workload",
    "SSDs",
    "engine",
    "mode",
    "restore GB/s",
    "IQR",
    "restore eff",
    "x best baseline restore",
    "page cache left xS",
]


def headline(table: pd.DataFrame) -> str:
    """The restores in one sentence: the fastest, its case, and against the best baseline."""
    got = table[table["restore_GBps"].notna()]
    if got.empty:
        return "0 restores were timed in this run."
    best = got.nlargest(1, "restore_GBps").iloc[0]
    xb = best["x_best_baseline_restore"]
    return (
        f"The fastest restore is by {best['engine']}, {best['restore_GBps']:.2f} GB/s from a "
        f"cold page cache at {stats.case(best)}"
        + (
            f", {stats.fmt(xb)}x the best baseline's restore"
            if math.isfinite(xb) and xb != 1
            else ""
        )
        + "."
    )


def _destination(run: Run) -> str:
    """What the run's restores loaded into (the rows' `restore_into`), in a sentence."""
    into = set(run.ok["restore_into"].dropna()) if "restore_into" in run.ok else set()
    out = []
    if into & {"restart", "in-place"}:
        out.append(
            "A restart (restore_into=restart) loads into the state's own tensors, scrubbed "
            "first, as a relaunched job loads into the model it built (docs/restore.md)."
        )
    if "fresh" in into:
        out.append(
            "A fresh restore (restore_into=fresh) loads into memory it allocates: the "
            "first-touch case, whose rate on a VM is often the memory's, not the disk's."
        )
    return " ".join(out)


def restore_section(d: Doc, run: Run, table: pd.DataFrame) -> None:
    """The answer, what the restores loaded into and what the run lacks, Figure 12, the
    restore table's first columns (every column under All columns)."""
    d.h(2, "Restores")
    d.p(headline(table))
    has_ceiling = any(
        stats.read_ceiling_Bps(run.env, run.traits(e), 1) is not None for e in run.engines
    )
    lines = [
        x
        for x in (
            _destination(run),
            "" if has_ceiling else "This run measured no read ceilings: no ceiling or efficiency.",
            "The run predates the page-cache column: n/a."
            if table["restore_cached_bytes"].isna().all()
            else "",
        )
        if x
    ]
    if lines:
        d.p(" ".join(lines))
    d.img("restore.png", CAPTIONS["restore"])
    d.table(*columns(restore_rows(run, table), FIRST))


def restore_columns(d: Doc, run: Run, table: pd.DataFrame) -> None:
    """The whole restore table."""
    d.h(3, "Restores, every column")
    d.table(*restore_rows(run, table))
