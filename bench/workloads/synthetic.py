"""Synthetic states: `total_bytes` made of tensors of `tensor_bytes` (the last one smaller when
the total is not a multiple), random content."""

from __future__ import annotations

import numpy as np
import torch

from bench.errors import UserError


def fill_random(t: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Overwrite a tensor's bytes with random bits, in place; returns it.

    Host tensors are filled through a float64 view (SFC64 gives ~3 GB/s here, where
    torch.randint manages ~0.2 GB/s); device tensors with torch's own generator.
    """
    if t.numel() == 0:
        return t
    if t.device.type != "cpu":
        flat = t.view(-1).view(torch.uint8)
        flat.random_(1, 256)
        return t
    raw = t.view(-1).view(torch.uint8).numpy()
    n8 = raw.size // 8 * 8
    if n8:
        rng.random(out=raw[:n8].view(np.float64))
    if raw.size > n8:
        raw[n8:] = np.frombuffer(rng.bytes(raw.size - n8), dtype=np.uint8) | 1
    return t


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
    for i in range(n):
        size = min(tensor_bytes, left)
        t = torch.empty(size // item, dtype=dtype, device=device)
        state[f"t{i:0{width}d}"] = fill_random(t, rng)
        left -= size
    return state
