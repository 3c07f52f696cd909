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
  - buffered write ended by fsync (fio `direct=0, ioengine=psync, end_fsync=1`), writers 1, 2, 4;
  - the same two reads, of files of random bytes written first (untimed) with O_DIRECT: O_DIRECT
    read (fio `rw=read, direct=1, ioengine=libaio`) over the same search, and buffered read of
    a cold file (its pages evicted before each run; fio `invalidate=1`), readers 1, 2, 4. No
    rate cap: the engines' restores are not paced.
  The best configuration of the search is then run `repetitions` times; the ceiling is the best
  run (every run and the search are kept). Which tool ran is recorded.
- Memory: a copy into a warm buffer with the snapshot's own mechanism (8 MiB pieces from one
  queue over `copy_threads` threads), of the checkpoint's size up to PROBE_COPY_BYTES; on CUDA
  also a device-to-host copy into exactly pinned memory and a host-to-device copy from it. Best
  of 5 after a warm-up copy; every run kept.
- Serialisation (the baselines' own ceiling): torch.save of a state of the checkpoint's tensor
  size into memory, no disk: what a torch.save-based path cannot exceed before its write.

Bandwidths are bytes per second, measured as bytes / wall time to durability. Each kind of
bench.measure.ceilings.KINDS has its function here (`MEASURERS`). `measure` returns the
`Ceilings` env.json keeps as `ceilings`, and, given their chosen configurations, those after the
sweep (`ceilings_after`: a disk's speed can drift within the hour); `probe` the `Probe` of one
workload's targets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.common.devices import Device
from bench.measure import ceilings
from bench.measure.ceilings import (
    BUFFERED_READ,
    BUFFERED_WRITE,
    BUFFERED_WRITE_1,
    COPY,
    D2H,
    DIRECT_READ,
    DIRECT_WRITE,
    H2D,
    SERIALIZE,
    Ceilings,
    Count,
    Kind,
    Measured,
    Method,
    Probe,
    Tried,
    Writers,
)
from bench.measure.timers import evict_files
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
        _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()  # "glibc 2.36"
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
    files = _files(targets, part * jobs)
    try:
        return _fio("write", files, part, block, direct, jobs, depth, caps, seconds)
    finally:
        _remove(files)


def fio_read(
    files: list[str],
    file_bytes: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    seconds: float | None = None,
) -> float:
    """Aggregate read bandwidth (bytes/s) of fio reading `files` (`_read_files`), each by `jobs`
    readers on their own part of it, into buffers on huge pages; fio drops each file's pages
    before it starts (`invalidate=1`). No rate cap: the engines' restores are not paced."""
    part = max(block, file_bytes // jobs // block * block)
    return _fio("read", files, part, block, direct, jobs, depth, None, seconds)


def _fio(
    rw: str,
    files: list[str],
    part: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    caps: list[int | None] | None,
    seconds: float | None,
) -> float:
    """One fio run of `rw` over `files`, each by `jobs` workers of `part` bytes; its bytes/s."""
    depth = queue_depth(part * jobs, block, jobs, depth)
    cmd = [
        "fio",
        "--output-format=json",
        "--group_reporting=1",
        *(["--end_fsync=1", "--fallocate=none"] if rw == "write" else ["--invalidate=1"]),
        "--thread=1",
        *([f"--runtime={max(1, round(seconds))}"] if seconds else []),
    ]
    common = [
        f"--rw={rw}",
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
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=fio_env()[0])
    if out.returncode:
        raise RuntimeError(f"fio failed: {out.stderr.strip()[:300]}")
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    return float(job[rw]["io_bytes"]) / (float(job[rw]["runtime"]) / 1e3)


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
    with contextlib.ExitStack() as undo:
        files = _files(targets, n_blocks * block)
        undo.callback(_remove, files)
        return _builtin(files, n_blocks, block, direct, jobs, depth, caps, seconds, write=True)


def builtin_read(
    files: list[str],
    file_bytes: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    seconds: float | None = None,
) -> float:
    """Reading `files` (`_read_files`) without fio: per file, `jobs x depth` threads (O_DIRECT)
    or `jobs` threads (buffered) issuing `block`-sized preads into a pre-faulted aligned buffer,
    each file's pages evicted first. Aggregate bytes/s; after `seconds` no more reads are
    issued. No rate cap: the engines' restores are not paced."""
    evict_files(files)
    n_blocks = max(1, file_bytes // block)
    return _builtin(files, n_blocks, block, direct, jobs, depth, None, seconds, write=False)


def _builtin(
    files: list[str],
    n_blocks: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    caps: list[int | None] | None,
    seconds: float | None,
    write: bool,
) -> float:
    """`n_blocks` blocks of each file written from (then fsync'd), or read into, one aligned
    buffer by a pool of threads; bytes/s over the wall time."""
    # Whatever fails (an open refused, a write), what was made so far is undone, newest first:
    # descriptors closed, the buffer unmapped.
    with contextlib.ExitStack() as undo:
        buf = odirect.HostBuffer(block)
        undo.callback(buf.close)
        if write:
            buf.array[:] = random_bytes(buf.nbytes)[: buf.array.size]
        view = buf.array.data[:block]
        undo.callback(view.release)
        flags = (os.O_WRONLY if write else os.O_RDONLY) | (os.O_DIRECT if direct else 0)
        fds: list[int] = []
        for f in files:
            fds.append(os.open(f, flags))
            undo.callback(os.close, fds[-1])
        workers = len(fds) * jobs * (depth if direct else 1)
        buckets = [pacing.TokenBucket(c, block) if c else None for c in (caps or [None] * len(fds))]
        io = odirect.pwrite_all if write else odirect.pread_into

        stop = time.perf_counter_ns() + int(seconds * 1e9) if seconds else None

        def one(i: int, j: int) -> int:
            if stop is not None and time.perf_counter_ns() > stop:
                return 0
            bucket = buckets[i]
            if bucket is not None:
                bucket.take(block)
            io(fds[i], view, j * block)
            return block

        t0 = time.perf_counter_ns()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            done = [pool.submit(one, i, j) for j in range(n_blocks) for i in range(len(fds))]
            moved = sum(f.result() for f in done)
            if write:
                list(pool.map(os.fsync, fds))
        elapsed = (time.perf_counter_ns() - t0) / 1e9
    return moved / elapsed


def _read_files(targets: list[str], share: int, block: int) -> list[str]:
    """What a read ceiling reads: a file per target of `share` bytes, preallocated as the
    engines' files are, each `block` of it different random bytes, written with O_DIRECT and
    synced (untimed; no page of it is left in the page cache)."""
    files = _files(targets, share)
    with contextlib.ExitStack() as undo:
        undo.push(lambda *exc: _remove(files) if exc[0] is not None else None)
        buf = odirect.HostBuffer(block)
        undo.callback(buf.close)
        view = buf.array.data[:block]
        undo.callback(view.release)
        for t, f in enumerate(files):
            fd = os.open(f, os.O_WRONLY | os.O_DIRECT)
            try:
                for j, off in enumerate(range(0, share, block)):
                    random_bytes(block, seed=(t << 32) + j, out=buf.array)
                    odirect.pwrite_all(fd, view[: min(block, share - off)], off)
                os.fsync(fd)
            finally:
                os.close(fd)
    return files


def copy_bandwidth(
    nbytes: int,
    reps: int = COPY_REPS,
    threads: int = 1,
    keep: dict[int, Any] | None = None,
) -> list[float]:
    """Copy bandwidth (B/s of each run) into a warm host buffer with the snapshot's own
    mechanism (pieces over `threads` threads): one untimed copy first, then `reps` timed ones.
    `keep`: host buffers kept there for the next call of the same size (the caller releases
    them with `release`), so that a probe repeated through a sweep does not fault in fresh
    memory each time."""
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
    return [nbytes / t for t in times]


def d2h_bandwidth(nbytes: int, device: Device, reps: int = COPY_REPS) -> list[float]:
    """Device-to-host bandwidth (B/s of each run) into memory pinned as the engines pin their
    staging (exactly, with cudaHostRegister), released afterwards (torch's pin_memory would
    keep the block pinned in its cache): one untimed copy first, then `reps` timed ones."""
    return _pinned_copy(nbytes, device, reps, to_device=False)


def h2d_bandwidth(nbytes: int, device: Device, reps: int = COPY_REPS) -> list[float]:
    """Host-to-device bandwidth (B/s of each run) from memory pinned as the engines' staging
    is, as `d2h_bandwidth` measures the other way: what bounds a restore through host memory."""
    return _pinned_copy(nbytes, device, reps, to_device=True)


def _pinned_copy(nbytes: int, device: Device, reps: int, to_device: bool) -> list[float]:
    buf = PinnedBuffer(nbytes)
    try:
        pinned = torch.from_numpy(buf.array)[:nbytes]
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device).fill_(3)
        if to_device:
            pinned.copy_(torch.from_numpy(random_bytes(nbytes)))
        dst, src = (dev, pinned) if to_device else (pinned, dev)
        dst.copy_(src, non_blocking=True)  # warm-up
        times = []
        for _ in range(reps):
            device.synchronize()
            t0 = time.perf_counter_ns()
            dst.copy_(src, non_blocking=True)
            device.synchronize()
            times.append((time.perf_counter_ns() - t0) / 1e9)
        del pinned, dev, dst, src
    finally:
        buf.close()
    return [nbytes / t for t in times]


def release(keep: dict[int, Any]) -> None:
    """Free the buffers `copy_bandwidth` kept."""
    for bufs in keep.values():
        for b in bufs:
            b.close()
    keep.clear()


def serialize_bandwidth(nbytes: int, tensor_bytes: int, reps: int = 3) -> list[float]:
    """torch.save of `nbytes` of random float32 tensors of `tensor_bytes` each into memory (no
    disk), B/s of each of `reps` runs after a warm-up: the rate a torch.save-based path cannot
    exceed before it writes."""
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
    return [total / t for t in times]


def probe_bytes(checkpoint_bytes: int, min_bytes: int, max_bytes: int) -> int:
    """What a storage run writes in all: the checkpoint, at least `min_bytes` (steady state),
    at most `max_bytes` (a cost that does not grow with the checkpoint)."""
    return min(max(checkpoint_bytes, min_bytes), max(max_bytes, min_bytes))


# -- each kind's measurement -------------------------------------------------------------------

# fio_write or builtin_write: (targets, file_bytes, block, direct, jobs, depth, caps, seconds)
Write = Callable[..., float]
# fio_read or builtin_read: (files, file_bytes, block, direct, jobs, depth, seconds)
Read = Callable[..., float]
READS = tuple(k for k in ceilings.KINDS if k.reads)


@dataclass(frozen=True)
class Session:
    """What the measurer of each kind gets: where and how this measurement runs."""

    write: Write  # the storage runs' tool
    device: Device
    targets: list[str]  # written at once, one file each (a storage kind's)
    share: int  # each target's file
    block: int  # each write
    nbytes: int  # the checkpoint's bytes
    caps: list[int | None] | None = None  # each target's write cap
    drop: Callable[[], Any] | None = None  # empties the page cache before each storage run
    repetitions: int = 3  # runs of the configuration a search chose
    max_seconds: float | None = MAX_SECONDS  # a storage run issues no write after this
    copy_threads: int = 1
    tensor_bytes: int = 64 << 20
    grids: Mapping[Kind, Sequence[Writers]] = field(default_factory=dict)  # what is searched
    chosen: Mapping[Kind, Writers] = field(default_factory=dict)  # run again, no search
    # A probe between workloads: the chosen configurations only, once (the page-cache writes
    # PROBE_RUNS times), the copy the median of 3 into buffers kept in `keep`, no serialisation.
    probe: bool = False
    keep: dict[int, Any] | None = None
    progress: Callable[[str], Any] | None = None  # called after each storage run
    read: Read = builtin_read  # the read kinds' tool
    reads: bool = True  # measure the read kinds
    # The files the read kinds read, made once per set of targets and share (`read_files`) and
    # removed by whoever made the session (`remove_read_files`).
    made: dict[tuple[tuple[str, ...], int], list[str]] = field(default_factory=dict)

    def read_files(self) -> list[str]:
        key = (tuple(self.targets), self.share)
        if key not in self.made:
            self.made[key] = _read_files(self.targets, self.share, self.block)
        return self.made[key]

    def remove_read_files(self) -> None:
        for files in self.made.values():
            _remove(files)
        self.made.clear()

    def run(self, kind: Kind, direct: bool, w: Writers) -> float:
        """One storage run of `kind` (B/s), the page cache emptied first where it can be."""
        files = self.read_files() if kind in READS else None
        if self.drop:
            self.drop()
        if files is not None:
            bw = self.read(
                files, self.share, self.block, direct, w.jobs, w.iodepth, self.max_seconds
            )
        else:
            bw = self.write(
                self.targets,
                self.share,
                self.block,
                direct,
                w.jobs,
                w.iodepth,
                self.caps,
                self.max_seconds,
            )
        if self.progress:
            self.progress(
                f"{kind.name.replace('_', ' ')} x{len(self.targets)}: {bw / 1e9:.2f} GB/s"
            )
        return bw


def _storage(s: Session, kind: Kind, direct: bool, probe_runs: int) -> Measured | None:
    """Before and after the sweep: a search over the kind's grid once each (when it has more
    than one configuration), then the best configuration `repetitions` times, or the chosen
    one alone. In a probe: the chosen configuration `probe_runs` times (none chosen: None)."""
    chosen = s.chosen.get(kind)
    if s.probe:
        if chosen is None:
            return None
        return Measured.best_of(
            [round(s.run(kind, direct, chosen)) for _ in range(probe_runs)], chosen
        )
    configs = [chosen] if chosen else list(s.grids[kind])
    if direct:  # a depth beyond a writer's blocks is the same run: measured once, as it ran
        configs = list(
            dict.fromkeys(
                Writers(w.jobs, queue_depth(s.share, s.block, w.jobs, w.iodepth)) for w in configs
            )
        )
    search = []
    if len(configs) > 1:
        search = [Tried(w, round(s.run(kind, direct, w))) for w in configs]
        writers = max(search, key=lambda t: t.Bps).writers
    else:
        writers = configs[0]
    runs = [s.run(kind, direct, writers) for _ in range(s.repetitions)]
    return Measured.best_of(runs, writers, search)


def direct_write(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """O_DIRECT writes (fio `direct=1, ioengine=libaio`)."""
    return _storage(s, DIRECT_WRITE, True, 1)


def buffered_write(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """Buffered writes ended by fsync (fio `direct=0, ioengine=psync, end_fsync=1`), the best
    of PROBE_RUNS in a probe."""
    return _storage(s, BUFFERED_WRITE, False, PROBE_RUNS)


def buffered_write_1(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """Buffered writes by one writer, in a probe: what torch.save and safetensors are (the same
    runs as `buffered_write` where that kept one writer). Before and after the sweep the
    buffered search's run of one writer stands for it (BUFFERED_WRITE_1.derive): None."""
    b = got.get(BUFFERED_WRITE)
    if not s.probe or b is None:
        return None
    if b.writers is not None and b.writers.jobs == 1:
        return b
    one = Writers(1)
    runs = [round(s.run(BUFFERED_WRITE_1, False, one)) for _ in range(PROBE_RUNS)]
    return Measured.best_of(runs, one)


def direct_read(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """O_DIRECT reads (fio `rw=read, direct=1, ioengine=libaio`) of files written before."""
    return _storage(s, DIRECT_READ, True, 1) if s.reads else None


def buffered_read(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """Buffered reads of files whose pages were evicted first (fio `direct=0, ioengine=psync,
    invalidate=1`), the best of PROBE_RUNS in a probe."""
    return _storage(s, BUFFERED_READ, False, PROBE_RUNS) if s.reads else None


def _memory(s: Session, runs: Callable[[int, int], list[float]]) -> Measured:
    """A memory ceiling of the checkpoint's size up to PROBE_COPY_BYTES: the best of COPY_REPS,
    or in a probe the median of 3; `runs(nbytes, reps)` measures it."""
    each = min(s.nbytes, PROBE_COPY_BYTES)
    if s.probe:
        return Measured.median_of(runs(each, 3))
    return Measured.best_of(runs(each, COPY_REPS))


def copy(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """A copy into a warm host buffer by the snapshot's mechanism and threads."""
    return _memory(s, lambda n, reps: copy_bandwidth(n, reps, s.copy_threads, s.keep))


def d2h(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """On CUDA, a device-to-host copy into exactly pinned memory; elsewhere none."""
    if not s.device.is_cuda:
        return None
    return _memory(s, lambda n, reps: d2h_bandwidth(n, s.device, reps))


def h2d(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """On CUDA, a host-to-device copy from exactly pinned memory; elsewhere none."""
    if not s.device.is_cuda:
        return None
    return _memory(s, lambda n, reps: h2d_bandwidth(n, s.device, reps))


def serialize(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """torch.save into memory, best of 3, before and after the sweep only (on these machines it
    is several times the disk: a probe leaves it out)."""
    if s.probe:
        return None
    return Measured.best_of(serialize_bandwidth(min(s.nbytes, 256 << 20), s.tensor_bytes))


# How each kind of bench.measure.ceilings.KINDS is measured (tests/test_ceiling.py checks that
# every kind has its measurer): the function, given the session and what was measured before it
# with the same targets, returns the measurement or None (not here, not in a probe).
MEASURERS: dict[Kind, Callable[[Session, Mapping[Kind, Measured]], Measured | None]] = {
    DIRECT_WRITE: direct_write,
    BUFFERED_WRITE: buffered_write,
    BUFFERED_WRITE_1: buffered_write_1,
    DIRECT_READ: direct_read,
    BUFFERED_READ: buffered_read,
    D2H: d2h,
    H2D: h2d,
    COPY: copy,
    SERIALIZE: serialize,
}
# The storage kinds searched before the sweep and their default grids, (writers per target,
# depth): the config's `ceilings.direct_search` and `ceilings.buffered_jobs` replace them.
GRIDS: dict[Kind, list[tuple[int, int]]] = {
    DIRECT_WRITE: DIRECT_SEARCH,
    BUFFERED_WRITE: BUFFERED_SEARCH,
    DIRECT_READ: DIRECT_SEARCH,
    BUFFERED_READ: BUFFERED_SEARCH,
}
# A read kind searches the grid given for its write kind where none is given for itself.
SEARCHED_AS = {DIRECT_READ: DIRECT_WRITE, BUFFERED_READ: BUFFERED_WRITE}


def _grid(kind: Kind, grids: Mapping[Kind, Sequence[Sequence[int]]]) -> Sequence[Sequence[int]]:
    """The (writers, depth) configurations searched for `kind`: given, else given for the write
    kind it searches as, else the default."""
    as_ = SEARCHED_AS.get(kind)
    return grids.get(kind) or (grids.get(as_) if as_ else None) or GRIDS[kind]


def _measure_kinds(s: Session, storage: bool) -> dict[Kind, Measured]:
    """Every kind of the storage (or host) ones, in KINDS order, each given those before it."""
    got: dict[Kind, Measured] = {}
    for kind in ceilings.KINDS:
        if kind.storage == storage:
            m = MEASURERS[kind](s, got)
            if m is not None:
                got[kind] = m
    return got


def storage_runs(
    ssd_counts: list[int],
    grids: Mapping[Kind, Sequence[Sequence[int]]],
    repetitions: int,
    searched: bool = True,
    reads: bool = True,
) -> int:
    """How many storage runs `measure` makes: per SSD count, for each searched kind (the reads
    only if `reads`) the search (when its grid, `grids` or the default, has more than one
    configuration and `searched`) and the repetitions of the chosen configuration."""
    n = 0
    for kind in GRIDS:
        if kind in READS and not reads:
            continue
        grid = len(_grid(kind, grids))
        n += (grid if searched and grid > 1 else 0) + repetitions
    return n * len(set(ssd_counts))


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
    configs: Mapping[int, Mapping[Kind, Writers]] | None = None,
    grids: Mapping[Kind, Sequence[Sequence[int]]] | None = None,
    max_bytes: int = MAX_BYTES,
    max_seconds: float | None = MAX_SECONDS,
    progress: Any = None,
    reads: bool = True,
) -> Ceilings:
    """All ceilings for a run: every kind of KINDS, the storage ones per SSD count. `drop` (if
    given) is called before each storage run to empty the page cache. `configs` (an earlier
    measurement's `Ceilings.chosen()`) skips the search; `grids` ((writers, depth) per searched
    kind) replace the default ones (GRIDS). Each storage run writes the checkpoint's bytes, at
    least `min_bytes` and at most `max_bytes`, and stops issuing writes after `max_seconds`;
    `progress(label)` is called after each (see `storage_runs` for how many there are)."""
    version = fio_version() if use_fio else None
    base = Session(
        fio_write if version else builtin_write,
        device,
        targets,
        0,
        block,
        checkpoint_bytes,
        drop=drop,
        repetitions=repetitions,
        max_seconds=max_seconds,
        copy_threads=copy_threads,
        tensor_bytes=tensor_bytes,
        grids={kind: [Writers(*c) for c in _grid(kind, grids or {})] for kind in GRIDS},
        progress=progress,
        read=fio_read if version else builtin_read,
        reads=reads,
    )
    total = probe_bytes(checkpoint_bytes, min_bytes, max_bytes)
    counts = {}
    for n in sorted(set(ssd_counts)):
        share = max(block, -(-total // n) // block * block)
        s = dataclasses.replace(
            base,
            targets=targets[:n],
            share=share,
            caps=caps[:n] if caps else None,
            chosen=(configs or {}).get(n, {}),
            made={},
        )
        try:
            counts[n] = Count(share, _measure_kinds(s, storage=True))
        finally:
            s.remove_read_files()
    method = Method(
        tool=version or "builtin",
        fio=fio_version(),
        fio_buffers=fio_env()[1] if version else None,
        block_bytes=block,
        checkpoint_bytes=checkpoint_bytes,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        max_seconds=max_seconds,
        repetitions=repetitions,
        copy_threads=copy_threads,
    )
    return Ceilings(counts, _measure_kinds(base, storage=False), method)


def probe(
    targets: list[str],
    nbytes: int,
    block: int,
    device: Device,
    configs: Mapping[Kind, Writers],
    use_fio: bool = True,
    drop: Any = None,
    caps: list[int | None] | None = None,
    copy_threads: int = 1,
    keep: dict[int, Any] | None = None,
    max_bytes: int = MAX_BYTES,
    max_seconds: float | None = MAX_SECONDS,
) -> Probe:
    """The ceilings again, once, inside a sweep: the configurations chosen before the sweep
    (`configs`, for these targets), plus the page-cache path with a single writer (what
    torch.save and safetensors are) and the copy ceiling (median of 3, of at most 1 GiB,
    buffers reused through `keep`); `nbytes` in all, as the checkpoint. The model predicts each
    workload's rows from the probes around it, so that a disk that drifts 2x within the hour
    drifts in the model too. One run of O_DIRECT (write, then read), the best of PROBE_RUNS of
    each page-cache write and read (every run kept). (Serialisation is left to the ceilings before and after: on these
    machines it is several times the disk.) The storage runs are bounded as `measure`'s are
    (`max_bytes`, `max_seconds`)."""
    fio = use_fio and fio_version()
    share = max(block, -(-min(nbytes, max_bytes) // len(targets)) // block * block)
    s = Session(
        fio_write if fio else builtin_write,
        device,
        targets,
        share,
        block,
        nbytes,
        caps=caps,
        drop=drop,
        max_seconds=max_seconds,
        copy_threads=copy_threads,
        chosen=configs,
        probe=True,
        keep=keep,
        read=fio_read if fio else builtin_read,
    )
    # At most PROBE_COPY_BYTES of copy: its buffers stay allocated through the sweep.
    try:
        kinds = {**_measure_kinds(s, storage=True), **_measure_kinds(s, storage=False)}
    finally:
        s.remove_read_files()
    return Probe(len(targets), kinds, share)
