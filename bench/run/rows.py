"""Result rows: one repetition measured in phases (save until durable, restore and compare),
its efficiency against the run's ceilings, and the aggregate row of a multi-rank repetition.

bench.run.sweep runs the phases (with barriers between them under torchrun); bench.measure.results writes
the rows; analysis reads them.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import socket
from typing import Any

from bench.engines import REGISTRY
from bench.measure import clock, detail, hostcost, results
from bench.measure import efficiency as judge
from bench.measure import timers as measure
from bench.measure.ceilings import Ceilings
from bench.measure.efficiency import beaten
from bench.storage import verify


def efficiency(row: dict[str, Any], ceilings: Ceilings | None) -> tuple[Any, Any]:
    """The row's (write, snapshot) efficiency (bench.measure.efficiency), judged by the traits
    its engine declares; (None, None) without ceilings or a time to judge."""
    if ceilings is None or not row.get("total_s"):
        return None, None
    return judge.efficiency(row, ceilings, REGISTRY[row["engine"]].traits)


def tensor_stats(state: Any) -> tuple[int, int]:
    """(number of tensors, their bytes) of a state."""
    from bench.storage.tree import flatten

    _, tensors = flatten(state)
    return len(tensors), sum(t.numel() * t.element_size() for _, t in tensors)


def new_row(
    cfg: Any,
    run_id: str,
    case_id: str,
    engine: str,
    eng: Any,
    device: Any,
    w: Any,
    total: int,
    n_tensors: int,
    n_targets: int,
    warm: bool,
    rep: int,
    cache_dropped: bool,
    capped: bool,
) -> dict[str, Any]:
    """A result row with the case's identity filled and every measurement empty; a
    single-process row (rank 0 of 1 on this host)."""
    opts = getattr(eng, "options", None)
    return {
        "run_id": run_id,
        "case_id": case_id,
        "engine": engine,
        "device": device.kind,
        "emulated": device.emulated,
        "gds_mode": "none",
        "workload": w.id,
        "total_bytes": total,
        "tensor_bytes": w.tensor_bytes,
        "n_tensors": n_tensors,
        "n_targets": n_targets,
        "targets_used": 0,
        "rep": rep,
        "warmup": warm,
        "stall_s": None,
        "persist_s": None,
        "total_s": None,
        "restore_s": None,
        "hash_s": None,
        "wait_prev_s": None,
        "pinned_bytes": None,
        "page_cache_peak_bytes": None,
        "rss_peak_bytes": None,
        "cpu_user_s": None,
        "cpu_sys_s": None,
        "checksums": False,
        "staging_grew": False,
        "copied_tensors": 0,
        "cache_dropped": cache_dropped,
        "dtype": cfg.dtype if w.model is None else w.model.dtype,
        "options": json.dumps(opts.model_dump(), sort_keys=True) if opts else "{}",
        "capped": capped,
        "write_efficiency": None,
        "snapshot_efficiency": None,
        "ceiling_beaten": False,
        "verified": False,
        "error": "",
        "rank": 0,
        "world_size": 1,
        "node": socket.gethostname(),
        "node_rank": 0,
        "aggregate": False,
        "ranks_active": 1,
        "target_map": "",
        "io_detail": "",
        "restore_mode": "",
        "restore_resident_bytes": None,
        "restore_into": None,
        **{c: None for c in HOST_COLUMNS},
    }


HOST_COLUMNS = results.HOST_COLUMNS  # what a save cost the host, filled by save_phase


def save_phase(
    row: dict[str, Any],
    eng: Any,
    state: Any,
    name: str,
    ceilings: Ceilings | None,
    after_save: Any = None,
    host: hostcost.Host | None = None,
) -> None:
    """Save `state` as `name` and wait until durable, timed by the harness's clock
    (bench.measure.clock: the stall and the time to durability are read around the engine's
    save(), never taken from it), sampling memory and reading what it cost the host
    (bench.measure.hostcost: the stall ends when save() returns; `host` holds the run's idle
    baseline, taken away from the host figures, and its DRAM counters); fills the row's save
    columns.
    `after_save()`, if given, runs between save() returning and the wait (a hook for fault
    injection). Raises what the save raised.

    The cyclic garbage of what ran before (the last restore, a library's internals) is
    collected first, untimed: a collection that the save's own allocations set off would
    otherwise free it inside this save's stall (bench/PERF.md)."""
    gc.collect()
    sampler = measure.Sampler()
    sampler.start()
    meter = (host or hostcost.Host()).meter(sampler).start()
    try:
        pending = clock.clocked(eng).save(state, name)
        meter.stall()
        if after_save is not None:
            after_save()
        res = pending.wait()
    finally:
        cost = meter.stop()
        sample = sampler.stop()
    row.update(
        gds_mode=res.gds_mode,
        targets_used=res.targets_used,
        stall_s=res.stall_s,
        persist_s=res.persist_s,
        total_s=res.total_s,
        hash_s=res.hash_s,
        wait_prev_s=res.wait_prev_s,
        pinned_bytes=eng.pinned_bytes,
        checksums=res.checksums,
        staging_grew=res.staging_grew,
        copied_tensors=res.copied_tensors,
        **dataclasses.asdict(sample),
        io_detail=detail.dumps(res.detail),
    )
    row.update(cost.columns())  # cpu_user_s, cpu_sys_s: the process tree, not the sampler's
    row["write_efficiency"], row["snapshot_efficiency"] = efficiency(row, ceilings)
    row["ceiling_beaten"] = beaten(row["write_efficiency"], row["snapshot_efficiency"])


def restore_phase(
    row: dict[str, Any],
    eng: Any,
    engine: str,
    state: Any,
    name: str,
    device: Any,
    check: bool,
    load: Any = None,
    fingerprint: list[tuple[str, str]] | None = None,
) -> None:
    """Evict the checkpoint's pages (and check with mincore that they are gone: restore_s must
    be a read from the device), restore it, timed, without the engine's own checksums, so that
    restore_s means the same for every engine; then, untimed, check those checksums and, if
    `check`, compare with the source: byte for byte, or, for a restore in place (`fingerprint`
    of the source taken before the save given: the restore overwrites the state's own tensors,
    and no second copy of it is held), the restored tensors' fingerprints with the source's.
    Fills restore_s, restore_resident_bytes, restore_into, verified and (on a difference)
    error. `load(name, device, checksums[, into])` replaces `eng.load` (bench.run.distributed
    checks the world size first)."""
    files = eng.cached_files(name)
    measure.evict_files(files)
    row["restore_resident_bytes"] = measure.resident_bytes(files)
    in_place = fingerprint is not None
    row["restore_into"] = "in-place" if in_place else "fresh"
    kw = {"into": state} if in_place else {}
    t0 = measure.now_ns()
    loaded = (load or eng.load)(name, device=str(device.torch_device), checksums=False, **kw)
    device.synchronize()
    row["restore_s"] = (measure.now_ns() - t0) / 1e9
    row["restore_mode"] = getattr(eng, "restore_mode", "host")
    eng.check(name, loaded)
    if check:
        if in_place:
            diff = verify.first_fingerprint_difference(fingerprint, verify.fingerprint(loaded))
        else:
            loose = REGISTRY[engine].traits.loose_keys
            compare = verify.first_tensor_difference if loose else verify.first_difference
            diff = compare(state, loaded)
        row["verified"] = diff is None
        if diff:
            row["error"] = f"restored state differs at {diff}"
    del loaded


def error_text(e: BaseException) -> str:
    """An exception as one line for the row's error column."""
    return f"{type(e).__name__}: {e}".replace("\n", " ")


def delete_checkpoint(eng: Any, name: str, log: Any) -> None:
    """Remove checkpoint `name`; a failure is logged, never raised: a checkpoint left on the
    targets costs disk space, an exception here would end the sweep. Any Exception, not only
    OSError: delete() raises UserError too (the claim check, an unreadable `.targets` record).
    An interrupt (KeyboardInterrupt) still goes through."""
    try:
        eng.delete(name)
    except Exception as e:
        log(f"could not delete checkpoint {name}: {e}")


# --- multi-rank repetitions: a rank's failure fails all; the aggregate row ---------------


def _num(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) is not None]


