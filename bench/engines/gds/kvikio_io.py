"""gds's kvikio I/O: files opened through cuFile (or its POSIX fallback, said), pwrite from device
memory window by window and piece by piece, the device checksums beside them, and the restore
through kvikio pread into device memory. Functions taking `self` are methods of the engine
(bench.engines.gds.engine.Gds), kept here by their job, typed by what they use of it
(bench.engines.gds.parts)."""

from __future__ import annotations

import errno
import os
import threading
import time
from contextlib import nullcontext
from typing import Any

import torch

from bench.common.errors import UserError
from bench.engines.base import check_name
from bench.engines.gds import coalesce, cuda, kvikio_lib, labels
from bench.engines.gds.parts import GdsEngine
from bench.engines.striped import check_into
from bench.engines.stripes import Job
from bench.measure.detail import GdsDetail
from bench.storage import checksums, generations, layout
from bench.storage.tree import flatten, unflatten


def open_cufile(self: GdsEngine, path: str, flags: str, reasons: list[str]) -> Any:
    """A CuFile for `path`. Opened with compat mode OFF, so that it either uses cuFile or
    fails; on failure (and with allow_compat) opened again through POSIX, with the reason
    appended to `reasons`: the fallback kvikio's AUTO mode would make silently. OFF is
    asked for only where kvikio says cuFile works: without a CUDA driver kvikio 26.10's
    CuFile spins forever opening a file with compat mode OFF."""
    kv = self._kvikio
    why = kvikio_lib._global_reason(kv)
    if why is None:
        try:
            with kv.defaults.set("compat_mode", kv.CompatMode.OFF):
                return kv.CuFile(path, flags)
        except (RuntimeError, OSError, ValueError) as e:
            why = f"cuFile could not take {path} ({' '.join(str(e).split())[:200]})"
            if not self.options.allow_compat:
                raise UserError(f"engine gds: {why} and allow_compat is false") from None
    reasons.append(why)
    try:
        with kv.defaults.set("compat_mode", kv.CompatMode.ON):
            return kv.CuFile(path, flags)
    except RuntimeError as e:  # kvikio's open failures are RuntimeErrors
        raise kvikio_lib._kvikio_error(e, path) from None


def hash_direct(
    self: GdsEngine, job: Job, idx: list[int], mems: dict[int, torch.Tensor], dev: list[bool]
) -> None:
    """Checksums of the directly written tensors while kvikio's threads write: host tensors
    with xxh3; device tensors by torch kernels on a side stream, their sums read back to the
    host once."""
    on_dev = [i for i in idx if dev[i]]
    for i in idx:
        if not dev[i]:
            job.xxh3[i] = checksums.checksum(mems[i].numpy())
    if not on_dev:
        return
    stream = self._side_stream()
    if stream is not None:
        # The state's last writes were queued on the current stream: hash what they wrote.
        stream.wait_stream(torch.cuda.current_stream(self.device.torch_device))
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        sums = torch.stack([checksums.device_sums(mems[i]) for i in on_dev]).cpu()
    entries = job.plan.entries
    for row, i in zip(sums.tolist(), on_dev, strict=True):
        job.wsum64[i] = checksums.wsum64_digest(row[0], row[1], entries[i].nbytes)


