"""What the ceiling runs move: incompressible random bytes (never a constant or zero page, which a
device or a filesystem could skip), and the files a storage run writes and reads, preallocated
as the engines preallocate theirs and removed by whoever made them."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Sequence

import numpy as np

from bench.storage import odirect


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


def make_files(targets: Sequence[str], share: int) -> list[str]:
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
        remove_files(made)
        raise
    return paths


def remove_files(paths: Sequence[str]) -> None:
    """Remove `paths`, those already gone included."""
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def make_read_files(targets: Sequence[str], share: int, block: int) -> list[str]:
    """What a read ceiling reads: a file per target of `share` bytes, preallocated as the
    engines' files are, each `block` of it different random bytes, written with O_DIRECT and
    synced (untimed; no page of it is left in the page cache)."""
    files = make_files(targets, share)
    with contextlib.ExitStack() as undo:
        undo.push(lambda *exc: remove_files(files) if exc[0] is not None else None)
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
