"""Reading a packed, striped checkpoint back with O_DIRECT: one copy, from the disk into the
memory the tensors live in, and nothing left behind in the page cache.

The snapshot engines write one packed stream (bench.storage.layout: every tensor at a 64-byte
aligned offset, the stream cut into chunks, chunk j to target j % n at offset (j // n) x chunk).
`packing` recognises that layout in a manifest; `read_packed` reads it back:
- into new host memory: every chunk straight into one aligned host buffer laid out as the
  stream, each tensor a view at its packed offset (the buffer is freed when the last view goes);
- in place (`into`, a restart's destination): a chunk whose bytes all belong to one host
  tensor, a whole number of blocks that start on a block boundary of that tensor's memory, is
  read straight into it (one copy: the disk's DMA; `direct_chunks`, checked tensor by tensor,
  never assumed); the others as into device memory:
- into new device memory (CUDA), or the rest of a restore in place: chunk by chunk through a
  ring of aligned slots (the engine's staging, pinned on CUDA); the copy out of one slot
  (host-to-device on a side stream, or a memcpy into a host tensor) overlaps the reads of the
  next chunks, and a slot is read into again only once its copy is done.
Several reads are in flight across the targets (threads: os.preadv releases the GIL), one per
chunk. O_DIRECT needs aligned offsets, lengths and buffers: every chunk starts on a block
boundary of its file and of the buffer, and the last chunk of the stream, shorter, is read up to
its next block boundary (the read stops short at the end of the file). Checksums, when asked for,
are checked on the bytes read: xxh3 streamed over each tensor's spans as they arrive, wsum64
where the bytes land.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from bench.common.errors import UserError
from bench.storage import layout, odirect
from bench.storage.manifest import Manifest, TensorEntry


@dataclass(frozen=True)
class Packed:
    """A checkpoint in the packed layout: each tensor's offset in the stream, the stream's
    length, its chunk size and the number of targets the chunks are dealt to."""

    offsets: list[int]
    used: int
    chunk: int
    n_targets: int

    @property
    def chunks(self) -> int:
        return -(-self.used // self.chunk)

    def place(self, j: int) -> tuple[int, int, int, int]:
        """Chunk j: (target, file offset, stream offset, length)."""
        lo = j * self.chunk
        return (
            j % self.n_targets,
            (j // self.n_targets) * self.chunk,
            lo,
            min(self.chunk, self.used - lo),
        )

    def spans(self, entries: list[TensorEntry]) -> list[list[tuple[int, int, int]]]:
        """Per chunk, the (tensor, start, end) stream offsets of the tensor bytes in it."""
        out: list[list[tuple[int, int, int]]] = [[] for _ in range(self.chunks)]
        for i, (e, off) in enumerate(zip(entries, self.offsets, strict=True)):
            pos, end = off, off + e.nbytes
            while pos < end:
                j = pos // self.chunk
                stop = min(end, (j + 1) * self.chunk)
                out[j].append((i, pos, stop))
                pos = stop
        return out


def packing(m: Manifest) -> Packed | None:
    """The packed layout of `m`, if every tensor's extents are where that layout puts them
    (a checkpoint of another layout, gds's `direct`, gives None)."""
    chunk = m.extra.get("chunk_bytes")
    n = len(m.targets)
    if not isinstance(chunk, int) or chunk <= 0 or chunk % odirect.ALIGN or not n:
        return None
    offsets, used = layout.pack_offsets(m.tensors)
    for e, off in zip(m.tensors, offsets, strict=True):
        pos, end, k = off, off + e.nbytes, 0
        ext = e.extents
        while pos < end:
            j = pos // chunk
            take = min(end, (j + 1) * chunk) - pos
            want = (j % n, (j // n) * chunk + pos - j * chunk, take)
            if k >= len(ext) or tuple(ext[k]) != want:
                return None
            pos += take
            k += 1
        if k != len(ext):
            return None
    p = Packed(offsets, used, chunk, n)
    if any(p.place(j)[0] not in m.files for j in range(min(n, p.chunks))):
        return None
    return p


# -- device copies (a seam: tests/fake_kvikio.py puts fake device memory in its place) ----------


def on_device(t: torch.Tensor) -> bool:
    """Whether a tensor to restore into lives in device memory."""
    return t.device.type == "cuda"


class DeviceCopies:
    """The host-to-device copies of one restore, queued on a side stream: `copy` queues one
    (from pinned memory: a DMA), `record` marks the copies so far with an event whose
    `synchronize()` sleeps until they are done, `finish` waits for all of them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        # memory allocated on the current stream may still be in use by work queued there
        self.stream.wait_stream(torch.cuda.current_stream(device))

    def empty(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def record(self) -> Any:
        event = torch.cuda.Event(blocking=True)  # a waiting reader thread sleeps, not spins
        event.record(self.stream)
        return event

    def finish(self) -> None:
        self.stream.synchronize()
        torch.cuda.synchronize(self.device)


def device_copies(device: torch.device) -> DeviceCopies:
    return DeviceCopies(device)


# -- reading --------------------------------------------------------------------------------


def read_aligned(fd: int, dst: np.ndarray, offset: int, length: int, name: str, path: str) -> None:
    """`length` bytes of an O_DIRECT file from `offset` (aligned) into `dst` (aligned, at least
    `length` rounded up to a block): the read runs to the next block boundary, or stops short
    at the end of the file; a file that ends before `length` is a UserError."""
    view, want, done = dst.data, odirect.align_up(length), 0
    while done < want:
        n = os.preadv(fd, [view[done : done + min(odirect.MAX_IO, want - done)]], offset + done)
        if n <= 0:
            break
        done += n
        if n % odirect.ALIGN:  # the end of the file, inside a block
            break
    if done < length:
        raise UserError(
            f"checkpoint {name!r}: data file {path} ends at {offset + done} bytes "
            f"(expected {offset + length})"
        )


class _Files:
    """The checkpoint's data files, open with O_DIRECT; reads whole chunks into aligned memory."""

    def __init__(self, targets: list[str], m: Manifest, p: Packed) -> None:
        self.m, self.p = m, p
        self.paths = {t: layout.data_path(targets, m, t) for t in m.files}
        self.fds: dict[int, int] = {}
        try:
            for t, path in self.paths.items():
                self.fds[t] = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except BaseException:
            self.close()
            raise

    def read(self, j: int, dst: np.ndarray) -> None:
        """Chunk j into `dst` (aligned, at least its length rounded up to a block)."""
        t, offset, _, length = self.p.place(j)
        read_aligned(self.fds[t], dst, offset, length, self.m.name, self.paths[t])

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


class _Hashes:
    """xxh3 of each tensor's bytes, streamed span by span in stream order; checked at the end."""

    def __init__(self, targets: list[str], m: Manifest, on: bool) -> None:
        self.targets, self.m = targets, m
        self.h = {
            i: xxhash.xxh3_64() for i, e in enumerate(m.tensors) if on and e.xxh3 and e.nbytes
        }

    def update(self, i: int, data: np.ndarray) -> None:
        h = self.h.get(i)
        if h is not None:
            h.update(data.data)

    def check(self) -> None:
        for i, h in self.h.items():
            e = self.m.tensors[i]
            if h.hexdigest() != e.xxh3:
                raise layout.checksum_error(self.targets, self.m, e)


def read_packed(
    targets: list[str],
    m: Manifest,
    p: Packed,
    *,
    threads: int,
    check: bool = True,
    device: torch.device | None = None,
    ring: np.ndarray | Callable[[], np.ndarray] | None = None,
    into: list[torch.Tensor] | None = None,
    direct: bool = True,
) -> list[torch.Tensor]:
    """Every tensor of checkpoint `m` (packed as `p`), read with O_DIRECT by `threads` threads:
    into new host memory (`device` None or cpu), new device memory, or the tensors of `into`
    (one per entry, each of its entry's bytes) in place. `ring`: aligned (on CUDA, pinned) host
    memory of at least one chunk, for the two last; its length sets how many chunks are in
    flight; in place it may be a function that makes it, called only where a chunk needs the
    ring. `direct` (in place): the chunks that can be read straight into a host tensor are;
    False: every chunk through the ring. Raises UserError on a missing or short file, ChecksumError naming the tensor and
    file when `check` and a tensor's bytes do not match its checksum."""
    layout.check_files(targets, m)
    files = _Files(targets, m, p)
    try:
        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="readback") as pool:
            if into is not None:
                assert ring is not None, "a restore in place reads through a ring"
                return _in_place(targets, m, p, files, pool, ring, into, check, direct)
            if device is not None and device.type != "cpu":
                assert isinstance(ring, np.ndarray), "a restore to a device reads through a ring"
                return _to_device(targets, m, p, files, pool, ring, device, check)
            return _to_host(targets, m, p, files, pool, check)
    finally:
        files.close()


def _to_host(
    targets: list[str], m: Manifest, p: Packed, files: _Files, pool: ThreadPoolExecutor, check: bool
) -> list[torch.Tensor]:
    """Every chunk straight into one aligned host buffer laid out as the stream."""
    # Not pre-faulted: the O_DIRECT reads fault its pages in, in the reading threads.
    buf = odirect.HostBuffer(p.used, prefault=False)
    arr = buf.array
    # The tensors keep the mapping alive (view -> numpy array -> mmap) and free it with the last
    # of them; the HostBuffer object itself is dropped, never closed.
    del buf

    def read(j: int) -> None:
        lo = j * p.chunk
        files.read(j, arr[lo : lo + odirect.align_up(p.place(j)[3])])

    for f in [pool.submit(read, j) for j in range(p.chunks)]:
        f.result()
    if check and m.checksums:
        for e, off in zip(m.tensors, p.offsets, strict=True):
            if e.nbytes:
                layout.check_entry(targets, m, e, arr[off : off + e.nbytes])
    base = torch.from_numpy(arr)
    return [
        layout.typed(base[o : o + e.nbytes], e) for e, o in zip(m.tensors, p.offsets, strict=True)
    ]


def _through_ring(
    files: _Files,
    p: Packed,
    pool: ThreadPoolExecutor,
    ring: np.ndarray,
    consume: Callable[[int, int], Any],
    chunks: list[int] | None = None,
) -> None:
    """Read every chunk (or those of `chunks`, in that order) into a slot of `ring` (several in
    flight) and hand it, in that order, to `consume(j, slot start)`, which returns an event
    (with `synchronize()`) marking the end of its copies out of the slot, or None when it copied
    synchronously; a slot is read into again only after that event."""
    order = list(range(p.chunks)) if chunks is None else chunks
    # A stream of one chunk needs only that chunk rounded up to a block.
    slots = len(ring) // p.chunk if p.chunks > 1 else 1
    need = p.chunk if p.chunks > 1 else odirect.align_up(p.used)
    assert slots >= 1 and len(ring) >= need, "the ring holds at least one chunk"
    events: list[Any] = [None] * slots

    def read(k: int) -> None:
        s = k % slots
        ev = events[s]
        if ev is not None:
            ev.synchronize()
        lo = s * p.chunk
        j = order[k]
        files.read(j, ring[lo : lo + odirect.align_up(p.place(j)[3])])

    pending: dict[int, Future] = {}
    try:
        for k in range(min(slots, len(order))):
            pending[k] = pool.submit(read, k)
        for k in range(len(order)):
            pending.pop(k).result()
            events[k % slots] = consume(order[k], (k % slots) * p.chunk)
            if k + slots < len(order):
                pending[k + slots] = pool.submit(read, k + slots)
    finally:
        for f in pending.values():
            try:
                f.result()
            except BaseException:  # the first error is already on its way up
                pass


def _to_device(
    targets: list[str],
    m: Manifest,
    p: Packed,
    files: _Files,
    pool: ThreadPoolExecutor,
    ring: np.ndarray,
    device: torch.device,
    check: bool,
) -> list[torch.Tensor]:
    """Chunk by chunk through the ring into one device buffer laid out as the stream."""
    copies = device_copies(device)
    out = copies.empty(p.used)
    ring_t = torch.from_numpy(ring)
    hashes = _Hashes(targets, m, check and m.checksums)
    spans = p.spans(m.tensors) if hashes.h else []

    def consume(j: int, s: int) -> Any:
        _, _, lo, length = p.place(j)
        for i, a, b in spans[j] if spans else ():
            hashes.update(i, ring[s + a - lo : s + b - lo])
        copies.copy(out[lo : lo + length], ring_t[s : s + length])
        return copies.record()

    try:
        _through_ring(files, p, pool, ring, consume)
    finally:
        copies.finish()  # no copy may still read the ring when it is reused or freed
    hashes.check()
    if check and m.checksums:
        for e, off in zip(m.tensors, p.offsets, strict=True):
            if e.nbytes and e.xxh3 is None:
                layout.check_entry(targets, m, e, out[off : off + e.nbytes])
    return [
        layout.typed(out[o : o + e.nbytes], e) for e, o in zip(m.tensors, p.offsets, strict=True)
    ]


def _in_place(
    targets: list[str],
    m: Manifest,
    p: Packed,
    files: _Files,
    pool: ThreadPoolExecutor,
    ring: np.ndarray | Callable[[], np.ndarray],
    into: list[torch.Tensor],
    check: bool,
    direct: bool = True,
) -> list[torch.Tensor]:
    """Into the tensors of `into`: the chunks `direct_chunks` finds read straight into host
    tensors' memory (unless not `direct`), the others through the ring, a memcpy into
    contiguous host tensors, a host-to-device copy into contiguous device tensors; a strided
    tensor gathers its bytes in a contiguous one on its device first, copied into it at the
    end."""
    flat: list[torch.Tensor | None] = []
    host: dict[int, np.ndarray] = {}
    gathered: list[tuple[torch.Tensor, torch.Tensor, TensorEntry]] = []
    for i, (t, e) in enumerate(zip(into, m.tensors, strict=True)):
        if not e.nbytes:
            flat.append(None)
            continue
        d = t.detach()
        if d.is_contiguous():
            f = d.reshape(-1).view(torch.uint8)
        else:
            f = torch.empty(e.nbytes, dtype=torch.uint8, device=d.device)
            gathered.append((d, f, e))
        flat.append(f)
        if not on_device(f):
            host[i] = f.numpy()
    devs = [f for i, f in enumerate(flat) if f is not None and i not in host]
    copies = device_copies(devs[0].device) if devs else None
    spans = p.spans(m.tensors)
    straight = direct_chunks(p, spans, host) if direct else {}
    rest = [j for j in range(p.chunks) if j not in straight]
    # the ring only where a chunk goes through it (a bounded staging grows to it: not for a
    # restart read straight into the tensors)
    if callable(ring):
        ring = ring() if rest else np.empty(0, dtype=np.uint8)
    ring_t = torch.from_numpy(ring)
    # a tensor read straight (in part) is hashed whole at the end, not streamed in order
    hashes = _Hashes(targets, m, check and m.checksums)
    whole = {spans[j][0][0] for j in straight}
    for i in whole:
        hashes.h.pop(i, None)

    def consume(j: int, s: int) -> Any:
        lo = p.place(j)[2]
        queued = False
        for i, a, b in spans[j]:
            src = ring[s + a - lo : s + b - lo]
            hashes.update(i, src)
            off = p.offsets[i]
            h = host.get(i)
            if h is not None:
                np.copyto(h[a - off : b - off], src)
            else:
                f = flat[i]
                assert f is not None and copies is not None
                copies.copy(f[a - off : b - off], ring_t[s + a - lo : s + b - lo])
                queued = True
        return copies.record() if queued and copies is not None else None

    reads = [pool.submit(files.read, j, dst) for j, dst in straight.items()]
    try:
        if rest:
            _through_ring(files, p, pool, ring, consume, rest)
    finally:
        if copies is not None:
            copies.finish()
        for fut in reads:  # the first error raises; none is left writing into the destination
            fut.exception()
    for fut in reads:
        fut.result()
    hashes.check()
    if check and m.checksums:
        for i, (e, mem) in enumerate(zip(m.tensors, flat, strict=True)):
            if mem is not None and (e.xxh3 is None or i in whole):
                layout.check_entry(targets, m, e, host.get(i, mem))
    for d, g, e in gathered:
        d.copy_(layout.typed(g, e))
    return into


def direct_chunks(
    p: Packed, spans: list[list[tuple[int, int, int]]], host: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """The chunks that O_DIRECT can read straight into a host tensor's memory, each with that
    memory: every byte of the chunk is that one tensor's, its length is a whole number of
    blocks, and its place in the tensor's memory starts on a block boundary. Checked for each
    chunk from the memory's address, never assumed: torch's own allocator gives large tensors
    64-byte, not page, alignment; the sweep's host-emulated states are carved page-aligned out
    of huge pages (bench.workloads.synthetic.DeviceMemory); a tensor's last partial block, the
    padding between tensors and chunks shared by several tensors go through the ring."""
    out: dict[int, np.ndarray] = {}
    for j, sp in enumerate(spans):
        if len(sp) != 1:
            continue
        i, a, b = sp[0]
        _, _, lo, length = p.place(j)
        mem = host.get(i)
        if mem is None or (a, b) != (lo, lo + length) or length % odirect.ALIGN:
            continue
        off = p.offsets[i]
        dst = mem[a - off : b - off]
        if dst.ctypes.data % odirect.ALIGN == 0:
            out[j] = dst
    return out


def _direct_pieces(
    t: int,
    off: int,
    length: int,
    mem: np.ndarray,
    chunk: int,
    straight: list[tuple[int, int, np.ndarray]],
) -> list[tuple[int, int, int]]:
    """Split one extent (`length` bytes at file offset `off` of target `t`, landing in `mem`):
    its whole blocks appended to `straight` as (target, file offset, memory) reads of `chunk`
    at most, where the file offset and the memory address agree modulo the block (checked,
    never assumed); returns what is left for the bounce buffers: (file offset, length, its
    position in `mem`)."""
    a, b = odirect.align_up(off), odirect.align_down(off + length)
    if b <= a or (mem.ctypes.data + (a - off)) % odirect.ALIGN:
        return [(off, length, 0)]
    for lo in range(a, b, chunk):
        hi = min(b, lo + chunk)
        straight.append((t, lo, mem[lo - off : hi - off]))
    return [(o, n, at) for o, n, at in ((off, a - off, 0), (b, off + length - b, b - off)) if n]


def read_extents(
    targets: list[str],
    m: Manifest,
    *,
    threads: int,
    chunk: int,
    only: list[int] | None = None,
    check: bool = True,
    into: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Tensors of checkpoint `m` (those at indexes `only`, in that order) read with O_DIRECT
    whatever its layout (gds's, where a tensor may start anywhere in its file), `threads` reads
    at once, no page of the checkpoint left in the page cache:
    - into the flat uint8 host tensors of `into` (a restart: the emulation of kvikio's pread
      into the destination), every whole block of an extent whose file offset and memory
      address agree modulo the block straight into the tensor's memory, in reads of `chunk`
      at most (`_direct_pieces`);
    - the rest (new host memory, the unaligned heads and tails of extents): the part of each
      `chunk` of a data file that holds their bytes read into an aligned bounce buffer of the
      reading thread, and each extent's bytes copied out of it, as kvikio's POSIX path reads
      through its bounce buffers.
    Raises as `read_packed`."""
    import threading

    layout.check_files(targets, m)
    chosen = list(range(len(m.tensors))) if only is None else list(only)
    if into is not None:
        out = {i: t.numpy() for i, t in zip(chosen, into, strict=True)}
    else:  # one buffer on huge pages, as `_to_host`'s; the tensors' views keep it alive
        at, total = {}, 0
        for i in chosen:
            at[i], total = total, total + odirect.align_up(m.tensors[i].nbytes, layout.TENSOR_ALIGN)
        arr = odirect.HostBuffer(max(total, 1), prefault=False).array
        out = {i: arr[at[i] : at[i] + m.tensors[i].nbytes] for i in chosen}
    # (target, chunk index) -> the extents in it: (file offset, length, tensor, its position)
    spans: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    straight: list[tuple[int, int, np.ndarray]] = []  # (target, file offset, memory)
    for i in chosen:
        pos = 0
        for t, off, length in m.tensors[i].extents:
            rest = [(off, length, 0)]
            if into is not None:
                rest = _direct_pieces(t, off, length, out[i][pos : pos + length], chunk, straight)
            for o, n, here in rest:
                for k in range(o // chunk, (o + n - 1) // chunk + 1 if n else 0):
                    spans.setdefault((t, k), []).append((o, n, i, pos + here))
            pos += length
    paths = {t: layout.data_path(targets, m, t) for t in m.files}
    fds: dict[int, int] = {}
    local = threading.local()
    buffers: list[odirect.HostBuffer] = []
    lock = threading.Lock()

    def read(key: tuple[int, int]) -> None:
        t, k = key
        buf = getattr(local, "buf", None)
        if buf is None:
            # not pre-faulted: the first read into it faults its pages in
            buf = local.buf = odirect.HostBuffer(chunk, prefault=False)
            with lock:
                buffers.append(buf)
        # only the blocks of the chunk that its extents touch
        first, end = k * chunk, min((k + 1) * chunk, int(m.files[t]["bytes"]))
        lo = odirect.align_down(max(first, min(off for off, _, _, _ in spans[key])))
        hi = min(end, max(off + size for off, size, _, _ in spans[key]))
        read_aligned(fds[t], buf.array, lo, hi - lo, m.name, paths[t])
        for off, size, i, pos in spans[key]:
            a, b = max(lo, off), min(hi, off + size)
            out[i][pos + a - off : pos + b - off] = buf.array[a - lo : b - lo]

    def read_straight(piece: tuple[int, int, np.ndarray]) -> None:
        t, off, mem = piece
        read_aligned(fds[t], mem, off, len(mem), m.name, paths[t])

    try:
        for t, path in paths.items():
            fds[t] = os.open(path, os.O_RDONLY | os.O_DIRECT)
        # no more threads (and bounce chunks) than there are reads
        workers = max(1, min(threads, len(spans) + len(straight)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="readback") as pool:
            futures = [pool.submit(read_straight, piece) for piece in straight]
            futures += [pool.submit(read, key) for key in sorted(spans)]
            for f in futures:
                f.result()
    finally:
        for fd in fds.values():
            os.close(fd)
        for b in buffers:
            b.close()
    if check and m.checksums:
        for i in chosen:
            layout.check_entry(targets, m, m.tensors[i], out[i])
    flat = (
        {i: torch.from_numpy(a) for i, a in out.items()}
        if into is None
        else dict(zip(chosen, into, strict=True))
    )
    return [layout.typed(flat[i], m.tensors[i]) for i in chosen]