def write(self: GdsEngine, job: Job, w: coalesce.Writes) -> None:
    """Write with kvikio CuFile.pwrite from device memory (paced where a target is capped),
    the coalesced tensors window by window from the coalescing buffer, hash meanwhile,
    fsync, commit the manifest; label the save from what its files did."""
    co, pieces, file_bytes, mems, dev = w.co, w.pieces, w.file_bytes, w.mems, w.dev
    result, entries = job.result, job.plan.entries
    settings = self._settings()
    reset = self._ensure_settings()  # a no-op unless someone changed kvikio's settings
    reasons: list[str] = []
    files: dict[int, Any] = {}
    issued: list[layout.Piece] = []  # every piece handed to kvikio, in order
    futures: list[Any] = []  # its future; None once waited for (`written` has its count)
    written: list[int] = []
    issuers: list[Any] = []
    paths = self.writer.paths(result, file_bytes)
    device_mem = {id(mems[i]) for i in co.direct if dev[i]}
    if co.buffer is not None and self.device.is_cuda:
        device_mem.add(id(co.buffer))
    lock = threading.Lock()
    self.writer.prepare(result)
    nvfs_before = labels.nvfs_counters()

    def issue(p: layout.Piece) -> None:
        self.writer.pace(p.target, p.length)
        buf = cuda.kvikio_buffer(p.mem[p.start : p.start + p.length], id(p.mem) in device_mem)
        try:
            f = files[p.target].pwrite(buf, p.length, p.file_offset)
        except RuntimeError as e:
            raise kvikio_lib._kvikio_error(e, paths[p.target]) from None
        with lock:
            issued.append(p)
            futures.append(f)
            written.append(-1)

    def wait_for(first: int, count: int) -> None:
        """Wait for the pieces issued at [first, first + count) (each future once)."""
        for k in range(first, first + count):
            with lock:
                f, futures[k] = futures[k], None
            if f is not None:
                written[k] = kvikio_lib._wait_all([f], [paths[issued[k].target]])[0]

    def write_round(round_pieces: list[layout.Piece]) -> Any:
        with lock:
            first = len(issued)
        for p in round_pieces:
            issue(p)
        return lambda: wait_for(first, len(round_pieces))

    try:
        for t, n in file_bytes.items():
            files[t] = self._open_cufile(paths[t], "w", reasons)
            # Reserve the file's length first, as the other striped engines do.
            fd = os.open(paths[t], os.O_WRONLY)
            try:
                self.writer.reserve(fd, n)
            finally:
                os.close(fd)
        if any(b is not None for b in self.writer.buckets):
            # Capped targets: each target's pieces are handed to kvikio no faster than its
            # cap, from the engine's threads, while this thread coalesces and hashes.
            order: dict[int, list[layout.Piece]] = {}
            for p in pieces:
                order.setdefault(p.target, []).append(p)

            def issue_all(ps: list[layout.Piece]) -> None:
                for p in ps:
                    issue(p)

            issuers = [self.writer.pool.submit(issue_all, ps) for ps in order.values()]
        else:
            for p in pieces:
                issue(p)
        self._coalesced_rounds(job, co, write_round)
        if self.options.checksums:
            h0 = time.perf_counter_ns()
            self._hash_kvikio(job, co.direct, mems, dev)
            result.hash_s += (time.perf_counter_ns() - h0) / 1e9
        self.writer.prepare_manifest(job, file_bytes)  # while the last writes run
        for f in issuers:
            f.result()
    finally:
        try:
            # Every issued write ends before its file closes, also after a failure: a
            # write in flight on a closed descriptor could land in whatever file reuses it.
            for f in issuers:
                try:
                    f.result()
                except BaseException:  # raised above, or by the waits below
                    pass
            with lock:
                left = [(k, f) for k, f in enumerate(futures) if f is not None]
                for k, _ in left:
                    futures[k] = None
            got = kvikio_lib._wait_all(
                [f for _, f in left], [paths[issued[k].target] for k, _ in left]
            )
            for (k, _), n in zip(left, got, strict=True):
                written[k] = n
            self._device_sync()
        finally:
            for f in files.values():
                f.close()
    # A short write is not an error to cuFile; it is one to a checkpoint.
    for p, n in zip(issued, written, strict=True):
        if n != p.length:
            raise OSError(
                errno.EIO,
                f"kvikio wrote {n} of {p.length} bytes at {p.file_offset}",
                paths[p.target],
            )
    device_bytes = sum(p.length for p in issued if id(p.mem) in device_mem)
    small = sum(
        p.length for p in issued if id(p.mem) in device_mem and p.length < settings["gds_threshold"]
    )
    if small:
        reasons.append(
            f"{small} device bytes were in pieces under gds_threshold "
            f"({settings['gds_threshold']} B) and went through kvikio's POSIX bounce path"
        )
    result.gds_mode, evidence = self._label(reasons, device_bytes, nvfs_before, "write")
    if result.gds_mode == "compat" and device_bytes:
        # device bytes went through kvikio's pinned bounce buffers, which its pool keeps
        self._kvikio_pinned = max(self._kvikio_pinned, self._derived_pinned())
    self.writer.finish(paths, file_bytes)  # cuFile has no fsync of its own
    written_from = [mems[i] for i in co.direct if dev[i] and mems[i].numel()]
    if co.buffer is not None and self.device.is_cuda:
        written_from.append(co.buffer)
    registered = {
        self._registered_ptrs[m.data_ptr()]
        for m in written_from
        if m.data_ptr() in self._registered_ptrs
    }
    unregistered = sum(m.numel() for m in written_from if m.data_ptr() not in self._registered_ptrs)
    result.detail = GdsDetail(
        io="kvikio",
        kvikio=getattr(self._kvikio, "__version__", None),
        **settings,
        settings_reset_in_save=True if reset else None,
        compat_mode="OFF (fallback ON per file)" if self.options.allow_compat else "OFF",
        files=len(file_bytes),
        device_bytes=device_bytes,
        host_bytes=sum(entries[i].nbytes for i in co.direct if not dev[i]),
        registered_bytes=sum(self._registered[b][1] for b in registered),
        unregistered_device_bytes=unregistered,
        register_note=self._register_note or None,
        checksum="wsum64 on the device" if self.options.checksums else "off",
        pinned_bytes_derived=(
            "num_threads x bounce_buffer_size (kvikio's settings)" if self._kvikio_pinned else None
        ),
        gds_evidence=evidence,
        compat_reasons=reasons or None,
    )
    self.writer.commit(job, file_bytes)


