"""Striping: which bytes of memory go to which target file at which offset, and reading back.

Two layouts, one on-disk format (a data file per target; each tensor a list of extents
`[target, file_offset, length]`):
- `packed`: the CPU paths pack every tensor into one aligned staging buffer; the buffer is cut
  into fixed-size chunks dealt round-robin to the targets, so each target's file is dense and
  every write is aligned for O_DIRECT (the last one padded, the file then truncated to its length).
- `direct`: the GDS path writes from the tensors' own memory. Each tensor is cut at absolute
  addresses that are multiples of the chunk size; each piece is placed in its target's file at an
  offset congruent to its address modulo the alignment, in blocks of its own, so that the aligned
  middle is written in place and only the head and tail blocks go through a small bounce buffer.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.common.errors import ChecksumError, UserError
from bench.storage import odirect
from bench.storage.checksums import entry_matches
from bench.storage.manifest import Manifest, TensorEntry, checkpoint_dir, data_file_name
from bench.storage.tree import dtype_from_name

TENSOR_ALIGN = 64  # offset of each tensor inside a staging buffer: enough for any dtype


@dataclass
class Piece:
    """One write: `length` bytes of `mem` starting at `start` go to `target` at `file_offset`."""

    target: int
    file_offset: int
    mem: Any  # uint8, 1-D: a numpy array (host) or a torch tensor (device memory)
    start: int
    length: int

    @property
    def address(self) -> int:
        return _address(self.mem) + self.start


def _address(mem: Any) -> int:
    return mem.data_ptr() if isinstance(mem, torch.Tensor) else mem.ctypes.data


def pack_offsets(entries: list[TensorEntry]) -> tuple[list[int], int]:
    """Offsets of each tensor in a staging buffer (64-byte aligned) and the total used."""
    offsets = []
    pos = 0
    for e in entries:
        pos = (pos + TENSOR_ALIGN - 1) // TENSOR_ALIGN * TENSOR_ALIGN
        offsets.append(pos)
        pos += e.nbytes
    return offsets, pos


def packed(
    staging: np.ndarray,
    used: int,
    entries: list[TensorEntry],
    offsets: list[int],
    n_targets: int,
    chunk: int,
) -> tuple[list[Piece], dict[int, int]]:
    """Pieces for a packed staging buffer, and each target's file length; fills entry extents."""
    pieces = []
    n_chunks = (used + chunk - 1) // chunk
    for j in range(n_chunks):
        start = j * chunk
        length = min(chunk, used - start)
        pieces.append(Piece(j % n_targets, (j // n_targets) * chunk, staging, start, length))
    file_bytes: dict[int, int] = {}
    for p in pieces:
        file_bytes[p.target] = max(file_bytes.get(p.target, 0), p.file_offset + p.length)
    for e, off in zip(entries, offsets, strict=True):
        e.extents = []
        pos, end = off, off + e.nbytes
        while pos < end:
            j = pos // chunk
            take = min(end, (j + 1) * chunk) - pos
            e.extents.append([j % n_targets, (j // n_targets) * chunk + pos - j * chunk, take])
            pos += take
    return pieces, file_bytes


def direct(
    mems: list[Any],
    entries: list[TensorEntry],
    n_targets: int,
    chunk: int,
    start: dict[int, int] | None = None,
) -> tuple[list[Piece], dict[int, int]]:
    """Pieces that write each tensor from its own memory; fills entry extents. `start`: where
    each target's file is free from (aligned; the files begin at 0 without it)."""
    pieces = []
    cursor = [odirect.align_up((start or {}).get(t, 0)) for t in range(n_targets)]
    turn = 0
    a = odirect.ALIGN
    for mem, e in zip(mems, entries, strict=True):
        e.extents = []
        base = _address(mem)
        pos = 0
        while pos < e.nbytes:
            addr = base + pos
            take = min(e.nbytes - pos, (addr // chunk + 1) * chunk - addr)
            t = turn % n_targets
            turn += 1
            file_offset = cursor[t] + addr % a
            cursor[t] = odirect.align_up(file_offset + take)
            pieces.append(Piece(t, file_offset, mem, pos, take))
            e.extents.append([t, file_offset, take])
            pos += take
    file_bytes = {t: cursor[t] for t in range(n_targets) if cursor[t]}
    return pieces, file_bytes


def write_piece(fd: int, piece: Piece, o_direct: bool) -> None:
    """Write one piece; with O_DIRECT the aligned middle goes straight from memory."""
    view = memoryview(piece.mem)[piece.start : piece.start + piece.length]
    if not o_direct:
        odirect.pwrite_all(fd, view, piece.file_offset)
        return
    a = odirect.ALIGN
    misalign = piece.address % a
    if misalign != piece.file_offset % a:
        raise AssertionError("layout placed a piece at a file offset not congruent to its address")
    head = min((a - misalign) % a, piece.length)
    mid = odirect.align_down(piece.length - head)
    tail = piece.length - head - mid
    if head:
        _bounce(fd, view[:head], piece.file_offset - misalign, misalign)
    if mid:
        odirect.pwrite_all(fd, view[head : head + mid], piece.file_offset + head)
    if tail:
        _bounce(fd, view[head + mid :], piece.file_offset + head + mid, 0)


def _bounce(fd: int, data: memoryview, block_offset: int, at: int) -> None:
    """Write `data` placed at `at` in zeroed aligned blocks starting at `block_offset`."""
    buf = odirect.HostBuffer(at + len(data), prefault=False)
    try:
        buf.array[at : at + len(data)] = np.frombuffer(data, dtype=np.uint8)
        odirect.pwrite_all(fd, buf.array.data, block_offset)
    finally:
        buf.close()


def data_file(targets: list[str], name: str, t: int, save_id: str) -> str:
    """Where one save puts its bytes for target `t`."""
    return os.path.join(checkpoint_dir(targets[t], name), data_file_name(t, save_id))


def _path(targets: list[str], m: Manifest, t: int) -> str:
    return os.path.join(checkpoint_dir(targets[t], m.name), m.files[t]["file"])


def read_tensors(
    targets: list[str],
    manifest: Manifest,
    alloc: Callable[[int], torch.Tensor] | None = None,
    threads: int = 4,
    only: list[int] | None = None,
    check: bool = True,
    into: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Read every tensor of a checkpoint (or those at indexes `only`, in that order) into host
    memory and check its checksum. `into`: flat uint8 host tensors, one per tensor read, to read
    into instead of new memory.

    Raises ChecksumError naming the tensor and file on a mismatch, UserError on missing or
    short files.
    """
    fds: dict[int, int] = {}
    chosen = list(range(len(manifest.tensors))) if only is None else list(only)
    try:
        check_files(targets, manifest)
        for t in manifest.files:
            fds[t] = os.open(_path(targets, manifest, t), os.O_RDONLY)
        if into is not None:
            out = dict(zip(chosen, into, strict=True))
        else:
            out = {i: (alloc or _alloc)(manifest.tensors[i].nbytes) for i in chosen}

        def read_one(i: int) -> None:
            e = manifest.tensors[i]
            arr = out[i].numpy()
            pos = 0
            for t, off, length in e.extents:
                odirect.pread_into(fds[t], arr.data[pos : pos + length], off)
                pos += length
            if check and manifest.checksums:
                check_entry(targets, manifest, e, arr)

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(read_one, chosen))
        return [typed(out[i], manifest.tensors[i]) for i in chosen]
    finally:
        for fd in fds.values():
            os.close(fd)


def check_files(targets: list[str], manifest: Manifest) -> None:
    """Every data file of the checkpoint exists and is long enough; else a UserError."""
    for t, info in manifest.files.items():
        path = _path(targets, manifest, t)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise UserError(f"checkpoint {manifest.name!r}: data file {path} is missing") from None
        if size < info["bytes"]:
            raise UserError(
                f"checkpoint {manifest.name!r}: data file {path} is truncated "
                f"({size} of {info['bytes']} bytes)"
            )


def check_entry(targets: list[str], manifest: Manifest, e: TensorEntry, mem: Any) -> None:
    """Raise ChecksumError naming the tensor and its files if `mem` (its bytes, flat uint8 numpy
    array or tensor) does not match its checksum."""
    if not entry_matches(e, mem):
        raise checksum_error(targets, manifest, e)


def checksum_error(targets: list[str], manifest: Manifest, e: TensorEntry) -> ChecksumError:
    """The error for tensor `e` whose bytes do not match its checksum, naming its files."""
    files = sorted({_path(targets, manifest, x[0]) for x in e.extents})
    return ChecksumError(
        f"checkpoint {manifest.name!r}: tensor state{e.path} does not match its "
        f"checksum (file {', '.join(files)})"
    )


def _alloc(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8)


def data_path(targets: list[str], m: Manifest, t: int) -> str:
    """The data file of a committed checkpoint on target `t`."""
    return _path(targets, m, t)


def typed(buf: torch.Tensor, e: TensorEntry) -> torch.Tensor:
    dtype = dtype_from_name(e.dtype)
    if e.nbytes == 0:
        return torch.empty(e.shape, dtype=dtype, device=buf.device)
    return buf.view(dtype).view(e.shape)


def files_of(targets: list[str], m: Manifest) -> list[str]:
    """The data files of a committed checkpoint."""
    return [_path(targets, m, t) for t in sorted(m.files)]
