"""Device ceilings, measured in the same run as the engines: the best the storage and the memory do
for the kind of work the engines do, so that every engine row can be read as a fraction of it
(an efficiency above 1 says the ceiling is wrong, not that the engine won).

- Storage, for N targets written at once, one file each of the checkpoint's per-target share
  (at least `min_bytes` in all, to reach steady state, and at most `max_bytes`, each run cut
  off after `max_seconds`: a probe's cost does not grow with the checkpoint, and its rate is
  a rate once steady state is reached), **preallocated as the engines preallocate** and filled
  with random bytes:
  - O_DIRECT: a small search over writers per target (1, 2, 4; each its own part of the file)
    and queue depth (8, 16, 32), with fio (`direct=1, ioengine=libaio`) when it is installed,
    else a built-in probe (threads with pwrite: depth is the thread count); both write from
    transparent huge pages, as the engines' staging does (`fio_env`);
  - buffered write ended by fsync (fio `direct=0, ioengine=psync, end_fsync=1`), writers 1, 2, 4.
  The best configuration of the search is then run `repetitions` times; the ceiling is the best
  run (every run and the search are kept). Which tool ran is recorded.
- Memory: a copy into a warm buffer with the snapshot's own mechanism (8 MiB pieces from one
  queue over `copy_threads` threads), of the checkpoint's size up to PROBE_COPY_BYTES; on CUDA
  also a device-to-host copy into exactly pinned memory. Best of 5 after a warm-up copy; every
  run kept.
- Serialisation (the baselines' own ceiling): torch.save of a state of the checkpoint's tensor
  size into memory, no disk: what a torch.save-based path cannot exceed before its write.

Bandwidths are bytes per second, measured as bytes / wall time to durability. `measure` returns
the block env.json keeps as `ceilings`; `remeasure` repeats the chosen configurations after the
sweep (`ceilings_after`), since a disk's speed can drift within the hour.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from bench.common.devices import Device
from bench.storage import odirect, pacing
from bench.storage.staging import COPY_PIECE, PinnedBuffer, copy_tasks, run_copies

DIRECT_SEARCH = [(j, q) for j in (1, 2, 4) for q in (8, 16, 32)]  # (writers per target, depth)
BUFFERED_SEARCH = [(j, 1) for j in (1, 2, 4)]  # the defaults of bench.config.sweep.CeilingSpec
COPY_REPS = 5
PROBE_COPY_BYTES = 1 << 30  # the largest copy a ceiling or a probe measures
# A storage run writes at most this much in all, and stops issuing writes after MAX_SECONDS
# (then fsyncs): the defaults of bench.config.sweep.CeilingSpec.
MAX_BYTES = 4 << 30
MAX_SECONDS = 10.0
# Runs of each page-cache write a probe takes; it keeps the best (a ceiling is the best the
# device does). On a VM with a balloon one buffered write runs at either ~0.6 or ~1.4 GB/s
# (bench/PERF.md): one run alone put the model's page-cache rate 2x off. The O_DIRECT write
# varies less: one run.
PROBE_RUNS = 2


def fio_version() -> str | None:
    """fio's version string if fio is installed, else None."""
    exe = shutil.which("fio")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# glibc's tunable that advises malloc's large mappings MADV_HUGEPAGE (glibc 2.35 and newer)
MALLOC_HUGETLB = "glibc.malloc.hugetlb=1"


def _glibc_version() -> tuple[int, int] | None:
    try:
        _, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except (ValueError, OSError, AttributeError):
        return None


