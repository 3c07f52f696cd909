"""Write-bandwidth caps per target: emulated slower SSDs for scaling studies on one disk.

A target with `max_write_bw` gets a token bucket shared by all threads writing to it: a write of
n bytes may finish no earlier than n / rate after the previous one on that target, so N capped
targets on one fast disk behave like N slow SSDs until the disk's own limit.
"""

from __future__ import annotations

import threading
import time


class TokenBucket:
    """Paces writes to `rate` bytes per second (a burst of at most `burst` bytes ahead)."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = float(rate)
        self.burst_s = burst / self.rate
        self._next = time.perf_counter()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        """Block until `n` more bytes may be written."""
        with self._lock:
            now = time.perf_counter()
            # Idle time earns at most one burst of credit: the `- burst_s` below. (Starting
            # from `now - burst_s` here as well credited two bursts after an idle spell, twice
            # what a fresh bucket allows.)
            start = max(self._next, now)
            self._next = start + n / self.rate
            wait = self._next - self.burst_s - now
        if wait > 0:
            time.sleep(wait)