def load(
    self: GdsEngine, name: str, device: str = "cpu", checksums: bool = True, into: Any = None
) -> Any:
    """Restore `name`; into CUDA memory through kvikio pread (the GDS read path) when this
    engine writes with kvikio, else through host memory like the other engines. `into`: a
    state whose tensors the bytes are read into, in place (through kvikio, the contiguous
    device tensors straight into their memory)."""
    dev = torch.device(device)
    dst: list[torch.Tensor] | None = None
    if into is not None:
        dst = [t for _, t in flatten(into)[1]]
        dev = next((t.device for t in dst if cuda.on_device(t)), dev)
    if self.io != "kvikio" or dev.type != "cuda":
        self.restore_mode, self.restore_detail = "host", {}
        return self._host_load(name, device, checksums, into)
    check_name(name)
    m = generations.read(self.targets, name)
    layout.check_files(self.targets, m)
    if dst is not None:
        check_into(m, dst)
    settings = self._settings()
    reset = self._ensure_settings()
    reasons: list[str] = []
    files: dict[int, Any] = {}
    futures: list[Any] = []
    where: list[str] = []
    out: dict[int, torch.Tensor] = {}
    # Tensors hashed on the host at save time (host tensors of the state) are read through
    # host memory and checked there; the rest go straight into device memory.
    host_side = [i for i, e in enumerate(m.tensors) if e.xxh3 is not None]
    nvfs_before = labels.nvfs_counters()
    try:
        for t in m.files:
            files[t] = self._open_cufile(layout.data_path(self.targets, m, t), "r", reasons)
        for i, e in enumerate(m.tensors):
            if i in host_side:
                continue
            buf = (
                dst[i].detach().reshape(-1).view(torch.uint8)
                if dst is not None and cuda.on_device(dst[i]) and dst[i].is_contiguous()
                else cuda.device_empty(e.nbytes, dev)
            )
            out[i] = buf
            pos = 0
            for t, off, length in e.extents:
                path = layout.data_path(self.targets, m, t)
                try:
                    futures.append(
                        files[t].pread(
                            cuda.kvikio_buffer(buf[pos : pos + length], True), length, off
                        )
                    )
                except RuntimeError as err:
                    raise kvikio_lib._kvikio_error(err, path) from None
                where.append(path)
                pos += length
    finally:
        try:
            got = kvikio_lib._wait_all(futures, where)
            self._device_sync()
        finally:
            for f in files.values():
                f.close()
    want = [
        length for i, e in enumerate(m.tensors) if i not in host_side for _, _, length in e.extents
    ]
    if got != want:
        raise UserError(f"checkpoint {name!r}: kvikio read fewer bytes than its manifest lists")
    device_bytes = sum(m.tensors[i].nbytes for i in out)
    self.restore_mode, evidence = self._label(reasons, device_bytes, nvfs_before, "read")
    if self.restore_mode == "compat" and device_bytes:
        self._kvikio_pinned = max(self._kvikio_pinned, self._derived_pinned())
    if checksums and m.checksums:
        for i, buf in out.items():
            layout.check_entry(self.targets, m, m.tensors[i], buf)
    if host_side:
        for i, host in zip(
            host_side,
            layout.read_tensors(self.targets, m, only=host_side, check=checksums),
            strict=True,
        ):
            flat = host.reshape(-1).view(torch.uint8) if host.numel() else host
            out[i] = cuda.to_device(flat, dev)
    self.restore_detail = {
        **settings,
        **({"settings_reset_in_restore": True} if reset else {}),
        "gds_evidence": evidence,
        **({"compat_reasons": reasons} if reasons else {}),
    }
    tensors = [layout.typed(out[i], e) for i, e in enumerate(m.tensors)]
    if dst is not None:
        for mine, read in zip(dst, tensors, strict=True):
            if read.numel() and mine.data_ptr() != read.data_ptr():
                mine.copy_(read)  # read elsewhere: a host tensor, or a strided device one
        return into
    return unflatten(m.tree, tensors)