def fio_env() -> tuple[dict[str, str], str]:
    """fio's environment, and the pages its write buffers come from.

    fio mallocs its buffers (its default `mem=malloc`), and glibc maps them with 4 KiB pages,
    so an O_DIRECT write of 16 MiB pins 4096 pages where the engines, writing from staging on
    transparent huge pages (bench.storage.odirect.HostBuffer), pin 8. On the development VM that alone
    held fio to 2.2 GB/s on a disk its huge-page runs wrote at 3.7 (bench/PERF.md): a ceiling
    below what the engines reach. glibc's `glibc.malloc.hugetlb=1` advises malloc's mappings
    MADV_HUGEPAGE, so fio writes from huge pages too (where THP is not `never`)."""
    from bench.measure.env import thp_mode

    env = dict(os.environ)
    glibc = _glibc_version()
    mode = thp_mode()
    if mode in (None, "never"):
        return env, f"4 KiB pages (transparent huge pages: {mode or 'unknown'})"
    if glibc is None or glibc < (2, 35):
        return env, "4 KiB pages (no glibc.malloc.hugetlb before glibc 2.35)"
    have = env.get("GLIBC_TUNABLES", "")
    if MALLOC_HUGETLB not in have.split(":"):
        env["GLIBC_TUNABLES"] = f"{have}:{MALLOC_HUGETLB}" if have else MALLOC_HUGETLB
    return env, f"transparent huge pages ({MALLOC_HUGETLB})"


