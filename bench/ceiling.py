"""Device ceilings, measured in the same run as the engines: what the storage and the memory can
do at best with the same block size and file size, so every engine row can be read as a fraction
of it.

- Storage, for N targets written at once (one file each, the checkpoint's per-target share):
  sequential write with O_DIRECT and a queue depth, and buffered write ended by fsync. With fio
  when it is installed (`direct=1, ioengine=libaio, iodepth=Q` and `direct=0, end_fsync=1`; fio
  counts the final fsync in its runtime), otherwise with a built-in probe that does the same
  with threads and os.pwrite. Which one ran is recorded.
- Memory: a copy of the checkpoint's bytes into a warm (pre-faulted) buffer; on CUDA also a
  device-to-host copy into pinned memory.

Bandwidths are bytes per second, measured as bytes / wall time to durability.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from bench import odirect, pacing
from bench.devices import Device
from bench.staging import PinnedBuffer


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


def _scratch_files(targets: list[str]) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [os.path.join(t, f".ckptbench-ceiling-{tag}-{i}") for i, t in enumerate(targets)]


def _remove(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def fio_write(
    targets: list[str],
    file_bytes: int,
    block: int,
    direct: bool,
    depth: int,
    caps: list[int | None] | None = None,
) -> float:
    """Aggregate write bandwidth of fio writing one file per target at once (bytes/s); a capped
    target gets fio's `rate` limit."""
    files = _scratch_files(targets)
    # The engines write new files without preallocating, and so does fio here: fallocate=none,
    # and create_on_open so that fio does not first lay the file out with writes of its own
    # (that pass is not timed, but its dirty pages would be flushed inside the timed one).
    cmd = [
        "fio",
        "--output-format=json",
        "--group_reporting=1",
        "--end_fsync=1",
        "--fallocate=none",
        "--create_on_open=1",
    ]
    common = [
        "--rw=write",
        f"--bs={block}",
        f"--size={file_bytes}",
        f"--direct={int(direct)}",
        f"--ioengine={'libaio' if direct else 'psync'}",
        f"--iodepth={depth if direct else 1}",
        "--thread=1",
    ]
    for i, f in enumerate(files):
        cap = caps[i] if caps else None
        cmd += [f"--name=t{i}", f"--filename={f}", *common, *([f"--rate={cap}"] if cap else [])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
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
    depth: int,
    caps: list[int | None] | None = None,
) -> float:
    """The same measurement without fio: `depth` threads per target issuing `block`-sized
    pwrites from a pre-faulted aligned buffer (O_DIRECT), or one buffered writer per target,
    then fsync of every file. Aggregate bytes/s over the wall time to durability."""
    files = _scratch_files(targets)
    buf = odirect.HostBuffer(block)
    buf.array[:] = 0x5A  # never zeros: nothing may shortcut a zero page
    view = memoryview(buf.array)
    n_blocks = -(-file_bytes // block)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    fds = [os.open(f, flags, 0o644) for f in files]
    workers = len(fds) * (depth if direct else 1)
    buckets = [pacing.TokenBucket(c, block) if c else None for c in (caps or [None] * len(fds))]

    def write(i: int, j: int) -> None:
        if buckets[i] is not None:
            buckets[i].take(block)
        odirect.pwrite_all(fds[i], view, j * block)

    try:
        t0 = time.perf_counter_ns()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            jobs = [pool.submit(write, i, j) for j in range(n_blocks) for i in range(len(fds))]
            for j in jobs:
                j.result()
            list(pool.map(os.fsync, fds))
        elapsed = (time.perf_counter_ns() - t0) / 1e9
    finally:
        for fd in fds:
            os.close(fd)
        _remove(files)
        buf.close()
    return n_blocks * block * len(fds) / elapsed


def copy_bandwidth(nbytes: int, device: Device, reps: int = 5) -> dict[str, Any]:
    """Copy bandwidth into a warm host buffer (and device-to-host into pinned memory on CUDA):
    one untimed copy first, then the median of `reps` (every run kept in `copy_runs`, B/s)."""
    out: dict[str, Any] = {}
    dst = torch.empty(nbytes, dtype=torch.uint8)
    dst.fill_(1)  # warm: every page faulted in before timing
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(7)
    dst.copy_(src)  # warm-up: caches, threads
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        dst.copy_(src)
        times.append((time.perf_counter_ns() - t0) / 1e9)
    out["copy_Bps"] = nbytes / statistics.median(times)
    out["copy_runs"] = [round(nbytes / t) for t in times]
    del dst, src
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
        out["d2h_Bps"] = nbytes / statistics.median(times)
        out["d2h_runs"] = [round(nbytes / t) for t in times]
    return out


def measure(
    targets: list[str],
    ssd_counts: list[int],
    checkpoint_bytes: int,
    block: int,
    depth: int,
    device: Device,
    use_fio: bool = True,
    drop: Any = None,
    caps: list[int | None] | None = None,
    repetitions: int = 1,
) -> dict[str, Any]:
    """All ceilings for a run: per SSD count, direct and buffered write; copy (and D2H).

    Each storage ceiling is the median of `repetitions` runs, the direct and buffered runs
    alternating; every run is kept (`*_runs`, B/s). `drop` (if given) is called before each
    storage measurement to empty the page cache.
    """
    version = fio_version() if use_fio else None
    write = fio_write if version else builtin_write
    per_n: dict[str, dict[str, Any]] = {}
    modes = (("direct_write", True), ("buffered_write", False))
    for n in sorted(set(ssd_counts)):
        share = max(block, -(-checkpoint_bytes // n) // block * block)
        runs: dict[str, list[float]] = {m: [] for m, _ in modes}
        for _ in range(repetitions):
            for mode, direct in modes:
                if drop:
                    drop()
                bw = write(targets[:n], share, block, direct, depth, caps[:n] if caps else None)
                runs[mode].append(bw)
        row: dict[str, Any] = {}
        for mode, _ in modes:
            row[f"{mode}_Bps"] = statistics.median(runs[mode])
            row[f"{mode}_runs"] = [round(b) for b in runs[mode]]
        per_n[str(n)] = row
    return {
        "tool": version or "builtin",
        "fio": fio_version(),
        "block_bytes": block,
        "checkpoint_bytes": checkpoint_bytes,
        "queue_depth": depth,
        "repetitions": repetitions,
        "per_ssd_count": per_n,
        **copy_bandwidth(checkpoint_bytes, device),
    }
