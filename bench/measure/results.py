"""Result rows: their types, the run directory, appending rows durably, reading them back.

One tidy row per repetition (per rank and repetition in multi-rank runs, plus an aggregate row);
base units in the names (`_bytes`, `_s`); warm-ups flagged. GB/s is derived in analysis, never
stored. Each file's columns are one typed row (bench.measure.columns): `Row` for results.csv,
`StepRow` and `CheckpointRow` for a training loop's files.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bench.measure.columns import column, frame, missing, names, read_types, values
from bench.storage.manifest import fsync_dir

# --- results.csv: one row per repetition --------------------------------------------------


@dataclass(kw_only=True)
class Row:
    """A row of results.csv: one repetition of one case (per rank under torchrun, plus one
    aggregate row). Built with the case's identity (the fields without a default), then filled
    phase by phase (bench.run.protocol: the save until durable, the restore and its comparison).

    Single-process rows: rank 0, world_size 1, node = this host, node_rank 0, aggregate False,
    ranks_active 1, target_map "". Aggregate rows: rank -1, node "", node_rank -1, aggregate
    True. Fields keep their order: it is the header of every results.csv written."""

    run_id: str = column(
        "The run: `<UTC time>-<config name>-<6 hex digits>`, its folder under results/.",
        required=True,
    )
    case_id: str = column(
        "The case: `<workload>-x<n_targets>-<engine>`, under torchrun with the mapping and the "
        "ranks at once (`-shared-2r`); every repetition of the case has it.",
        required=True,
    )
    engine: str = column("The engine that saved and restored (`ckptbench engines`).", required=True)
    device: str = column(
        "Where the state lived: `cuda`, or `host-emulated` (host memory standing in for GPU "
        "memory).",
        required=True,
    )
    emulated: bool = column(
        "The device is host memory standing in for a GPU: never a GPU number.", required=True
    )
    gds_mode: str = column(
        "How the gds engine's save went: `gds` (GPU-direct), `compat` (kvikio's POSIX path) or "
        "`emulated`; `none` for every other engine.",
        "none",
        required=True,
    )
    workload: str = column(
        "The state saved: `synthetic-<total>-<tensor size>` or a model preset.", required=True
    )
    total_bytes: int = column(
        "Bytes of tensors in the state (under torchrun: the rank's shard).",
        required=True,
        ranks="sum",
    )
    tensor_bytes: int = column(
        "Bytes of each tensor of a synthetic state (0 for a model's state).", required=True
    )
    n_tensors: int = column("Tensors in the state.", required=True, ranks="sum")
    n_targets: int = column("Target directories (SSDs) of the case.", required=True)
    targets_used: int = column(
        "Targets the engine wrote (1 for the engines that write one file).",
        0,
        required=True,
        ranks="sum",
    )
    rep: int = column("The repetition, from 0 (warm-ups counted apart).", required=True)
    warmup: bool = column("A warm-up: run first, left out of the statistics.", required=True)
    stall_s: float | None = column(
        "From the call of save() until it returned: training may change the tensors again "
        "(any wait for the previous save included).",
        None,
        required=True,
        ranks="max",
    )
    persist_s: float | None = column(
        "total_s - stall_s: the part after save() returned.", None, required=True, ranks="own"
    )
    total_s: float | None = column(
        "From the call of save() until the bytes were durable (every file and directory "
        "fsync'd, the manifest committed).",
        None,
        required=True,
        ranks="max",
    )
    restore_s: float | None = column(
        "The read back into the requested device, without the engine's own checksum check.",
        None,
        required=True,
        ranks="max",
    )
    hash_s: float | None = column(
        "Time the engine spent computing checksums (part of the persist).",
        None,
        required=True,
        ranks="max",
    )
    wait_prev_s: float | None = column(
        "Part of stall_s spent waiting for the previous save to persist.",
        None,
        required=True,
        ranks="max",
    )
    pinned_bytes: int | None = column(
        "Host staging memory the engine holds (reused across saves).",
        None,
        required=True,
        ranks="sum",
    )
    page_cache_peak_bytes: int | None = column(
        "Peak growth of `Cached` (/proc/meminfo) from save() until durable (aggregate: per node "
        "the largest, summed).",
        None,
        required=True,
        ranks="own",
    )
    rss_peak_bytes: int | None = column(
        "Peak resident set of this process during the save (absolute).",
        None,
        required=True,
        ranks="sum",
    )
    cpu_user_s: float | None = column(
        "User CPU time of this process (every thread) and its children over the save (rows "
        "before the host columns: this process's threads alone).",
        None,
        required=True,
        ranks="sum",
    )
    cpu_sys_s: float | None = column(
        "System CPU time, counted as cpu_user_s.", None, required=True, ranks="sum"
    )
    checksums: bool = column("The engine computed checksums of what it wrote.", False, ranks="all")
    staging_grew: bool = column(
        "The staging buffer was (re)allocated inside this save.",
        False,
        required=True,
        ranks="any",
    )
    copied_tensors: int = column(
        "Tensors a zero-copy path had to copy (not contiguous).", 0, required=True, ranks="sum"
    )
    cache_dropped: bool = column(
        "The page cache was dropped before the workload (only as root).",
        required=True,
        ranks="all",
    )
    dtype: str = column("The tensors' dtype (`float32`...).", required=True)
    options: str = column(
        "The engine's options, JSON with sorted keys (`{}` for none).",
    )
    capped: bool = column(
        "The targets' writes were paced to `max_write_bw` (emulated slower SSDs).",
        False,
        ranks="any",
    )
    write_efficiency: float | None = column(
        "total_bytes / total_s over the ceiling of the engine's kind of write for the targets "
        "it wrote (bench.measure.efficiency); empty without ceilings.",
        None,
        ranks="own",
    )
    snapshot_efficiency: float | None = column(
        "total_bytes / stall_s over the copy ceiling, for an engine whose stall is a snapshot; "
        "empty otherwise.",
        None,
        ranks="own",
    )
    restore_efficiency: float | None = column(
        "total_bytes / restore_s over the read ceiling of the engine's kind of read (O_DIRECT, or "
        "buffered from a cold page cache for page-cache paths) for the targets it read; empty "
        "without read ceilings.",
        None,
        ranks="own",
    )
    verified: bool = column(
        "The restore was compared with the source and matched.",
        False,
        required=True,
        ranks="all",
    )
    error: str = column(
        "Why the repetition failed, in one line; empty when it did not (aggregate: the failing "
        "rank's, prefixed with it).",
        "",
        required=True,
        ranks="own",
    )
    rank: int = column("The rank that wrote the row; -1 for an aggregate row.", 0, ranks="own")
    world_size: int = column("Ranks in the job.", 1)
    node: str = column("The rank's host; empty for an aggregate row.", "", ranks="own")
    node_rank: int = column("The rank's node; -1 for an aggregate row.", 0, ranks="own")
    aggregate: bool = column("The aggregate row of a multi-rank repetition.", False, ranks="own")
    ranks_active: int = column("Ranks that checkpointed at once.", 1)
    target_map: str = column(
        "How ranks map to targets: `shared`, `dedicated`, `dedicated-subfolders` or "
        "`per-target-K`; empty for a single process.",
        "",
    )
    io_detail: str = column(
        "What the engine reports of its save beyond the columns, as JSON with its `kind` "
        "(bench.measure.detail; gds: kvikio's settings, device/host/registered bytes, why a "
        "save was labelled compat); empty where it reports nothing.",
        "",
    )
    restore_mode: str = column(
        "How the restore read its bytes: `host` (through host memory), or for gds into CUDA "
        "memory `gds` or `compat`.",
        "",
    )
    ceiling_beaten: bool = column(
        "An efficiency exceeds 1.05: the ceiling, not the engine, is in question.",
        False,
        ranks="own",
    )
    restore_resident_bytes: int | None = column(
        "Bytes of the checkpoint still in the page cache when the restore began (mincore after "
        "eviction; 0: the restore read the device).",
        None,
        ranks="sum",
    )
    restore_cached_bytes: int | None = column(
        "Bytes of the checkpoint's files in the page cache right after the restore (mincore): "
        "the page cache the restore left behind (0: read with O_DIRECT, or dropped).",
        None,
        ranks="sum",
    )
    restore_into: str | None = column(
        "`restart` (into the state's own tensors, scrubbed before the load, checked against "
        "fingerprints of the source taken before the save; `in-place` in older runs) or `fresh` "
        "(new memory, the first-touch case, compared byte for byte with the source).",
        None,
    )
    host_cpu_s: float | None = column(
        "The whole machine's busy CPU time over the save less other processes' CPU time and "
        "the run's idle baseline (kernel writeback and interrupts count; bench.measure.hostcost).",
        None,
        ranks="own",
    )
    stall_cpu_s: float | None = column(
        "cpu_user_s + cpu_sys_s until save() returned.", None, ranks="own"
    )
    stall_host_cpu_s: float | None = column("host_cpu_s until save() returned.", None, ranks="own")
    host_busy_s: float | None = column(
        "Every CPU's busy time over the save, nothing taken away.", None, ranks="own"
    )
    host_others_cpu_s: float | None = column(
        "Other user-space processes' CPU time over the save, taken away from host_cpu_s.",
        None,
        ranks="own",
    )
    host_baseline_cores: float | None = column(
        "The idle baseline's rate taken away from host_cpu_s (x the save's wall time).",
        None,
        ranks="own",
    )
    meter_cpu_s: float | None = column(
        "The measurement's own CPU time (readings, sampler thread), taken away from all of the "
        "CPU columns.",
        None,
        ranks="own",
    )
    dram_bytes: int | None = column(
        "DRAM read + write bytes over the save from uncore IMC counters, baseline taken away; "
        "empty where there are none.",
        None,
        ranks="own",
    )
    stall_dram_bytes: int | None = column("dram_bytes until save() returned.", None, ranks="own")
    device_written_bytes: int | None = column(
        "Bytes the block devices of the targets counted written from save() until durable "
        "(/sys/block/<dev>/stat; the file system's device; bench.measure.witness). Other traffic "
        "on the device counts too; under torchrun each rank counts the whole device (aggregate: "
        "the largest). Empty where the targets have no block device.",
        None,
        ranks="max",
    )
    device_flushes: int | None = column(
        "Cache flush requests those devices completed in the same interval (for device-mapper "
        "or md, the devices below it); empty where none counts flushes.",
        None,
        ranks="max",
    )
    durable_witness: str = column(
        "Whether the devices saw the save durable: `yes` (at least the checkpoint's files' bytes "
        "reached each device, and a flush every write-back cache), `no: <why>` (conclusive: the "
        "row's total_s is no time to durability; a ckptbench engine's row fails) or "
        "`unavailable: <why>`. Other traffic can only add to the counts, so `yes` is necessary, "
        "not sufficient.",
        "",
        ranks="own",
    )
    return_witness: str = column(
        "The same verdict on the interval from save() until it returned: what a tool that stops "
        "its clock at the return (DLIO v2.0) had witnessed. `no` is what a snapshot engine's "
        "stall must say (it persists after); an engine whose save() returns durable says its "
        "durable_witness.",
        "",
        ranks="own",
    )
    device_read_bytes: int | None = column(
        "Bytes the targets' devices counted read during the timed restore.", None, ranks="max"
    )
    restore_witness: str = column(
        "Whether the restore read its bytes from the devices: `yes` (at least the size of the "
        "files it evicted), `no: <why>` (part came from memory: its restore_s is no device "
        "read) or `unavailable: <why>`.",
        "",
        ranks="own",
    )


COLUMNS = names(Row)
# Columns that older runs wrote and this version no longer does: read as they are, never
# reused for another meaning.
RETIRED = {
    "persist_efficiency": "replaced by write_efficiency: total_bytes / persist_s (total_s for "
    "an engine that persists inside its stall) over the engine's write ceiling",
}
# --- a training loop's files (`ckptbench train`, bench.run.training) ------------------------

STEPS_CSV, CKPTS_CSV = "training_steps.csv", "training_checkpoints.csv"


@dataclass(kw_only=True)
class StepRow:
    """A row of training_steps.csv: one timed step of the loop with one engine (or `none`)."""

    run_id: str = column("The run, as in results.csv.", required=True)
    engine: str = column("The engine checkpointing, or `none` (the loop alone).", required=True)
    device: str = column("Where the model trained: `cuda` or `host-emulated`.", required=True)
    emulated: bool = column("The device is host memory standing in for a GPU.", required=True)
    gds_mode: str = column(
        "The gds engine's mode in the engine's last save (`none` for the others).",
        "none",
        required=True,
    )
    step: int = column("The step, from 0 (warm-up steps are not recorded).", required=True)
    step_s: float = column(
        "The step's wall time: forward, backward, optimizer step and the checkpoint call.",
        required=True,
    )
    compute_s: float = column(
        "The step without the checkpoint call (synchronised with the device).", required=True
    )
    save_call_s: float | None = column(
        "The checkpoint call in this step: state_dict, save() and the device synchronised "
        "after it; empty in a step without one.",
        None,
        required=True,
    )
    checkpoint: bool = column("The step ended with a checkpoint.", False, required=True)
    stall_s: float | None = column(
        "The clock's stall of the save in this step; empty in a step without one.",
        None,
        required=True,
    )
    during_persist: bool = column(
        "The step started while an earlier save persisted (after its save() returned, before "
        "it was durable); never the checkpoint step itself.",
        False,
        required=True,
    )
    persist_of_step: int | None = column(
        "The step of the checkpoint persisting then; empty when none was.", None, required=True
    )
    t_start_s: float = column(
        "When the step started, from the start of the timed loop.", required=True
    )
    t_end_s: float = column("When the step ended, from the start of the timed loop.", required=True)
    loss: float = column("The step's training loss.", required=True)


@dataclass(kw_only=True)
class CheckpointRow:
    """A row of training_checkpoints.csv: one save of the loop (warm-ups flagged), or, with
    step -1, an engine whose loop failed."""

    run_id: str = column("The run, as in results.csv.", required=True)
    engine: str = column("The engine that saved.", required=True)
    device: str = column("Where the model trained: `cuda` or `host-emulated`.", required=True)
    emulated: bool = column("The device is host memory standing in for a GPU.", required=True)
    gds_mode: str = column(
        "How the gds engine's save went (`none` for the others).", "none", required=True
    )
    step: int = column(
        "The step the save followed; -1 for a warm-up save or a failed engine.", required=True
    )
    warmup: bool = column("A warm-up save, before the timed steps.", False, required=True)
    name: str = column("The checkpoint's name on the targets.", "", required=True)
    bytes: int | None = column("Bytes the save wrote.", None, required=True)
    stall_s: float | None = column(
        "From the call of save() until it returned (the harness's clock).", None, required=True
    )
    persist_s: float | None = column("total_s - stall_s.", None, required=True)
    total_s: float | None = column(
        "From the call of save() until the bytes were durable.", None, required=True
    )
    wait_prev_s: float | None = column(
        "Part of stall_s spent waiting for the previous save.", None, required=True
    )
    hash_s: float | None = column("Time spent computing checksums.", None, required=True)
    pinned_bytes: int | None = column("Host staging memory the engine held.", None, required=True)
    save_call_s: float | None = column(
        "The checkpoint call in its step, state_dict and device synchronisation included.",
        None,
        required=True,
    )
    overlap_steps: int = column(
        "Timed steps that started while this save persisted.", 0, required=True
    )
    t_save_s: float | None = column(
        "When the clock saw save() called, from the start of the timed loop.",
        None,
        required=True,
    )
    t_return_s: float | None = column(
        "When save() returned, from the same start.", None, required=True
    )
    t_durable_s: float | None = column(
        "When the bytes were durable, from the same start.", None, required=True
    )
    verified: bool | None = column(
        "The last checkpoint, restored and compared with a clone of the state taken before its "
        "save, matched; empty for the others (not compared).",
        None,
        required=True,
    )
    error: str = column(
        "Why the save or the engine failed; empty when nothing did.", "", required=True
    )
    restart_s: float | None = column(
        "The restart from the last checkpoint, from a failure (the model and optimizer lost; a "
        "fresh model and optimizer built, untimed) to the end of the first training step after "
        "the load: the load with the page cache dropped, load_state_dict and that step, device "
        "synchronised (the harness's clock); the last checkpoint's row only, empty for the others.",
        None,
    )
    restart_load_s: float | None = column(
        "Part of restart_s: the engine's load, until the device was synchronised; with "
        "`restore: restart` (the default) into the fresh model and optimizer's own tensors, "
        "its copy into them included.",
        None,
    )
    restart_first_step_s: float | None = column(
        "Part of restart_s: the first training step after the load (the rest is load_state_dict, "
        "with `restore: fresh`).",
        None,
    )
    restart_loss_match: bool | None = column(
        "The first two steps after the restart had the uninterrupted run's losses, bit for bit "
        "(the model, the optimizer and the token stream restored); empty where the run had no "
        "step after the last checkpoint.",
        None,
    )
    device_written_bytes: int | None = column(
        "Bytes the targets' block devices counted written from save() until durable "
        "(bench.measure.witness; other traffic counts too).",
        None,
    )
    device_flushes: int | None = column(
        "Cache flush requests those devices completed in the same interval.", None
    )
    durable_witness: str = column(
        "`yes`, `no: <why>` or `unavailable: <why>`, as in results.csv: whether the devices saw "
        "the save durable.",
        "",
    )


def new_run_dir(root: str, config_name: str) -> tuple[str, str]:
    """Create `root/<run-id>` (never an existing one); returns (run_id, path)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_id = f"{stamp}-{config_name}-{uuid.uuid4().hex[:6]}"
    path = os.path.join(root, run_id)
    made = []  # the folders makedirs creates, each named in its parent durably after
    p = os.path.abspath(path)  # a relative root would end at "", which never exists
    while not os.path.exists(p):
        made.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=False)
    for d in reversed(made):
        fsync_dir(os.path.dirname(d))
    return run_id, path