def random_bytes(n: int, seed: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """n incompressible bytes (SFC64), never a constant or zero page (into `out` if given)."""
    rng = np.random.Generator(np.random.SFC64(seed))
    out = np.empty(n, dtype=np.uint8) if out is None else out[:n]
    n8 = n // 8 * 8
    if n8:
        out[:n8].view(np.uint64)[:] = rng.integers(
            0, 2**64 - 1, n8 // 8, dtype=np.uint64, endpoint=True
        )
    if n > n8:
        out[n8:] = np.frombuffer(rng.bytes(n - n8), dtype=np.uint8)
    return out


def _files(targets: list[str], share: int) -> list[str]:
    """A fresh file per target, preallocated to `share` bytes as the engines preallocate theirs."""
    tag = uuid.uuid4().hex[:8]
    paths = [os.path.join(t, f".ckptbench-ceiling-{tag}-{i}") for i, t in enumerate(targets)]
    made = []
    try:
        for p in paths:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            made.append(p)
            try:
                odirect.preallocate(fd, share)
            finally:
                os.close(fd)
    except BaseException:
        _remove(made)
        raise
    return paths


def _remove(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def queue_depth(file_bytes: int, block: int, jobs: int, depth: int) -> int:
    """The deepest queue a writer of `file_bytes / jobs` in `block`s can keep: its blocks."""
    part = max(block, file_bytes // jobs // block * block)
    return max(1, min(depth, part // block))


def fio_write(
    targets: list[str],
    file_bytes: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    caps: list[int | None] | None = None,
    seconds: float | None = None,
) -> float:
    """Aggregate write bandwidth (bytes/s) of fio writing one preallocated file per target, each
    by `jobs` writers on their own part of it, to durability (`end_fsync`, counted in fio's
    runtime), from buffers on huge pages (`fio_env`); a capped target gets fio's `rate` limit,
    shared by its writers; `seconds` ends the writing early (fio's `runtime`), the bytes
    written by then counting. A writer's queue is never deeper than the blocks it has to write:
    fio allocates depth x block of buffer per writer, and 16 writers at depth 32 over 16 MiB
    blocks faulted in 8 GiB for 256 MiB of I/O (12.7 s of wall time, 21 s of system time, for
    a run whose I/O took 0.2 s)."""
    part = max(block, file_bytes // jobs // block * block)
    depth = queue_depth(file_bytes, block, jobs, depth)
    files = _files(targets, part * jobs)
    cmd = [
        "fio",
        "--output-format=json",
        "--group_reporting=1",
        "--end_fsync=1",
        "--fallocate=none",
        "--thread=1",
        *([f"--runtime={max(1, round(seconds))}"] if seconds else []),
    ]
    common = [
        "--rw=write",
        f"--bs={block}",
        f"--size={part}",
        f"--numjobs={jobs}",
        f"--offset_increment={part}",
        f"--direct={int(direct)}",
        f"--ioengine={'libaio' if direct else 'psync'}",
        f"--iodepth={depth if direct else 1}",
    ]
    for i, f in enumerate(files):
        cap = caps[i] if caps else None
        rate = [f"--rate={max(1, cap // jobs)}"] if cap else []
        cmd += [f"--name=t{i}", f"--filename={f}", *common, *rate]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=fio_env()[0])
        if out.returncode:
            raise RuntimeError(f"fio failed: {out.stderr.strip()[:300]}")
        job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
        return float(job["write"]["io_bytes"]) / (float(job["write"]["runtime"]) / 1e3)
    finally:
        _remove(files)


def builtin_write(
    targets: list[str],
    file_bytes: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    caps: list[int | None] | None = None,
    seconds: float | None = None,
) -> float:
    """The same measurement without fio: per target, `jobs x depth` threads (O_DIRECT) or
    `jobs` threads (buffered) issuing `block`-sized pwrites of random bytes from a pre-faulted
    aligned buffer into the preallocated file, then fsync of every file. Aggregate bytes/s over
    the wall time to durability; after `seconds` no more writes are issued."""
    n_blocks = max(1, file_bytes // block)
    # Whatever fails (an open refused, a write), what was made so far is undone, newest first:
    # descriptors closed, the buffer unmapped, the files removed.
    with contextlib.ExitStack() as undo:
        files = _files(targets, n_blocks * block)
        undo.callback(_remove, files)
        buf = odirect.HostBuffer(block)
        undo.callback(buf.close)
        buf.array[:] = random_bytes(buf.nbytes)[: buf.array.size]
        view = memoryview(buf.array)[:block]
        undo.callback(view.release)
        flags = os.O_WRONLY | (os.O_DIRECT if direct else 0)
        fds: list[int] = []
        for f in files:
            fds.append(os.open(f, flags))
            undo.callback(os.close, fds[-1])
        workers = len(fds) * jobs * (depth if direct else 1)
        buckets = [pacing.TokenBucket(c, block) if c else None for c in (caps or [None] * len(fds))]

        stop = time.perf_counter_ns() + int(seconds * 1e9) if seconds else None

        def write(i: int, j: int) -> int:
            if stop is not None and time.perf_counter_ns() > stop:
                return 0
            if buckets[i] is not None:
                buckets[i].take(block)
            odirect.pwrite_all(fds[i], view, j * block)
            return block

        t0 = time.perf_counter_ns()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            jobs_ = [pool.submit(write, i, j) for j in range(n_blocks) for i in range(len(fds))]
            written = sum(f.result() for f in jobs_)
            list(pool.map(os.fsync, fds))
        elapsed = (time.perf_counter_ns() - t0) / 1e9
    return written / elapsed


def copy_bandwidth(
    nbytes: int,
    device: Device,
    reps: int = COPY_REPS,
    threads: int = 1,
    keep: dict[int, Any] | None = None,
) -> dict[str, Any]:
    """Copy bandwidth into a warm host buffer with the snapshot's own mechanism (pieces over
    `threads` threads), and on CUDA device-to-host into exactly pinned memory: one untimed copy
    first, then the best of `reps` (every run kept, B/s). `keep`: host buffers kept there for
    the next call of the same size (the caller releases them with `release`), so that a probe
    repeated through a sweep does not fault in fresh memory each time."""
    out: dict[str, Any] = {}
    if keep is not None and nbytes in keep:
        dst, src_buf = keep[nbytes]
    else:
        if keep is not None:
            release(keep)  # one size kept at a time
        dst = odirect.HostBuffer(nbytes, prefault=True)
        # The source on huge pages too, like the emulated device memory the snapshot copies
        # from (bench.workloads.synthetic.DeviceMemory).
        src_buf = odirect.HostBuffer(nbytes, prefault=False)
        random_bytes(nbytes, out=src_buf.array)
        if keep is not None:
            keep[nbytes] = (dst, src_buf)
    src = src_buf.array[:nbytes]
    tasks = copy_tasks([(dst.array[:nbytes], src)], COPY_PIECE)
    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None

    def copy() -> None:
        if pool is not None and len(tasks) > 1:
            list(pool.map(run_copies, tasks))
        else:
            for t in tasks:
                run_copies(t)

    try:
        copy()  # warm-up: caches, threads
        times = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            copy()
            times.append((time.perf_counter_ns() - t0) / 1e9)
    finally:
        if pool is not None:
            pool.shutdown()
        tasks.clear()  # the views go, so that the mappings can close now
        del src
        if keep is None:
            release({0: (dst, src_buf)})
    out["copy_Bps"] = nbytes / min(times)
    out["copy_runs"] = [round(nbytes / t) for t in times]
    out["copy_threads"] = threads
    if device.is_cuda:
        # Into memory pinned as the engines pin their staging (exactly, with cudaHostRegister),
        # released afterwards: torch's pin_memory would keep the block pinned in its cache.
        buf = PinnedBuffer(nbytes)
        try:
            pinned = torch.from_numpy(buf.array)[:nbytes]
            dev = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device).fill_(3)
            pinned.copy_(dev, non_blocking=True)  # warm-up
            times = []
            for _ in range(reps):
                device.synchronize()
                t0 = time.perf_counter_ns()
                pinned.copy_(dev, non_blocking=True)
                device.synchronize()
                times.append((time.perf_counter_ns() - t0) / 1e9)
            del pinned, dev
        finally:
            buf.close()
        out["d2h_Bps"] = nbytes / min(times)
        out["d2h_runs"] = [round(nbytes / t) for t in times]
    return out


def release(keep: dict[int, Any]) -> None:
    """Free the buffers `copy_bandwidth` kept."""
    for bufs in keep.values():
        for b in bufs:
            b.close()
    keep.clear()


def serialize_bandwidth(nbytes: int, tensor_bytes: int, reps: int = 3) -> dict[str, Any]:
    """torch.save of `nbytes` of random float32 tensors of `tensor_bytes` each into memory (no
    disk): the rate a torch.save-based path cannot exceed before it writes. Best of `reps`."""
    n = max(1, nbytes // max(tensor_bytes, 4))
    each = max(1, min(tensor_bytes, nbytes) // 4)
    raw = random_bytes(n * each * 4)
    state = {
        f"t{i}": torch.from_numpy(raw[i * each * 4 : (i + 1) * each * 4].view(np.float32))
        for i in range(n)
    }
    sink = io.BytesIO()
    torch.save(state, sink)  # warm-up; also sizes the buffer
    times = []
    for _ in range(reps):
        sink.seek(0)
        t0 = time.perf_counter_ns()
        torch.save(state, sink)
        times.append((time.perf_counter_ns() - t0) / 1e9)
    total = n * each * 4
    return {
        "serialize_Bps": total / min(times),
        "serialize_runs": [round(total / t) for t in times],
    }


def probe_bytes(checkpoint_bytes: int, min_bytes: int, max_bytes: int) -> int:
    """What a storage run writes in all: the checkpoint, at least `min_bytes` (steady state),
    at most `max_bytes` (a cost that does not grow with the checkpoint)."""
    return min(max(checkpoint_bytes, min_bytes), max(max_bytes, min_bytes))


def storage_runs(
    ssd_counts: list[int],
    direct_search: list[Any],
    buffered_jobs: list[int],
    repetitions: int,
    searched: bool = True,
) -> int:
    """How many storage runs `measure` makes: per SSD count, the search (when it has more than
    one configuration and `searched`) and the repetitions of the chosen one, O_DIRECT and
    buffered."""
    n = 0
    for grid in (len(direct_search), len(buffered_jobs)):
        n += (grid if searched and grid > 1 else 0) + repetitions
    return n * len(set(ssd_counts))


def _storage(
    write: Any,
    targets: list[str],
    share: int,
    block: int,
    direct: bool,
    configs: list[tuple[int, int]],
    caps: list[int | None] | None,
    drop: Any,
    repetitions: int,
    seconds: float | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Search `configs` once each (when more than one), then run the best `repetitions` times;
    the ceiling is the best run. `progress(label)` is called after each run."""
    mode = "direct_write" if direct else "buffered_write"

    def run(jobs: int, depth: int) -> float:
        if drop:
            drop()
        bw = write(targets, share, block, direct, jobs, depth, caps, seconds)
        if progress:
            progress(f"{mode.replace('_', ' ')} x{len(targets)}: {bw / 1e9:.2f} GB/s")
        return bw

    if direct:  # a depth beyond a writer's blocks is the same run: measured once, as it ran
        configs = list(dict.fromkeys((j, queue_depth(share, block, j, q)) for j, q in configs))
    search = []
    if len(configs) > 1:
        for jobs, depth in configs:
            search.append({"jobs": jobs, "iodepth": depth, "Bps": round(run(jobs, depth))})
        best = max(search, key=lambda r: r["Bps"])
        jobs, depth = best["jobs"], best["iodepth"]
    else:
        jobs, depth = configs[0]
    runs = [run(jobs, depth) for _ in range(repetitions)]
    all_ = runs + [r["Bps"] for r in search if (r["jobs"], r["iodepth"]) == (jobs, depth)]
    return {
        f"{mode}_Bps": max(all_),
        f"{mode}_median_Bps": float(np.median(runs)),
        f"{mode}_runs": [round(b) for b in runs],
        f"{mode}_config": {"jobs": jobs, "iodepth": depth},
        **({f"{mode}_search": search} if search else {}),
    }


def measure(
    targets: list[str],
    ssd_counts: list[int],
    checkpoint_bytes: int,
    block: int,
    device: Device,
    use_fio: bool = True,
    drop: Any = None,
    caps: list[int | None] | None = None,
    repetitions: int = 3,
    min_bytes: int = 1 << 30,
    copy_threads: int = 1,
    tensor_bytes: int = 64 << 20,
    configs: dict[str, Any] | None = None,
    direct_search: list[tuple[int, int]] | None = None,
    buffered_jobs: list[int] | None = None,
    max_bytes: int = MAX_BYTES,
    max_seconds: float | None = MAX_SECONDS,
    progress: Any = None,
) -> dict[str, Any]:
    """All ceilings for a run: per SSD count, direct and buffered write; copy (and D2H);
    serialisation. `drop` (if given) is called before each storage measurement to empty the
    page cache. `configs` (from an earlier `measure`) skips the search: {"N": {mode: {jobs,
    iodepth}}}. `direct_search` (jobs, depth) and `buffered_jobs` replace the default grids.
    Each storage run writes the checkpoint's bytes, at least `min_bytes` and at most
    `max_bytes`, and stops issuing writes after `max_seconds`; `progress(label)` is called
    after each (see `storage_runs` for how many there are)."""
    version = fio_version() if use_fio else None
    write = fio_write if version else builtin_write
    per_n: dict[str, dict[str, Any]] = {}
    total = probe_bytes(checkpoint_bytes, min_bytes, max_bytes)
    for n in sorted(set(ssd_counts)):
        share = max(block, -(-total // n) // block * block)
        row: dict[str, Any] = {"file_bytes": share}
        grids = (
            (True, [tuple(c) for c in direct_search] if direct_search else DIRECT_SEARCH),
            (False, [(j, 1) for j in buffered_jobs] if buffered_jobs else BUFFERED_SEARCH),
        )
        for direct, search in grids:
            mode = "direct_write" if direct else "buffered_write"
            chosen = (configs or {}).get(str(n), {}).get(mode)
            todo = [(chosen["jobs"], chosen["iodepth"])] if chosen else search
            row.update(
                _storage(
                    write,
                    targets[:n],
                    share,
                    block,
                    direct,
                    todo,
                    caps[:n] if caps else None,
                    drop,
                    repetitions,
                    max_seconds,
                    progress,
                )
            )
        per_n[str(n)] = row
    return {
        "tool": version or "builtin",
        "fio": fio_version(),
        **({"fio_buffers": fio_env()[1]} if version else {}),
        "block_bytes": block,
        "checkpoint_bytes": checkpoint_bytes,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "max_seconds": max_seconds,
        "repetitions": repetitions,
        "per_ssd_count": per_n,
        **copy_bandwidth(min(checkpoint_bytes, PROBE_COPY_BYTES), device, threads=copy_threads),
        **serialize_bandwidth(min(checkpoint_bytes, 256 << 20), tensor_bytes),
    }


def probe(
    targets: list[str],
    nbytes: int,
    block: int,
    device: Device,
    configs: dict[str, Any],
    use_fio: bool = True,
    drop: Any = None,
    caps: list[int | None] | None = None,
    copy_threads: int = 1,
    keep: dict[int, Any] | None = None,
    max_bytes: int = MAX_BYTES,
    max_seconds: float | None = MAX_SECONDS,
) -> dict[str, Any]:
    """The ceilings again, once, inside a sweep: the configurations chosen before the sweep
    (`configs`: {mode: {jobs, iodepth}} for these targets), plus the page-cache path with a
    single writer (what torch.save and safetensors are) and the copy ceiling (median of 3, of
    at most 1 GiB, buffers reused through `keep`); `nbytes` in all, as the checkpoint. The model predicts each
    workload's rows from the probes around it, so that a disk that drifts 2x within the hour
    drifts in the model too. Bandwidths in B/s: one run of O_DIRECT, the best of PROBE_RUNS
    of each page-cache write (every run kept under `{mode}_runs`). (Serialisation is left to
    the ceilings before and after: on these machines it is several times the disk.) The
    storage runs are bounded as `measure`'s are (`max_bytes`, `max_seconds`)."""
    write = fio_write if use_fio and fio_version() else builtin_write
    share = max(block, -(-min(nbytes, max_bytes) // len(targets)) // block * block)
    out: dict[str, Any] = {"n_targets": len(targets), "file_bytes": share}
    todo = [(m, configs[m]["jobs"], configs[m]["iodepth"]) for m in configs]
    if "buffered_write" in configs and configs["buffered_write"]["jobs"] != 1:
        todo.append(("buffered_write_1", 1, 1))
    for mode, jobs, depth in todo:
        runs = []
        for _ in range(1 if mode == "direct_write" else PROBE_RUNS):
            if drop:
                drop()
            direct = mode == "direct_write"
            runs.append(round(write(targets, share, block, direct, jobs, depth, caps, max_seconds)))
        out[f"{mode}_runs"] = runs
        out[f"{mode}_Bps"] = max(runs)
    if "buffered_write_1_Bps" not in out and "buffered_write_Bps" in out:
        out["buffered_write_1_Bps"] = out["buffered_write_Bps"]
        out["buffered_write_1_runs"] = out["buffered_write_runs"]
    # At most PROBE_COPY_BYTES: its buffers stay allocated through the sweep.
    each = min(nbytes, PROBE_COPY_BYTES)
    copy = copy_bandwidth(each, device, reps=3, threads=copy_threads, keep=keep)
    out["copy_Bps"] = float(np.median(copy["copy_runs"]))
    if "d2h_runs" in copy:
        out["d2h_Bps"] = float(np.median(copy["d2h_runs"]))
    return out


def chosen_configs(c: dict[str, Any]) -> dict[str, Any]:
    """The configuration each storage ceiling settled on, to measure again without a search."""
    return {
        n: {
            m: row[f"{m}_config"]
            for m in ("direct_write", "buffered_write")
            if f"{m}_config" in row
        }
        for n, row in c.get("per_ssd_count", {}).items()
    }


def drift(before: dict[str, Any], after: dict[str, Any], tolerance: float = 0.2) -> list[str]:
    """Ceilings that moved by more than `tolerance` between before and after the sweep."""
    out = []
    for n, row in before.get("per_ssd_count", {}).items():
        for m in ("direct_write", "buffered_write"):
            a = after.get("per_ssd_count", {}).get(n, {}).get(f"{m}_Bps")
            b = row.get(f"{m}_Bps")
            if a and b and abs(a / b - 1) > tolerance:
                out.append(
                    f"{m.replace('_', ' ')} ceiling of {n} target(s) moved from "
                    f"{b / 1e9:.2f} GB/s before the sweep to {a / 1e9:.2f} GB/s after"
                )
    return out
