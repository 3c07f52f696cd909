"""Timers and samplers around one checkpoint: page-cache growth, RSS peak, CPU time.

Page-cache growth is read from `Cached` in /proc/meminfo, which already counts dirty and
writeback pages (they are not added again). Samples are taken every `interval_s` by a
background thread from the call of `save()` until the bytes are durable.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass

import psutil


def cached_bytes() -> int:
    """`Cached` from /proc/meminfo, in bytes."""
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"Cached:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no Cached line")


@dataclass
class Sample:
    page_cache_peak_bytes: int = 0  # peak growth over the value at start
    rss_peak_bytes: int = 0  # peak resident set of this process
    cpu_user_s: float = 0.0
    cpu_sys_s: float = 0.0


class Sampler:
    """Samples page cache and RSS in the background between `start()` and `stop()`."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self._proc = psutil.Process(os.getpid())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.result = Sample()
        self._own0 = self._own = (0.0, 0.0)

    def _poll(self) -> None:
        c = cached_bytes() - self._cache0
        r = self._proc.memory_info().rss
        if c > self.result.page_cache_peak_bytes:
            self.result.page_cache_peak_bytes = c
        if r > self.result.rss_peak_bytes:
            self.result.rss_peak_bytes = r

    def _run(self) -> None:
        self._own0 = self._own = _thread_cpu()
        while not self._stop.wait(self.interval_s):
            self._poll()
            self._own = _thread_cpu()  # one tuple, replaced whole: read from other threads

    def own_cpu(self) -> tuple[float, float]:
        """(user, sys) CPU-seconds this sampler's thread has used so far (as of its last
        sample): the measurement's own cost, which bench.measure.hostcost takes away."""
        own, own0 = self._own, self._own0
        return own[0] - own0[0], own[1] - own0[1]

    def start(self) -> Sampler:
        self._cache0 = cached_bytes()
        self._ru0 = resource.getrusage(resource.RUSAGE_SELF)
        self.result = Sample()
        self._poll()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Sample:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._poll()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.result.cpu_user_s = ru.ru_utime - self._ru0.ru_utime
        self.result.cpu_sys_s = ru.ru_stime - self._ru0.ru_stime
        return self.result


def _thread_cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_utime, ru.ru_stime


def now_ns() -> int:
    return time.perf_counter_ns()


def drop_page_cache() -> str | None:
    """Drop the whole page cache (needs root); None on success, else why it was not dropped.

    The page cache only (`1`), not the dentries and inodes as well (`3`): a training loop's
    checkpoint folders stay hot, and with them dropped the next save read its folders back
    from the disk inside its stall (0.5-1.5 ms here, of a 17 ms snapshot)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return None
    except OSError as e:
        return f"could not drop the page cache ({e.strerror}); run as root to drop it"


def evict_files(paths: list[str]) -> None:
    """Drop these files' pages from the page cache (no root needed; clean pages only)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: list[str]) -> int:
    """Bytes of these files that sit in the page cache now (mincore over a read-only mapping):
    what a restore would read from memory instead of the device. -1 where it cannot be told."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    total = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            if not size:
                continue
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return -1
            try:
                pages = -(-size // page)
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, size, vec) != 0:
                    return -1
                total += sum(b & 1 for b in vec) * page
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total
