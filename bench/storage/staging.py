"""Reusable host staging buffers for the CPU-centric paths.

Page-aligned private anonymous memory, pre-faulted when allocated (a copy into fresh memory runs
at ~0.5 GB/s on the reference machine, into a warm buffer at ~12 GB/s); on CUDA it is also
page-locked with cudaHostRegister, so device-to-host copies DMA straight into it. Not torch's
`pin_memory=True`: its caching host allocator rounds every request up to a power of two and keeps
freed blocks pinned (torch 2.11 and 2.13, CachingHostAllocator.h), so a 1 GiB + 4 KiB buffer
would pin 2 GiB and `pinned_bytes` would understate what is held. Registering our own mapping
pins exactly the bytes used, and unregistering it releases them. The region starts on a
4096-byte boundary, as O_DIRECT needs.

A buffer is allocated once per engine and reused; it grows (is reallocated) only when a larger
state arrives, and `ensure()` says whether it had to.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bench.common.devices import Device
from bench.storage import odirect


def cudart() -> Any:
    """torch's CUDA runtime binding (tests put a fake in its place)."""
    return torch.cuda.cudart()


class PinnedBuffer(odirect.HostBuffer):
    """A pre-faulted, page-aligned host buffer of exactly `nbytes` (rounded up to 4096),
    page-locked with cudaHostRegister until `close()`."""

    def __init__(self, nbytes: int) -> None:
        super().__init__(nbytes, prefault=True)
        rt = cudart()
        err = int(rt.cudaHostRegister(self.address, self.nbytes, 0))
        if err:
            super().close()
            raise OSError(f"cudaHostRegister of {self.nbytes} bytes failed (cudaError {err})")
        self._registered = self.address

    def close(self) -> None:
        if self._registered:
            cudart().cudaHostUnregister(self._registered)
            self._registered = 0
        super().close()


class Staging:
    """A reusable, aligned host buffer sized for the largest state seen so far."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.capacity = 0
        self._host: odirect.HostBuffer | None = None
        self.tensor = torch.empty(0, dtype=torch.uint8)  # the aligned usable region
        self.array = np.empty(0, dtype=np.uint8)

    @property
    def pinned_bytes(self) -> int:
        """Bytes of host memory held for staging (page-locked on CUDA), exactly."""
        return self._host.nbytes if self._host is not None else 0

    def describe(self) -> dict[str, Any]:
        """What a CUDA run should check about the staging: whether torch sees it as pinned (its
        device-to-host copies are then DMAs that need no bounce), and the bytes torch's own
        caching host allocator holds besides it (its `host_memory_stats`)."""
        out: dict[str, Any] = {"staging_is_pinned": bool(self.tensor.is_pinned())}
        try:
            stats = torch.cuda.host_memory_stats()
            out["torch_host_allocator"] = {
                k: int(v) for k, v in stats.items() if "bytes" in k and "current" in k
            }
        except Exception:  # an older torch without host statistics
            pass
        return out

    def ensure(self, nbytes: int) -> bool:
        """Make room for `nbytes` (rounded up to the alignment); True if it had to grow."""
        need = odirect.align_up(max(nbytes, 1))
        if need <= self.capacity:
            return False
        self.release()
        if self.device.is_cuda:
            self._host = PinnedBuffer(need)
        else:
            self._host = odirect.HostBuffer(need, prefault=True)
        self.tensor = torch.from_numpy(self._host.array)
        self.array = self._host.array
        self.capacity = need
        return True

    def release(self) -> None:
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self.array = np.empty(0, dtype=np.uint8)
        if self._host is not None:
            self._host.close()
            self._host = None
        self.capacity = 0


COPY_PIECE = 8 << 20  # bytes per snapshot copy task


def copy_tasks(pairs: list[tuple[np.ndarray, np.ndarray]], piece: int) -> list[list[tuple]]:
    """Group (dst, src) byte-array pairs into tasks of about `piece` bytes each: a large pair is
    split into pieces, small ones are batched, and the order of the bytes is kept."""
    tasks: list[list[tuple]] = []
    cur: list[tuple] = []
    cur_bytes = 0
    for dst, src in pairs:
        n = src.nbytes
        for lo in range(0, n, piece):
            hi = min(n, lo + piece)
            cur.append((dst[lo:hi], src[lo:hi]))
            cur_bytes += hi - lo
            if cur_bytes >= piece:
                tasks.append(cur)
                cur, cur_bytes = [], 0
    if cur:
        tasks.append(cur)
    return tasks


def run_copies(task: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in task:
        np.copyto(dst, src)