def aggregate(rows: list[dict[str, Any]], ceilings: Ceilings | None = None) -> dict[str, Any]:
    """The aggregate row of one repetition from its per-rank rows (at least one).

    stall_s, total_s, restore_s, hash_s, wait_prev_s: the maximum over ranks (the job waits for
    its slowest rank); persist_s = total_s - stall_s; bytes, tensors, targets used, pinned and
    resident memory, CPU time: sums; page-cache growth: per node the maximum over its ranks (each
    rank samples its whole host), summed over nodes; verified: every rank verified; error: the
    error of the rank it failed on, prefixed with that rank; efficiencies against the run's
    ceilings (measured by one process) as for a single-process row.
    """
    first = rows[0]
    out = {c: first.get(c) for c in results.COLUMNS}

    def top(key: str) -> float | None:
        v = _num(rows, key)
        return max(v) if len(v) == len(rows) else None

    def total(key: str) -> float | None:
        v = _num(rows, key)
        return sum(v) if len(v) == len(rows) else None

    out.update(
        total_bytes=sum(int(r["total_bytes"]) for r in rows),
        n_tensors=sum(int(r["n_tensors"]) for r in rows),
        targets_used=sum(int(r["targets_used"] or 0) for r in rows),
        stall_s=top("stall_s"),
        total_s=top("total_s"),
        restore_s=top("restore_s"),
        hash_s=top("hash_s"),
        wait_prev_s=top("wait_prev_s"),
        pinned_bytes=total("pinned_bytes"),
        rss_peak_bytes=total("rss_peak_bytes"),
        cpu_user_s=total("cpu_user_s"),
        cpu_sys_s=total("cpu_sys_s"),
        copied_tensors=sum(int(r["copied_tensors"] or 0) for r in rows),
        checksums=all(bool(r["checksums"]) for r in rows),
        staging_grew=any(bool(r["staging_grew"]) for r in rows),
        cache_dropped=all(bool(r["cache_dropped"]) for r in rows),
        capped=any(bool(r["capped"]) for r in rows),
        write_efficiency=None,
        snapshot_efficiency=None,
        ceiling_beaten=False,
        verified=all(bool(r["verified"]) for r in rows),
        rank=-1,
        node="",
        node_rank=-1,
        aggregate=True,
    )
    out["persist_s"] = (
        out["total_s"] - out["stall_s"]
        if out["total_s"] is not None and out["stall_s"] is not None
        else None
    )
    per_node: dict[Any, float] = {}
    for r in rows:
        if r.get("page_cache_peak_bytes") is not None:
            key = r["node_rank"]
            per_node[key] = max(per_node.get(key, 0), float(r["page_cache_peak_bytes"]))
    out["page_cache_peak_bytes"] = int(sum(per_node.values())) if per_node else None
    out.update(_host_aggregate(rows))
    if out["total_s"] is not None and out["stall_s"] is not None:
        out["write_efficiency"], out["snapshot_efficiency"] = efficiency(out, ceilings)
        out["ceiling_beaten"] = beaten(out["write_efficiency"], out["snapshot_efficiency"])
    # The rank where it failed, not the ranks that failed with it (see fail_together).
    bad = next((r for r in rows if r["error"] and not r["error"].startswith(FOLLOWED)), None)
    bad = bad or next((r for r in rows if r["error"]), None)
    out["error"] = f"rank {bad['rank']}: {bad['error']}" if bad else ""
    return out


