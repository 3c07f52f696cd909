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


SEGMENT_WORDS = 1 << 22  # words summed at a time by `segment_sums` (bounds its temporaries)


def segment_sums(mem: torch.Tensor, starts: list[int], nbytes: list[int]) -> torch.Tensor:
    """The two sums of `wsum64` of many segments of one flat uint8 tensor at once, as a
    (segments, 2) int64 tensor where the bytes are: a few kernels for thousands of small
    tensors packed in one buffer, where `device_sums` launches several per tensor (gds's
    coalescing buffer, issue 32). Each start must be a multiple of 4 from a 4-byte aligned
    address; the segments in order and apart. The bytes of a segment's last, partial word
    past its end are masked off, as wsum64 pads with zeros.

    Word g of the buffer weighs g - s + 1 in a segment starting at word s, so over the words of
    a segment S2 = sum(g * w) - (s - 1) * S1: two running sums over the whole buffer give both
    sums of every segment (int64 arithmetic wraps modulo 2^64 on CPU and GPU alike)."""
    n = len(starts)
    out = torch.zeros((n, 2), dtype=torch.int64, device=mem.device)
    if n == 0:
        return out
    if mem.data_ptr() % 4 or any(s % 4 for s in starts):
        raise ValueError("segment_sums: segments must start on 4-byte boundaries")
    lo = 0
    while lo < n:
        # a run of segments spanning at most SEGMENT_WORDS words (a longer segment alone)
        base = starts[lo] // 4
        hi = lo + 1
        while hi < n and (starts[hi] + nbytes[hi] + 3) // 4 - base <= SEGMENT_WORDS:
            hi += 1
        end = (starts[hi - 1] + nbytes[hi - 1] + 3) // 4
        _run_sums(mem, starts[lo:hi], nbytes[lo:hi], base, end, out[lo:hi])
        lo = hi
    return out


def _run_sums(
    mem: torch.Tensor, starts: list[int], nbytes: list[int], base: int, end: int, out: torch.Tensor
) -> None:
    """`segment_sums` of segments that lie within words [base, end) of `mem`."""
    dev = mem.device
    span = mem[base * 4 : min(end * 4, mem.numel())]
    short = (end - base) * 4 - span.numel()
    if short:  # the buffer ends inside the last word: zero-extend it
        span = torch.cat([span, torch.zeros(short, dtype=torch.uint8, device=dev)])
    w = span.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    # the partial last words: keep only their segment's bytes (little-endian: the low ones)
    last = [((s + b) // 4 - base, (s + b) % 4) for s, b in zip(starts, nbytes, strict=True)]
    partial = [(i, k) for i, k in last if k]
    if partial:
        at = torch.tensor([i for i, _ in partial], dtype=torch.int64, device=dev)
        keep = torch.tensor([(1 << (8 * k)) - 1 for _, k in partial], dtype=torch.int64, device=dev)
        w[at] = w[at] & keep
    c1 = torch.zeros(w.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(w, 0, out=c1[1:])
    g = torch.arange(base, base + w.numel(), dtype=torch.int64, device=dev)
    w.mul_(g)
    c2 = torch.zeros(w.numel() + 1, dtype=torch.int64, device=dev)
    torch.cumsum(w, 0, out=c2[1:])
    a = torch.tensor([s // 4 - base for s in starts], dtype=torch.int64, device=dev)
    ends = [(s + nb + 3) // 4 - base for s, nb in zip(starts, nbytes, strict=True)]
    b = torch.tensor(ends, dtype=torch.int64, device=dev)
    s1 = c1[b] - c1[a]
    s2 = (c2[b] - c2[a]) - (a + base - 1) * s1
    out[:, 0] = s1
    out[:, 1] = s2