# The docs blocks of docs/results.md (bench.measure.columns.render_docs; `make columns`): block
# name -> its row type.
DOCS: dict[str, type] = {
    "results.csv": Row,
    STEPS_CSV: StepRow,
    CKPTS_CSV: CheckpointRow,
}


class MissingColumns(ValueError):
    """A results file lacks columns that every file of its kind holds."""


class RowWriter:
    """Appends rows of one type (`kind`: Row for results.csv) to a CSV whose header is the
    type's columns, each row flushed and fsync'd before the next case starts."""

    def __init__(self, path: str, kind: type = Row) -> None:
        self.path = path
        self.kind = kind
        self.columns = names(kind)
        new = not os.path.exists(path)
        extra: Literal["raise", "ignore"] = "raise"
        if not new:
            # A run resumed by a newer ckptbench keeps the columns its file began with: rows
            # wider than the header would no longer parse (the new columns are left out).
            with open(path, newline="") as f:
                head = next(csv.reader(f), None)
            if head and head != self.columns and set(head) <= set(self.columns):
                self.columns, extra = head, "ignore"
        self._f = open(path, "a", newline="")  # closed in close()
        self._w = csv.DictWriter(self._f, fieldnames=self.columns, extrasaction=extra)
        if new:
            self._w.writeheader()
            self._sync()
            # The file's name, durable too: a power cut would otherwise lose every row in it.
            fsync_dir(os.path.dirname(os.path.abspath(path)))

    def write(self, row: Any) -> None:
        """Append `row`: one of the file's type, or its cells by column name."""
        if isinstance(row, Mapping):
            cells = row
        elif isinstance(row, self.kind):
            cells = values(row)
        else:
            raise TypeError(f"{self.path}: a {type(row).__name__}, not a {self.kind.__name__}")
        missing = [c for c in self.columns if c not in cells]
        if missing:
            raise KeyError(f"result row lacks columns {missing}")
        self._w.writerow(cells)
        self._sync()

    def _sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def write_json(path: str, data: Any) -> None:
    """Write JSON atomically and durably (temp file, fsync, rename, fsync of the directory)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_csv(path: str, kind: type = Row) -> Any:
    """A results file as a pandas DataFrame typed by its row type (bench.measure.columns.frame:
    columns newer than the file read their defaults). Raises MissingColumns where the file
    lacks a column every file of its kind holds."""
    import pandas as pd  # analysis-only dependency at import time

    df = pd.read_csv(path, dtype=read_types(kind))
    lacks = missing(kind, df.columns)
    if lacks:
        raise MissingColumns(f"lacks columns {', '.join(lacks)}")
    return frame(df, kind)


def read_rows(run_dir: str) -> Any:
    """results.csv of a run as a typed pandas DataFrame (`read_csv`)."""
    return read_csv(os.path.join(run_dir, "results.csv"), Row)