def _host_aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The host columns of an aggregate row. Each rank reads its whole node: its host_cpu_s is
    its own process's CPU plus the node's kernel work (the other ranks are other processes to
    it), so the aggregate sums the processes and adds, per node, the largest kernel part;
    busy time, the baseline and DRAM traffic are the node's: per node the largest, summed.
    None where a rank lacks them; host_others_cpu_s has no meaning across ranks (None)."""

    def val(r: dict[str, Any], k: str) -> float | None:
        v = r.get(k)
        return None if v is None or v == "" else float(v)

    out: dict[str, Any] = {c: None for c in HOST_COLUMNS}
    if any(val(r, "host_cpu_s") is None for r in rows):
        return out
    nodes: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        nodes.setdefault(r["node_rank"], []).append(r)

    def proc(r: dict[str, Any]) -> float:
        return (val(r, "cpu_user_s") or 0.0) + (val(r, "cpu_sys_s") or 0.0)

    def host(host_key: str, proc_of: Any) -> float:
        own = sum(proc_of(r) for r in rows)
        kern = sum(max(val(r, host_key) - proc_of(r) for r in rs) for rs in nodes.values())
        return own + kern

    def node_max(k: str) -> float | None:
        if any(val(r, k) is None for r in rows):
            return None
        return sum(max(val(r, k) for r in rs) for rs in nodes.values())

    out["host_cpu_s"] = host("host_cpu_s", proc)
    if all(val(r, "stall_host_cpu_s") is not None for r in rows):
        out["stall_host_cpu_s"] = host("stall_host_cpu_s", lambda r: val(r, "stall_cpu_s") or 0.0)
    out["stall_cpu_s"] = sum(val(r, "stall_cpu_s") or 0.0 for r in rows)
    out["meter_cpu_s"] = sum(val(r, "meter_cpu_s") or 0.0 for r in rows)
    for k in ("host_busy_s", "host_baseline_cores", "dram_bytes", "stall_dram_bytes"):
        out[k] = node_max(k)
    for k in ("dram_bytes", "stall_dram_bytes"):
        out[k] = None if out[k] is None else int(out[k])
    return out


FOLLOWED = "failed on rank "  # the error of a row whose repetition failed on another rank


def fail_together(rows: list[dict[str, Any]], check: bool) -> dict[str, Any] | None:
    """A repetition that failed on one rank fails on all: every other row's error names the
    first failing rank. Returns that rank's row (None when all succeeded)."""
    bad = next((r for r in rows if r["error"] or (check and not r["verified"])), None)
    if bad is None:
        return None
    why = bad["error"] or "restored state differs from the source"
    bad["error"] = why
    for r in rows:
        if not r["error"]:
            r["error"] = f"{FOLLOWED}{bad['rank']}: {why}"
    return bad
