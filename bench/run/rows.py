"""Result rows: the cells a repetition's row takes from its state and engine, its efficiency
against the run's ceilings, the error column, and the rows of a multi-rank repetition (a rank's
failure fails all; the aggregate row).

The measurement that fills a row is bench.run.protocol's (the save until durable, the restore
and its comparison), run by bench.run.cases with barriers between the phases under torchrun.
The rows are bench.measure.results.Row, whose type also says how the aggregate row combines
each column; bench.measure.results writes them; analysis reads them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from bench.engines import REGISTRY
from bench.measure import columns, hostcost, results, witness
from bench.measure import efficiency as judge
from bench.measure.ceilings import Ceilings
from bench.measure.efficiency import beaten

Judges = Ceilings | list[Ceilings] | None  # one host's ceilings, or every host's (their sum)


def _as_list(ceilings: Judges) -> list[Ceilings]:
    if ceilings is None:
        return []
    return [ceilings] if isinstance(ceilings, Ceilings) else list(ceilings)


def efficiency(row: results.Row | Mapping[str, Any], ceilings: Judges) -> tuple[Any, Any]:
    """The row's (write, snapshot) efficiency (bench.measure.efficiency), judged by the traits
    its engine declares, against `ceilings` (a list: against their sum, every host's for an
    aggregate across hosts); (None, None) without ceilings or a time to judge."""
    cells = row if isinstance(row, Mapping) else columns.values(row)
    cs = _as_list(ceilings)
    if not cs or not cells.get("total_s"):
        return None, None
    return judge.efficiency_by(dict(cells), cs, REGISTRY[cells["engine"]].traits)


def judge_row(row: results.Row, ceilings: Judges) -> None:
    """Fill the row's judged columns (bench.measure.efficiency.JUDGED) from what it measured so
    far: the write and snapshot efficiency once saved, the restore's once restored."""
    row.write_efficiency, row.snapshot_efficiency = efficiency(row, ceilings)
    traits = REGISTRY[row.engine].traits
    cs = _as_list(ceilings)
    row.restore_efficiency = (
        judge.restore_efficiency_by(columns.values(row), cs, traits) if cs else None
    )
    row.ceiling_beaten = beaten(
        row.write_efficiency, row.snapshot_efficiency, row.restore_efficiency
    )


def tensor_stats(state: Any) -> tuple[int, int]:
    """(number of tensors, their bytes) of a state."""
    from bench.storage.tree import flatten

    _, tensors = flatten(state)
    return len(tensors), sum(t.numel() * t.element_size() for _, t in tensors)


def options_json(eng: Any) -> str:
    """The `options` column: the engine's options as JSON with sorted keys (`{}`: none)."""
    opts = getattr(eng, "options", None)
    return json.dumps(opts.model_dump(), sort_keys=True) if opts else "{}"


def error_text(e: BaseException) -> str:
    """An exception as one line for the row's error column."""
    return f"{type(e).__name__}: {e}".replace("\n", " ")


# --- multi-rank repetitions: a rank's failure fails all; the aggregate row ---------------


def _combine(rule: str, vals: list[Any]) -> Any:
    """The ranks' values of one column combined by its rule (bench.measure.columns.Ranks);
    `max` and `sum` are None where a rank has none."""
    if rule == "first":
        return vals[0]
    if rule == "all":
        return all(bool(v) for v in vals)
    if rule == "any":
        return any(bool(v) for v in vals)
    if any(v is None for v in vals):
        return None
    return max(vals) if rule == "max" else sum(vals)


def aggregate(rows: list[results.Row], ceilings: Judges = None) -> results.Row:
    """The aggregate row of one repetition from its per-rank rows (at least one).

    Each column combines the ranks' values by the rule its type declares (results.Row: the
    maximum of the times, the sum of bytes, tensors, pinned and resident memory and process
    CPU time, all ranks verified...); the columns of rule `own` are set here
    (`_own_columns`)."""
    cells = {
        c.name: _combine(c.ranks, [getattr(r, c.name) for r in rows])
        for c in columns.columns(results.Row)
        if c.ranks != "own"
    }
    out = results.Row(**cells, **_own_columns(rows))
    if out.total_s is not None and out.stall_s is not None:
        judge_row(out, ceilings)
    return out


