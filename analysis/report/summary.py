"""The report's summary section: the per-case table (analysis.stats) and how to read it."""

from __future__ import annotations

import pandas as pd

from analysis import stats
from analysis.report.doc import Doc


def summary_section(d: Doc, table: pd.DataFrame) -> None:
    """The summary table of every case, with what its columns mean."""
    d.h(2, "Summary")
    d.p(
        "Per case: n timed repetitions; medians with their interquartile range (IQR); "
        "'durable s' = median total_s; 'tensors' = the state's tensor count, and what a "
        "save costs per tensor beside what it costs per byte: 'stall us/tensor' and "
        "'persist us/tensor' = median stall_s and persist_s over that count, in microseconds "
        "(persist: what wait() still blocked after save() returned; a few microseconds a save "
        "for the engines whose save() returns durable); pinned and page cache as multiples of "
        "the checkpoint size S; 'x torch-save' = torch-save's median (same workload, its one SSD) over this "
        "engine's, for the stall and for the time to durability; 'x best baseline' the same "
        "against the best of the libraries users would otherwise pick (torch.save, DCP, "
        "safetensors, FastPersist: whichever ran), each by its shortest median on the workload. "
        "Mode: EMULATED = host-emulated "
        "device (and for gds the O_DIRECT emulation), COMPAT = kvikio compat mode."
        + (
            " Write eff = bytes / (save() called until durable) over the ceiling of the engine's "
            "kind of write for the targets it wrote; snapshot eff = bytes / stall over the copy "
            "(device-to-host) ceiling; both against the best ceilings measured before and after "
            "the sweep (env.json). 'ceiling beaten' marks a median above 1.05: the ceiling, not "
            "the engine, is then in question."
            if table["write_eff"].notna().any()
            else " No device ceilings in env.json: no efficiency column."
        )
    )
    d.table(*stats.summary_rows(table))
