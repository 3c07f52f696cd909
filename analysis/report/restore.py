"""The report's section on restores: how fast each engine read its checkpoint back, against the
read ceiling that judges it and against the best baseline, and the page cache it left behind.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis import stats
from analysis.report.captions import CAPTIONS
from analysis.report.doc import Doc
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


def _destination(run: Run) -> str:
    """What the run's restores loaded into (the rows' `restore_into`), in a sentence."""
    into = set(run.ok["restore_into"].dropna()) if "restore_into" in run.ok else set()
    out = ""
    if into & {"restart", "in-place"}:
        out += (
            " A restart (restore_into=restart) loads into the state's own tensors, scrubbed "
            "first, as a relaunched job loads into the model it built (docs/restore.md)."
        )
    if "fresh" in into:
        out += (
            " A fresh restore (restore_into=fresh) loads into memory it allocates: the "
            "first-touch case, whose rate on a VM is often the memory's, not the disk's."
        )
    return out


def restore_section(d: Doc, run: Run, table: pd.DataFrame) -> None:
    """Restore bandwidth per case, its ceiling, its efficiency, x best baseline and the page
    cache left behind, with Figure 12."""
    d.h(2, "Restores")
    has_ceiling = any(
        stats.read_ceiling_Bps(run.env, run.traits(e), 1) is not None for e in run.engines
    )
    old = table["restore_cached_bytes"].isna().all()
    d.p(
        "A restart reads the last checkpoint back: restore_s = the read into the requested "
        "device from a cold page cache (the checkpoint's pages evicted first), without the "
        "engine's own checksum check; restore GB/s = checkpoint bytes / restore_s (median, IQR "
        "over repetitions). 'read ceiling' = the read the engine is judged against, for the "
        "targets it read: O_DIRECT for the engines without page cache, a buffered read of a "
        "cold file for the page-cache paths (the run's best); 'restore eff' = restore GB/s over "
        "it ('ceiling beaten' above 1.05: the ceiling, not the engine, is then in question). "
        "'x best baseline restore' = the shortest median restore of the libraries users would "
        "otherwise pick, on the same workload, over this engine's (> 1: this engine loads "
        "faster). 'page cache left xS' = the checkpoint's bytes still in the page cache right "
        "after the restore, in multiples of S: memory the restore took from training that the "
        "kernel must reclaim (0 for an O_DIRECT read)."
        + _destination(run)
        + ("" if has_ceiling else " This run measured no read ceilings: no ceiling or efficiency.")
        + (" The run predates the page-cache column: n/a." if old else "")
    )
    d.table(*restore_rows(run, table))
    d.img("restore.png", CAPTIONS["restore"])