def _own_columns(rows: list[results.Row]) -> dict[str, Any]:
    """The aggregate row's columns of rule `own`: persist_s = total_s - stall_s of the
    aggregate; page-cache growth per node the maximum over its ranks (each rank samples its
    whole host), summed over nodes; the host columns (`_host_aggregate`); the efficiencies
    unjudged (judged by `aggregate` against the run's ceilings, measured by one process, as
    for a single-process row); the error of the rank it failed on, prefixed with that rank;
    rank -1, no node."""
    stall = _combine("max", [r.stall_s for r in rows])
    total = _combine("max", [r.total_s for r in rows])
    per_node: dict[int, int] = {}
    for r in rows:
        if r.page_cache_peak_bytes is not None:
            key = r.node_rank
            per_node[key] = max(per_node.get(key, 0), int(r.page_cache_peak_bytes))
    # The rank where it failed, not the ranks that failed with it (see fail_together).
    bad = next((r for r in rows if r.error and not r.error.startswith(FOLLOWED)), None)
    bad = bad or next((r for r in rows if r.error), None)
    return {
        "durable_witness": _witness_of([r.durable_witness for r in rows], rows),
        "restore_witness": _witness_of([r.restore_witness for r in rows], rows),
        "return_witness": _witness_of([r.return_witness for r in rows], rows),
        "persist_s": total - stall if total is not None and stall is not None else None,
        "page_cache_peak_bytes": sum(per_node.values()) if per_node else None,
        "write_efficiency": None,
        "snapshot_efficiency": None,
        "restore_efficiency": None,
        "ceiling_beaten": False,
        "error": f"rank {bad.rank}: {bad.error}" if bad else "",
        "rank": -1,
        "node": "",
        "node_rank": -1,
        "aggregate": True,
        **_host_aggregate(rows),
    }


def _witness_of(texts: list[str], rows: list[results.Row]) -> str:
    """A witness column of an aggregate row: the first rank's denial (prefixed with the rank),
    else the first rank's `unavailable`, else `yes` when every rank's is (empty when none was
    judged)."""
    for start in ("no", "unavailable"):
        for t, r in zip(texts, rows, strict=True):
            if t.startswith(start):
                return f"{start}: rank {r.rank}: {t.split(': ', 1)[-1]}"
    return witness.YES if texts and all(t == witness.YES for t in texts) else ""


def _host_aggregate(rows: list[results.Row]) -> dict[str, Any]:
    """The host columns of an aggregate row. Each rank reads its whole node: its host_cpu_s is
    its own process's CPU plus the node's kernel work (the other ranks are other processes to
    it), so the aggregate sums the processes and adds, per node, the largest kernel part;
    busy time, the baseline and DRAM traffic are the node's: per node the largest, summed.
    None where a rank lacks them; host_others_cpu_s has no meaning across ranks (None)."""
    out: dict[str, Any] = dict.fromkeys(HOST_COLUMNS)
    if any(r.host_cpu_s is None for r in rows):
        return out
    nodes: dict[int, list[results.Row]] = {}
    for r in rows:
        nodes.setdefault(r.node_rank, []).append(r)

    def proc(r: results.Row) -> float:
        return (r.cpu_user_s or 0.0) + (r.cpu_sys_s or 0.0)

    def host(
        host_of: Callable[[results.Row], float], proc_of: Callable[[results.Row], float]
    ) -> float:
        own = sum(proc_of(r) for r in rows)
        kern = sum(max(host_of(r) - proc_of(r) for r in rs) for rs in nodes.values())
        return own + kern

    def node_max(k: str) -> float | None:
        if any(getattr(r, k) is None for r in rows):
            return None
        return sum(max(getattr(r, k) for r in rs) for rs in nodes.values())

    out["host_cpu_s"] = host(lambda r: r.host_cpu_s or 0.0, proc)
    if all(r.stall_host_cpu_s is not None for r in rows):
        out["stall_host_cpu_s"] = host(
            lambda r: r.stall_host_cpu_s or 0.0, lambda r: r.stall_cpu_s or 0.0
        )
    out["stall_cpu_s"] = sum(r.stall_cpu_s or 0.0 for r in rows)
    out["meter_cpu_s"] = sum(r.meter_cpu_s or 0.0 for r in rows)
    for k in ("host_busy_s", "host_baseline_cores", "dram_bytes", "stall_dram_bytes"):
        out[k] = node_max(k)
    for k in ("dram_bytes", "stall_dram_bytes"):
        out[k] = None if out[k] is None else int(out[k])
    return out


# What a save cost the host (bench.measure.hostcost.Cost) beyond this process's CPU time: the
# columns an aggregate row takes from `_host_aggregate`.
HOST_COLUMNS = tuple(
    f.name for f in dataclasses.fields(hostcost.Cost) if f.name not in ("cpu_user_s", "cpu_sys_s")
)

FOLLOWED = "failed on rank "  # the error of a row whose repetition failed on another rank


def fail_together(rows: list[results.Row], check: bool) -> results.Row | None:
    """A repetition that failed on one rank fails on all: every other row's error names the
    first failing rank. Returns that rank's row (None when all succeeded)."""
    bad = next((r for r in rows if r.error or (check and not r.verified)), None)
    if bad is None:
        return None
    why = bad.error or "restored state differs from the source"
    bad.error = why
    for r in rows:
        if not r.error:
            r.error = f"{FOLLOWED}{bad.rank}: {why}"
    return bad
