"""The storage ceilings measured without fio: the runs of bench.measure.ceilings.fio made by a
pool of threads with pwrite (pread) from (into) one pre-faulted aligned buffer, `jobs x depth`
threads per target with O_DIRECT (the depth is the thread count), `jobs` when buffered. The
writes end with an fsync of every file; the reads evict each file's pages first; a capped
target's writes are paced by a token bucket per target, as the engines pace theirs."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from bench.measure.ceilings.data import make_files, random_bytes, remove_files
from bench.measure.timers import evict_files
from bench.storage import odirect, pacing


def builtin_write(
    targets: Sequence[str],
    file_bytes: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    caps: Sequence[int | None] | None = None,
    seconds: float | None = None,
) -> float:
    """The same measurement without fio: per target, `jobs x depth` threads (O_DIRECT) or
    `jobs` threads (buffered) issuing `block`-sized pwrites of random bytes from a pre-faulted
    aligned buffer into the preallocated file, then fsync of every file. Aggregate bytes/s over
    the wall time to durability; after `seconds` no more writes are issued."""
    n_blocks = max(1, file_bytes // block)
    with contextlib.ExitStack() as undo:
        files = make_files(targets, n_blocks * block)
        undo.callback(remove_files, files)
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
    """Reading `files` (`data.make_read_files`) without fio: per file, `jobs x depth` threads
    (O_DIRECT) or `jobs` threads (buffered) issuing `block`-sized preads into a pre-faulted
    aligned buffer, each file's pages evicted first. Aggregate bytes/s; after `seconds` no more reads are
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
    caps: Sequence[int | None] | None,
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
