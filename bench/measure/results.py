"""Result rows: the schema, the run directory, appending rows durably, reading them back.

One tidy row per repetition (per rank and repetition in multi-rank runs, plus an aggregate row);
base units in the names (`_bytes`, `_s`); warm-ups flagged. GB/s is derived in analysis, never
stored.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import uuid
from typing import Any

# What a save cost the host (bench.measure.hostcost.Cost), filled by bench.run.rows.save_phase.
HOST_COLUMNS = (
    "host_cpu_s",
    "stall_cpu_s",
    "stall_host_cpu_s",
    "host_busy_s",
    "host_others_cpu_s",
    "host_baseline_cores",
    "meter_cpu_s",
    "dram_bytes",
    "stall_dram_bytes",
)
COLUMNS = [
    "run_id",
    "case_id",
    "engine",
    "device",
    "emulated",
    "gds_mode",
    "workload",
    "total_bytes",
    "tensor_bytes",
    "n_tensors",
    "n_targets",
    "targets_used",
    "rep",
    "warmup",
    "stall_s",
    "persist_s",
    "total_s",
    "restore_s",
    "hash_s",
    "wait_prev_s",
    "pinned_bytes",
    "page_cache_peak_bytes",
    "rss_peak_bytes",
    "cpu_user_s",
    "cpu_sys_s",
    "checksums",
    "staging_grew",
    "copied_tensors",
    "cache_dropped",
    "dtype",
    "options",
    "capped",
    "write_efficiency",
    "snapshot_efficiency",
    "verified",
    "error",
    "rank",
    "world_size",
    "node",
    "node_rank",
    "aggregate",
    "ranks_active",
    "target_map",
    "io_detail",
    "restore_mode",
    "ceiling_beaten",
    "restore_resident_bytes",
    "restore_into",
    *HOST_COLUMNS,
]
# What a save cost the host (bench.measure.hostcost): cpu_user_s and cpu_sys_s are this process's
# threads and the children it ran, stall_cpu_s their part until save() returned; host_cpu_s the
# whole machine's busy CPU time less other processes' and the run's idle baseline
# (host_baseline_cores x the save's wall time), stall_host_cpu_s its part in the stall;
# host_busy_s and host_others_cpu_s the raw busy time and what was taken away for other
# processes; meter_cpu_s the measurement's own CPU, taken away from all of them; dram_bytes and
# stall_dram_bytes the DRAM traffic from uncore IMC counters (empty where there are none).
# io_detail: what the engine reports of its I/O beyond the columns, as JSON (gds: kvikio's
# settings, device/host/registered bytes, why a save was labelled compat); restore_mode: how the
# restore read its bytes (`host`: through host memory; gds into CUDA memory: `gds` or `compat`);
# restore_into: `fresh` (new memory, compared byte for byte with the source) or `in-place` (into
# the state's own tensors, where a second copy would not fit: checked against fingerprints of
# the source taken before the save, bench.storage.verify).
STEPS_CSV, CKPTS_CSV = "training_steps.csv", "training_checkpoints.csv"  # `ckptbench train` runs
# Multi-rank runs (bench.run.distributed) add one row per rank and one aggregate row per repetition.
# Single-process rows: rank 0, world_size 1, node = this host, node_rank 0, aggregate False,
# ranks_active 1, target_map "". Aggregate rows: rank -1, node "", node_rank -1, aggregate True.


def new_run_dir(root: str, config_name: str) -> tuple[str, str]:
    """Create `root/<run-id>` (never an existing one); returns (run_id, path)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_id = f"{stamp}-{config_name}-{uuid.uuid4().hex[:6]}"
    path = os.path.join(root, run_id)
    os.makedirs(path, exist_ok=False)
    return run_id, path


class RowWriter:
    """Appends rows to a CSV (results.csv: `COLUMNS`), each flushed and fsync'd before the next
    case starts."""

    def __init__(self, path: str, columns: list[str] | None = None) -> None:
        self.path = path
        self.columns = columns or COLUMNS
        new = not os.path.exists(path)
        extra = "raise"
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

    def write(self, row: dict[str, Any]) -> None:
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise KeyError(f"result row lacks columns {missing}")
        self._w.writerow(row)
        self._sync()

    def _sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def write_json(path: str, data: Any) -> None:
    """Write JSON atomically (temp file, fsync, rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_rows(run_dir: str) -> Any:
    """results.csv of a run as a pandas DataFrame."""
    import pandas as pd  # analysis-only dependency at import time

    return pd.read_csv(os.path.join(run_dir, "results.csv"))
