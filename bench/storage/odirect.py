"""Aligned I/O: O_DIRECT probing, aligned host buffers, and chunked positional writes.

O_DIRECT needs the buffer address, the file offset and the length to be multiples of the
device's logical block size; ckptbench uses 4096 bytes, which satisfies every common device.
"""

from __future__ import annotations

import errno
import mmap
import os
import uuid

import numpy as np

ALIGN = 4096
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 and most arm64 kernels
# One pwrite never moves more than this; the kernel splits large requests anyway, and a bound
# keeps a single call from holding a thread for seconds.
MAX_IO = 64 << 20


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def align_down(n: int, a: int = ALIGN) -> int:
    return n // a * a


def probe(directory: str) -> str | None:
    """None if `directory` accepts O_DIRECT writes, else the reason it does not."""
    path = os.path.join(directory, f".ckptbench-odirect-probe-{uuid.uuid4().hex}")
    buf = mmap.mmap(-1, ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return f"the filesystem of {directory} refuses O_DIRECT"
        return f"cannot create a file in {directory}: {e.strerror}"
    try:
        os.pwrite(fd, buf, 0)
    except OSError as e:
        return f"O_DIRECT write failed in {directory}: {e.strerror}"
    finally:
        os.close(fd)
        buf.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return None


class HostBuffer:
    """Page-aligned private anonymous memory, pre-faulted so first use is not a page-fault storm.

    Private (not shared) anonymous memory: a shared mapping would be counted as page cache
    (`Cached` in /proc/meminfo) and spoil the page-cache figures.
    """

    def __init__(self, nbytes: int, prefault: bool = True) -> None:
        self.nbytes = max(align_up(nbytes), ALIGN)
        self._map = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if self.nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
            # Transparent huge pages where the system allows them (`madvise` or `always` in
            # /sys/kernel/mm/transparent_hugepage/enabled): an O_DIRECT write pins 512 times
            # fewer pages, and a write beside the snapshot copy costs the copy less
            # (bench/PERF.md). A refusal (THP `never`, old kernel) leaves 4 KiB pages.
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        if prefault:
            # Writing one byte per page faults every page in now, outside any timed region.
            self.array[:: mmap.PAGESIZE] = 0

    @property
    def mapping(self) -> mmap.mmap:
        """The mapping itself (for views that must outlive this object, e.g. torch.frombuffer)."""
        return self._map

    @property
    def address(self) -> int:
        return self.array.ctypes.data

    def close(self) -> None:
        self.array = np.empty(0, dtype=np.uint8)
        try:
            self._map.close()
        except BufferError:
            # A view (a tensor made from this buffer) is still alive; the mapping is freed
            # when it goes.
            pass


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of `view` at `offset`, in bounded calls, retrying short writes."""
    done = 0
    total = len(view)
    while done < total:
        n = os.pwrite(fd, view[done : done + min(MAX_IO, total - done)], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {n} bytes")
        done += n


def pread_into(fd: int, view: memoryview, offset: int) -> None:
    """Fill all of `view` from `offset`; a short file is an error."""
    done = 0
    total = len(view)
    while done < total:
        n = os.preadv(fd, [view[done : done + min(MAX_IO, total - done)]], offset + done)
        if n == 0:
            raise EOFError(f"file ends at {offset + done}, {total - done} bytes short")
        done += n


def preallocate(fd: int, n: int) -> None:
    """Reserve `n` bytes for the file; a filesystem without fallocate is simply skipped, and a
    full disk fails here, before any data is written."""
    try:
        os.posix_fallocate(fd, 0, n)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return
        raise
