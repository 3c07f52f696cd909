"""The report's section on how the cost grows with the checkpoint (analysis.scaling's fits,
Figures 10 and 11).
"""

from __future__ import annotations

from analysis import scaling
from analysis.report.doc import Doc
from analysis.runs import Run


def scaling_section(d: Doc, run: Run) -> None:
    """The report's section on how the cost grows."""
    table = scaling.fits(run)
    d.h(2, "How the cost grows with the checkpoint")
    d.p(
        "Stall and time to durability fitted as a power law of the checkpoint size (log-log "
        "least squares over the per-size medians; slope +- its standard error). Slope 1 is a "
        "linear cost; above 1 by more than 0.1 and twice its error is said in the loud lines "
        "at the top."
    )
    if not table.empty:
        d.table(*scaling.rows(table))
    d.img("scaling.png", "Figure 10: stall and time to durability against checkpoint size.")
    d.img("scaling_memory.png", "Figure 11: host memory held against checkpoint size.")
