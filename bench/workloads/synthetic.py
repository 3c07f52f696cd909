"""Synthetic states: `total_bytes` made of tensors of `tensor_bytes` (the last one smaller when
the total is not a multiple), random content."""

from __future__ import annotations

import math

import numpy as np
import torch

from bench.common.errors import UserError
from bench.storage.odirect import HostBuffer, align_up

PIECE = 64 << 20  # bytes generated on the host at a time for a device tensor


def _random_into(arr: np.ndarray, rng: np.random.Generator) -> None:
    """Uniformly random bytes (SFC64) into a flat uint8 array: no constant byte, nothing that
    compresses or dedups."""
    n8 = arr.size // 8 * 8
    if n8:
        arr[:n8].view(np.uint64)[:] = rng.bit_generator.random_raw(n8 // 8)
    if arr.size > n8:
        arr[n8:] = np.frombuffer(rng.bytes(arr.size - n8), dtype=np.uint8)


def fill_random(t: torch.Tensor, rng: np.random.Generator, piece: int = PIECE) -> torch.Tensor:
    """Overwrite a contiguous tensor's bytes with uniformly random bytes, in place; returns it.

    The same generator on the host and on a GPU, so host-emulated and CUDA runs write the same
    bytes for the same seed: a host tensor is filled directly (SFC64 runs at several GB/s), a
    device tensor in `piece`-sized host pieces copied over.
    """
    if t.numel() == 0:
        return t
    raw = t.view(-1).view(torch.uint8)
    if t.device.type == "cpu" and piece >= raw.numel():
        _random_into(raw.numpy(), rng)
        return t
    host = np.empty(min(piece, raw.numel()), dtype=np.uint8)
    for lo in range(0, raw.numel(), piece):
        hi = min(raw.numel(), lo + piece)
        _random_into(host[: hi - lo], rng)
        raw[lo:hi].copy_(torch.from_numpy(host[: hi - lo]))
    return t


class DeviceMemory:
    """Where a state's tensors are allocated: `torch.empty` on a GPU; on the host (host-emulated)
    page-aligned pieces of large anonymous mappings on transparent huge pages, carved out as
    CUDA's caching allocator carves device memory out of large segments.

    GPU memory is not paged 4 KiB at a time, and the gds emulation writes O_DIRECT straight from
    these tensors: from torch's ordinary 4 KiB-page memory the kernel pins 512 times more pages
    per write, which made emulated gds about twice as slow as from huge pages (bench/PERF.md).
    Every tensor keeps a storage of its own (no engine sees tensors sharing memory); a mapping
    is freed when the last tensor carved from it goes.
    """

    SEGMENT = 64 << 20

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._view: memoryview | None = None
        self._used = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if self.device.type != "cpu" or n == 0:
            return torch.empty(shape, dtype=dtype, device=self.device)
        if self._view is None or self._used + n > len(self._view):
            buf = HostBuffer(max(self.SEGMENT, n), prefault=False)
            self._view, self._used = memoryview(buf.mapping), 0
        t = torch.frombuffer(self._view[self._used : self._used + n], dtype=dtype)
        self._used += align_up(n)
        return t.view(shape)


def synthetic_state(
    total_bytes: int,
    tensor_bytes: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A flat dict `{"t00000": tensor, ...}` of 1-D tensors adding up to `total_bytes`."""
    item = torch.empty(0, dtype=dtype).element_size()
    if tensor_bytes > total_bytes:
        raise UserError(f"tensor size {tensor_bytes} is larger than the total {total_bytes}")
    if total_bytes % item or tensor_bytes % item:
        raise UserError(
            f"sizes must be multiples of the {dtype} element size ({item} B): "
            f"total {total_bytes}, tensor {tensor_bytes}"
        )
    rng = np.random.Generator(np.random.SFC64(seed))
    state: dict[str, torch.Tensor] = {}
    n = (total_bytes + tensor_bytes - 1) // tensor_bytes
    width = max(5, len(str(n)))
    left = total_bytes
    memory = DeviceMemory(device)
    for i in range(n):
        size = min(tensor_bytes, left)
        t = memory.empty((size // item,), dtype)
        state[f"t{i:0{width}d}"] = fill_random(t, rng)
        left -= size
    return state
