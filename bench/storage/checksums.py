"""Checksums of tensor bytes: xxh3-64 on the host, and `wsum64`, computed by torch kernels where
the bytes are (on the GPU for device memory); and checking a tensor's bytes against the one its
manifest entry records."""

from __future__ import annotations

from typing import Any

import torch
import xxhash


def checksum(view: Any) -> str:
    """xxh3-64 of a bytes-like object, as 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(view)


WSUM_PIECE = 1 << 24  # words per step of device_checksum (bounds its temporary memory)


def device_sums(mem: torch.Tensor) -> torch.Tensor:
    """The two sums of `wsum64` (see `device_checksum`) of a flat uint8 tensor, as a 2-element
    int64 tensor where the bytes are: queued as kernels on the current stream, nothing read back
    to the host, so that a caller can hash many tensors and read every digest back at once."""
    nbytes = mem.numel()
    if mem.data_ptr() % 4 or mem.storage_offset() % 4:
        # A 32-bit view needs 4-byte alignment, of the address and of the offset in its
        # storage (an empty slice at an odd offset has an aligned address, or none at all).
        mem = mem.clone()
    full = nbytes // 4 * 4
    if nbytes > full:
        tail = torch.zeros(4, dtype=torch.uint8, device=mem.device)
        tail[: nbytes - full] = mem[full:]
        words = torch.cat([mem[:full], tail]).view(torch.int32)
    else:
        words = mem[:full].view(torch.int32)
    sums = torch.zeros(2, dtype=torch.int64, device=mem.device)
    for lo in range(0, words.numel(), WSUM_PIECE):
        w = words[lo : lo + WSUM_PIECE].to(torch.int64) & 0xFFFFFFFF
        i = torch.arange(lo + 1, lo + 1 + w.numel(), dtype=torch.int64, device=mem.device)
        sums[0] += w.sum()
        sums[1] += (w * i).sum()  # int64 arithmetic wraps modulo 2^64 on CPU and GPU alike
    return sums


def wsum64_digest(s1: int, s2: int, nbytes: int) -> str:
    """The `wsum64` digest of two sums (as read back from `device_sums`) and a byte count."""
    mask = (1 << 64) - 1
    return f"{s1 & mask:016x}{s2 & mask:016x}-{nbytes:x}"


def device_checksum(mem: torch.Tensor) -> str:
    """A checksum of a flat uint8 tensor computed by torch kernels where the bytes are (on the
    GPU for a CUDA tensor), so that checking device memory needs no copy to the host.

    Algorithm `wsum64`: the bytes as little-endian 32-bit words w_1..w_n (the last one
    zero-padded), S1 = sum of w_i and S2 = sum of i * w_i, both modulo 2^64, and the byte count.
    Like Fletcher's checksum it catches any change of one word and any swap of two different
    words; it is not a cryptographic hash. Modular sums do not depend on the order of the
    reduction, so CPU and GPU give the same digest.
    """
    s1, s2 = device_sums(mem).tolist()
    return wsum64_digest(s1, s2, mem.numel())


def entry_matches(e: Any, mem: Any) -> bool:
    """Whether the bytes of tensor `e` (a flat uint8 numpy array or tensor) match its
    checksum; True when it has none."""
    if e.xxh3 is not None:
        host = mem.numpy() if isinstance(mem, torch.Tensor) else mem
        return checksum(host) == e.xxh3
    if e.wsum64 is not None:
        t = torch.from_numpy(mem) if not isinstance(mem, torch.Tensor) else mem
        return device_checksum(t) == e.wsum64
    return True
