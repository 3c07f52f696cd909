"""Reusable host staging buffers for the CPU-centric paths.

On CUDA: torch pinned (page-locked) memory, so device-to-host copies run at link speed. On
host-emulated: page-aligned private anonymous memory, pre-faulted when allocated (a copy into
fresh memory runs at ~0.5 GB/s on the reference machine, into a warm buffer at ~12 GB/s).
Either way the usable region starts on a 4096-byte boundary, as O_DIRECT needs.

A buffer is allocated once per engine and reused; it grows (is reallocated) only when a larger
state arrives, and `ensure()` says whether it had to.
"""

from __future__ import annotations

import numpy as np
import torch

from bench import odirect
from bench.devices import Device


class Staging:
    """A reusable, aligned host buffer sized for the largest state seen so far."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.capacity = 0
        self._host: odirect.HostBuffer | None = None
        self._pinned: torch.Tensor | None = None
        self.tensor = torch.empty(0, dtype=torch.uint8)  # the aligned usable region
        self.array = np.empty(0, dtype=np.uint8)

    @property
    def pinned_bytes(self) -> int:
        """Bytes of host memory held for staging (page-locked on CUDA)."""
        if self._pinned is not None:
            return self._pinned.numel()
        return self._host.nbytes if self._host is not None else 0

    def ensure(self, nbytes: int) -> bool:
        """Make room for `nbytes` (rounded up to the alignment); True if it had to grow."""
        need = odirect.align_up(max(nbytes, 1))
        if need <= self.capacity:
            return False
        self.release()
        if self.device.is_cuda:
            raw = torch.empty(need + odirect.ALIGN, dtype=torch.uint8, pin_memory=True)
            skip = (-raw.data_ptr()) % odirect.ALIGN
            raw[::4096].zero_()
            self._pinned = raw
            self.tensor = raw[skip : skip + need]
        else:
            self._host = odirect.HostBuffer(need, prefault=True)
            self.tensor = torch.from_numpy(self._host.array)
        self.array = self.tensor.numpy()
        self.capacity = need
        return True

    def release(self) -> None:
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self.array = np.empty(0, dtype=np.uint8)
        self._pinned = None
        if self._host is not None:
            self._host.close()
            self._host = None
        self.capacity = 0
