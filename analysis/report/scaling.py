"""The report's section on how the cost grows with the checkpoint (analysis.scaling's fits,
Figures 10 and 11).
"""

from __future__ import annotations

import pandas as pd

from analysis import scaling
from analysis.report.doc import Doc
from analysis.runs import Run


def headline(table: pd.DataFrame) -> str:
    """How the cost grows, in one sentence: the steepest fitted slope."""
    if table.empty:
        return f"Fewer than {scaling.MIN_SIZES} checkpoint sizes per engine: no slope fitted."
    r = table.nlargest(1, "slope").iloc[0]
    return (
        f"The steepest cost is {r['engine']}'s {scaling.METRICS[r['metric']]}, growing as the "
        f"checkpoint size to the power {r['slope']:.2f} +- {r['stderr']:.2f} over "
        f"{int(r['n_targets'])} SSD(s) (1: linear)."
    )


def scaling_section(d: Doc, run: Run) -> None:
    """The answer, Figure 10, the slopes, Figure 11."""
    table = scaling.fits(run)
    d.h(2, "How the cost grows with the checkpoint")
    d.p(headline(table))
    d.img("scaling.png", "Figure 10: stall and time to durability against checkpoint size.")
    if not table.empty:
        d.table(*scaling.rows(table))
    d.p(
        "A slope above 1 by more than 0.1 and twice its error is said in the loud lines at the top."
    )
    d.img("scaling_memory.png", "Figure 11: host memory held against checkpoint size.")
