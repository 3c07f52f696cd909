"""The report's loud lines: what the numbers of a run are not (stalls from the engines' own
clocks before ckptbench 0.2.0, emulated, compat, one shared device, an unfinished run, restores
from the page cache, rows left out).
"""

from __future__ import annotations

import pandas as pd

from analysis import runs, scaling
from analysis.runs import Run, clock_note


def warnings_for(run: Run) -> list[str]:
    """Loud lines: what the numbers are not."""
    out = []
    if (left := run.unfinished) is not None:
        out.append(
            f"This run did not finish: {left[0]} of {left[1]} saves recorded; its numbers cover "
            f"only the cases that ran. `ckptbench run CONFIG --resume {run.path}` finishes it."
        )
    if (clock := clock_note(run.env)) is not None:
        out.append(clock)
    if run.emulated:
        out.append(
            "HOST-EMULATED run (no GPU): host memory stands in for GPU memory in every "
            "row; these are not GPU numbers."
        )
    says = {
        "emulated": "rows are a host emulation (O_DIRECT from host memory), NOT GPUDirect Storage.",
        "compat": "rows marked compat ran in kvikio compat mode: NOT GPUDirect Storage.",
    }
    for mode, text in says.items():
        names = sorted(set(run.ok.loc[run.ok["gds_mode"] == mode, "engine"]))
        if names:
            out.append(f"{', '.join(names)} {text}")
    if run.shared_device:
        out.append(
            "All targets share one device: SSD-count scaling on this run is not real scaling."
        )
    if scaling.present(run):
        out += scaling.loud_lines(scaling.fits(run))
    if "restore_resident_bytes" in run.ok:
        # More than 0.1 % of a checkpoint still cached (a page or two of DCP's files stays
        # resident after eviction here: 4 KiB of 256 MiB is no memory read worth a word).
        resident = pd.to_numeric(run.ok["restore_resident_bytes"], errors="coerce").fillna(0)
        cached = resident > 0.001 * run.ok["total_bytes"]
        if cached.any():
            out.append(
                f"{int(cached.sum())} restore(s) began with more than 0.1 % of the checkpoint "
                f"still in the page cache (up to {resident.max() / 2**20:.1f} MiB, mincore after "
                "eviction): their restore bandwidth is partly a memory read."
            )
    out += runs.witness_lines(run.rows)
    bad = {k: v for k, v in run.excluded.items() if k != "warm-up" and v}
    if bad:
        out.append(
            "Rows left out of the statistics: "
            + ", ".join(f"{v} with {k}" for k, v in bad.items())
            + "."
        )
    return out
