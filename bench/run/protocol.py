"""The measurement protocol: what one repetition of a case measures, phase by phase, into its
row (bench.measure.results.Row).

- `save_phase`: the save until durable, timed by the harness's clock (never by the engine),
  with the memory and host cost it took and the device's own counters as its witness;
- `restore_phase`: the restore as a restart or fresh, from the device with the checkpoint's
  pages evicted first, timed around the load alone, then compared with the source;
- `delete_checkpoint`: the checkpoint removed after, whatever happened.

bench.run.cases runs the phases of each repetition (with barriers between them under
torchrun, bench.run.cases.Repetition); bench.run.rows builds and combines the rows.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.engines import REGISTRY
from bench.measure import clock, columns, detail, hostcost, results, witness
from bench.measure import timers as measure
from bench.measure.ceilings import Ceilings
from bench.measure.clock import Clocked
from bench.run import restart
from bench.run.rows import judge_row

if TYPE_CHECKING:
    from bench.common.devices import Device


def save_phase(
    row: results.Row,
    eng: Clocked,
    state: Any,
    name: str,
    ceilings: Ceilings | None,
    after_save: Callable[[], None] | None = None,
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
    seen = pending.witnessed  # the device's counters around it, read by the clock
    row.device_written_bytes, row.device_flushes = seen.bytes, seen.flushes
    row.durable_witness = seen.text
    row.return_witness = pending.witnessed_at_return().text
    row.gds_mode = res.gds_mode
    row.targets_used = res.targets_used
    row.stall_s, row.persist_s, row.total_s = res.stall_s, res.persist_s, res.total_s
    row.hash_s, row.wait_prev_s = res.hash_s, res.wait_prev_s
    row.pinned_bytes = eng.pinned_bytes
    row.checksums, row.staging_grew = res.checksums, res.staging_grew
    row.copied_tensors = res.copied_tensors
    row.io_detail = detail.dumps(res.detail)
    columns.fill(row, sample)
    columns.fill(row, cost)  # cpu_user_s, cpu_sys_s: the process tree, not the sampler's
    judge_row(row, ceilings)
    if seen.denied and not REGISTRY[row.engine].traits.baseline:
        # One of ckptbench's own paths said durable and the device says otherwise: a failure,
        # as an unverified restore is (a library's denied save is reported, not failed).
        row.error = f"not durable as the device saw it: {seen.text}"


def restore_phase(
    row: results.Row,
    eng: Clocked,
    engine: str,
    state: Any,
    name: str,
    device: Device,
    check: bool,
    load: Callable[..., Any] | None = None,
    fingerprint: list[tuple[str, str]] | None = None,
) -> None:
    """Restore checkpoint `name` as a restart does (`fingerprint` of the source taken before
    the save given: into the state's own tensors, scrubbed first, bench.run.restart) or into
    new memory (fresh). Untimed: the destination made, the checkpoint's pages evicted (and
    checked with mincore that they are gone: restore_s must be a read from the device). Timed:
    the load, without the engine's own checksums, so that restore_s means the same for every
    engine. Untimed again: those checksums and, if `check`, the restored state against the
    source (restart: the destination's fingerprints with the source's; fresh: byte for byte).
    Fills restore_s, restore_resident_bytes, restore_cached_bytes (the page cache the restore
    left behind), device_read_bytes and restore_witness (what the targets' block devices
    counted read during the load, bench.measure.witness), restore_into, verified and (on a
    difference) error naming the first tensor.
    `load(name, device, checksums[, into])` replaces `eng.load` (bench.run.distributed checks
    the world size first)."""
    row.restore_into = restart.RESTART if fingerprint is not None else restart.FRESH
    dest = restart.restart(state, fingerprint, eng) if fingerprint is not None else restart.fresh()
    files = eng.cached_files(name)
    measure.evict_files(files)
    row.restore_resident_bytes = measure.resident_bytes(files)
    kw = dest.load_kwargs()
    # the device's counters around the timed load (bench.measure.witness): did it read the
    # checkpoint's bytes from the device, as restore_resident_bytes says it must
    seer = witness.Judge(list(getattr(eng, "targets", [])))
    seer.begin()
    t0 = measure.now_ns()
    loaded = (load or eng.load)(name, device=str(device.torch_device), checksums=False, **kw)
    device.synchronize()
    row.restore_s = (measure.now_ns() - t0) / 1e9
    seen = seer.restore(files)
    row.device_read_bytes, row.restore_witness = seen.bytes, seen.text
    row.restore_cached_bytes = measure.resident_bytes(files)
    row.restore_mode = getattr(eng, "restore_mode", "host")
    eng.check(name, dest.restored(loaded))
    if check:
        diff = dest.first_difference(state, loaded, REGISTRY[engine].traits.loose_keys)
        row.verified = diff is None
        if diff:
            row.error = f"restored state differs at {diff}"
    del loaded


def delete_checkpoint(eng: Clocked, name: str, log: Callable[[str], None]) -> None:
    """Remove checkpoint `name`; a failure is logged, never raised: a checkpoint left on the
    targets costs disk space, an exception here would end the sweep. Any Exception, not only
    OSError: delete() raises UserError too (the claim check, an unreadable `.targets` record).
    An interrupt (KeyboardInterrupt) still goes through."""
    try:
        eng.delete(name)
    except Exception as e:
        log(f"could not delete checkpoint {name}: {e}")
