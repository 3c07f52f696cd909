"""`gds`: GPUDirect Storage through kvikio's CuFile, straight from device memory.

There is no staging copy: training may not touch the tensors until their bytes are durable, so
the stall is the whole durable write (pwrite of every piece, fsync of every file, manifest).

Two I/O back ends, chosen by the `io` option:
- `kvikio`: kvikio CuFile.pwrite from the device tensors, run the way a GDS user tunes it:
  kvikio's thread pool sized to the engine's writer threads (`threads_per_target` x targets; its
  default is one thread), `task_size` = `chunk_bytes`, `gds_threshold` as set (0 by default, so
  that no device piece takes kvikio's POSIX bounce path for being small), all set for the save
  and restored after; the state's device tensors registered with cuFile (cuFileBufRegister, via
  kvikio's memory_register) in `warm()`, outside the timed region. Host tensors in the state (an
  optimizer's `step` scalars) are handed to kvikio as host buffers and go through its POSIX path;
  their bytes are counted apart (`host_bytes`).
  Checksums are computed on the device by torch kernels (`checksums.device_checksum`, recorded as
  `wsum64`), so no device byte is copied to the host inside the stall; `hash_s` says how long
  they took.
  `gds_mode` is decided for each save from what its files really did: `gds` only when cuFile is
  available with the nvidia-fs driver, every file was opened with kvikio's compat mode OFF (so
  cuFile registered it: kvikio's AUTO mode would fall back to POSIX per file silently, and
  kvikio cannot be asked afterwards), no device piece went below `gds_threshold`, and, when
  cufile.json allows cuFile's own compat mode, every target is on a filesystem GDS serves
  natively. Otherwise `compat`, with the reasons in the row's `io_detail`. With
  `allow_compat: false` a file cuFile cannot take is an error instead of a fallback.
  Restores into CUDA memory read with kvikio pread into device memory, in parallel like the
  writes, checked on the device, and are labelled the same way (`restore_mode`).
- `emulated`: O_DIRECT straight from the tensors' own memory (host-emulated), the aligned middle
  of each tensor in place and only the unaligned head and tail through a one-block bounce buffer;
  on CUDA (without kvikio, asked for explicitly) device pieces go through a per-thread pinned
  bounce buffer, as kvikio's POSIX compat path does. `gds_mode=emulated`: never GDS numbers.
  A non-contiguous tensor must be copied first; the result counts such copies in
  `copied_tensors`.
`auto` takes kvikio on CUDA and the emulation on host-emulated. On CUDA without kvikio, gds is
unavailable (skipped with the reason) unless `io: emulated` is asked for.
"""

from __future__ import annotations

import errno
import importlib
import os
import threading
import time
from typing import Any

import torch

from bench import checksums, layout, manifest, odirect
from bench import env as env_mod
from bench.engines.base import PendingSave, check_name
from bench.engines.striped import StripedEngine
from bench.engines.traits import Traits
from bench.errors import UserError
from bench.staging import PinnedBuffer
from bench.tree import flatten, unflatten

# Filesystems GPUDirect Storage serves without falling back to POSIX (NVIDIA's GDS overview:
# ext4 in ordered mode and XFS on local NVMe, and the distributed filesystems with GDS support).
GDS_FILESYSTEMS = ("ext4", "xfs", "lustre", "gpfs", "wekafs", "beegfs", "nfs", "nfs4")


def import_kvikio() -> Any:
    """The kvikio module (tests put a fake in its place)."""
    import kvikio  # optional extra

    return kvikio


def kvikio_unavailable() -> str | None:
    """None if kvikio imports and can do I/O here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device: kvikio needs libcuda.so.1"
    try:
        import_kvikio()
    except ImportError as e:
        return f"kvikio is not installed ({e}); pip install -e '.[gds]'"
    return None


def kvikio_mode(kvikio: Any) -> str:
    """`gds` if kvikio can use cuFile with the nvidia-fs driver loaded, else `compat` (a
    property of the machine; a save's own label also depends on its files, see `Gds`)."""
    return "gds" if _global_reason(kvikio) is None else "compat"


def _global_reason(kvikio: Any) -> str | None:
    try:
        if kvikio.defaults.is_compat_mode_preferred():
            return "kvikio prefers compat mode (cuFile unavailable, or KVIKIO_COMPAT_MODE=ON)"
        if not kvikio.cufile_driver.properties.is_gds_available:
            return "the nvidia-fs driver is not loaded (cuFile can only do POSIX I/O)"
    except Exception as e:  # any failure to tell means we cannot claim GDS
        return f"kvikio cannot tell whether GDS is available ({type(e).__name__}: {e})"
    return None


def _cufile_allows_compat(kvikio: Any) -> bool:
    try:
        return bool(kvikio.cufile_driver.properties.allow_compat_mode)
    except Exception:  # unknown: assume cuFile may fall back
        return True


def _memory_fn(kvikio: Any, name: str) -> Any:
    """kvikio.memory_register / memory_deregister (top level from 26.04, kvikio.buffer before)."""
    fn = getattr(kvikio, name, None)
    if fn is None:
        fn = getattr(importlib.import_module("kvikio.buffer"), name)
    return fn


# The seam where tests put a fake CUDA (tests/fake_kvikio.py): which tensors are device memory,
# what kvikio is handed for them, and how device memory is allocated and filled on restore.
def on_device(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def kvikio_buffer(mem: torch.Tensor, device: bool) -> Any:
    """What kvikio gets for a flat uint8 tensor: device memory as the CUDA tensor itself (it has
    `__cuda_array_interface__`), host memory as a numpy array (kvikio takes the buffer protocol,
    which torch tensors lack: a torch CPU tensor would be a TypeError)."""
    return mem if device else mem.numpy()


def device_empty(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device)


def _io_choice(options: dict[str, Any]) -> str:
    """The back end `auto` resolves to for these options."""
    io = options.get("io", "auto")
    if io != "auto":
        return io
    dev = options.get("device", "auto")
    cuda = dev == "cuda" or (dev == "auto" and torch.cuda.is_available())
    return "kvikio" if cuda else "emulated"


class Gds(StripedEngine):
    name = "gds"
    traits = Traits(
        stall="durable",
        from_device=True,
        o_direct=True,
        page_cache=False,
        stripes=True,
        host_copies=0,
        baseline=False,
        summary="kvikio CuFile.pwrite straight from device memory (GPUDirect Storage)",
    )

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        self.io = self.options.io
        if self.io == "auto":
            self.io = "kvikio" if self.device.is_cuda else "emulated"
        self._kvikio = None
        self._registered: dict[int, tuple[torch.Tensor, int]] = {}  # address -> (buffer, bytes)
        self._register_note = ""
        self._bounce = threading.local()
        self._bounces: list[PinnedBuffer] = []
        self._bounce_lock = threading.Lock()
        self.restore_mode = "none"
        self.restore_detail: dict[str, Any] = {}
        if self.io == "kvikio":
            try:
                self._kvikio = import_kvikio()
            except ImportError as e:
                raise UserError(f"engine gds: io=kvikio but kvikio does not import ({e})") from None
            if not self.options.allow_compat and kvikio_mode(self._kvikio) != "gds":
                raise UserError(
                    "engine gds: kvikio would run in compat mode and allow_compat is false "
                    f"({_global_reason(self._kvikio)})"
                )
            self._fs_reasons = self._filesystem_reasons()

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        if _io_choice(options or {}) != "kvikio":
            return None  # the emulation runs anywhere O_DIRECT works; the label says what it is
        try:
            import_kvikio()
        except ImportError as e:
            return (
                f"kvikio is not installed ({e}): on CUDA gds writes device memory through kvikio "
                "(pip install -e '.[gds]'); engine_options.gds.io: emulated runs a host "
                "emulation instead (gds_mode=emulated, not GDS)"
            )
        return None

    def gds_mode(self) -> str:
        if self.io != "kvikio":
            return "emulated"
        return kvikio_mode(self._kvikio)

    # -- kvikio settings and files ----------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        """kvikio's runtime settings for this engine's I/O (restored after each save/load)."""
        return {
            "num_threads": self.options.threads_per_target * len(self.targets),
            "task_size": self.options.chunk_bytes,
            "gds_threshold": self.options.gds_threshold,
        }

    def _filesystem_reasons(self) -> list[str]:
        """Why cuFile might serve a target through its own compat mode (only matters when
        cufile.json allows it): the target's filesystem is not one GDS serves natively."""
        out = []
        for info in env_mod.targets_info(self.targets)["targets"]:
            fs = info.get("fstype", "unknown")
            if fs not in GDS_FILESYSTEMS:
                out.append(f"{info['path']} is on {fs}, which GDS does not serve natively")
        return out

    def _open_cufile(self, path: str, flags: str, reasons: list[str]) -> Any:
        """A CuFile for `path`. Opened with compat mode OFF, so that it either uses cuFile or
        fails; on failure (and with allow_compat) opened again through POSIX, with the reason
        appended to `reasons`: the fallback kvikio's AUTO mode would make silently."""
        kv = self._kvikio
        why = _global_reason(kv)
        if why is None:
            try:
                with kv.defaults.set("compat_mode", kv.CompatMode.OFF):
                    return kv.CuFile(path, flags)
            except (RuntimeError, OSError, ValueError) as e:
                why = f"cuFile could not take {path} ({' '.join(str(e).split())[:200]})"
                if not self.options.allow_compat:
                    raise UserError(f"engine gds: {why} and allow_compat is false") from None
        reasons.append(why)
        with kv.defaults.set("compat_mode", kv.CompatMode.ON):
            return kv.CuFile(path, flags)

    def _label(self, reasons: list[str], device_bytes: int) -> str:
        if device_bytes == 0:
            reasons.append("no tensor was in device memory: nothing went over GDS")
        if _cufile_allows_compat(self._kvikio) and self._fs_reasons:
            reasons.extend(f"cufile.json allows compat mode and {r}" for r in self._fs_reasons)
        return "compat" if reasons else "gds"

    # -- buffer registration ----------------------------------------------------------------

    def warm(self, state: Any) -> None:
        """Register the state's device tensors with cuFile (kvikio memory_register), as GDS users
        are told to for buffers used again and again; outside the timed region."""
        if self.io != "kvikio" or not self.options.register_buffers:
            return
        self._deregister()
        kv = self._kvikio
        if kv.defaults.is_compat_mode_preferred():
            self._register_note = "not registered: kvikio is in compat mode"
            return
        _, tensors = flatten(state)
        try:
            register = _memory_fn(kv, "memory_register")
            for _, t in tensors:
                if on_device(t) and t.is_contiguous() and t.numel():
                    mem = t.detach().reshape(-1).view(torch.uint8)
                    if mem.data_ptr() not in self._registered:
                        register(kvikio_buffer(mem, True))
                        self._registered[mem.data_ptr()] = (mem, mem.numel())
            self._register_note = ""
        except Exception as e:  # registration only helps; run without it, and say so
            self._register_note = f"registration failed: {type(e).__name__}: {e}"[:200]

    def _deregister(self) -> None:
        if not self._registered:
            return
        deregister = _memory_fn(self._kvikio, "memory_deregister")
        for mem, _ in self._registered.values():
            try:
                deregister(kvikio_buffer(mem, True))
            except Exception:  # the buffers are released with the engine anyway
                pass
        self._registered.clear()

    def close(self) -> None:
        super().close()
        if self._kvikio is not None:
            self._deregister()
        with self._bounce_lock:
            for b in self._bounces:
                b.close()
            self._bounces.clear()

    @property
    def pinned_bytes(self) -> int:
        return sum(b.nbytes for b in self._bounces)

    # -- save -------------------------------------------------------------------------------

    def _save(self, pending: PendingSave, tree: Any, tensors: list, entries: list) -> None:
        result = pending.result
        mems, dev = [], []
        for _, t in tensors:
            src = t.detach()
            if not src.is_contiguous():
                src = src.contiguous()
                result.copied_tensors += 1
            mem = (
                src.reshape(-1).view(torch.uint8)
                if src.numel()
                else torch.empty(0, dtype=torch.uint8, device=src.device)
            )
            mems.append(mem)
            dev.append(on_device(t))
        if self.io == "emulated":
            if any(dev) and not self.device.is_cuda:
                raise UserError("engine gds: io=emulated on device tensors needs device: cuda")
            srcs = [m if d else m.numpy() for m, d in zip(mems, dev, strict=True)]
            pieces, file_bytes = layout.direct(
                srcs, entries, len(self.targets), self.options.chunk_bytes
            )
            self._persist(result, result.name, tree, entries, pieces, file_bytes, srcs)
            result.extra = {
                "io": "emulated",
                "device_bytes": 0
                if not any(dev)
                else sum(m.numel() for m, d in zip(mems, dev, strict=True) if d),
            }
        else:
            pieces, file_bytes = layout.direct(
                mems, entries, len(self.targets), self.options.chunk_bytes
            )
            self._persist_kvikio(result, tree, entries, pieces, file_bytes, mems, dev)
        result.pinned_bytes = self.pinned_bytes
        # Training may touch the tensors only now: the stall is the whole durable write.
        result.stall_s = (time.perf_counter_ns() - pending.t0_ns) / 1e9
        pending.finish_now()

    def _hash(self, entry: manifest.TensorEntry, view: Any) -> None:
        """Device memory (a tensor here) is hashed where it is, by torch kernels (wsum64); host
        memory (a numpy array) with xxh3."""
        if isinstance(view, torch.Tensor):
            entry.wsum64 = checksums.device_checksum(view)
        else:
            entry.xxh3 = checksums.checksum(view)

    def _persist_kvikio(
        self,
        result: Any,
        tree: Any,
        entries: list[manifest.TensorEntry],
        pieces: list[layout.Piece],
        file_bytes: dict[int, int],
        mems: list[torch.Tensor],
        dev: list[bool],
    ) -> None:
        """Write with kvikio CuFile.pwrite from device memory, hash on the device, fsync, commit
        the manifest; label the save from what its files did."""
        kvikio = self._kvikio
        name = result.name
        settings = self._settings()
        reasons: list[str] = []
        files: dict[int, Any] = {}
        futures: list[Any] = []
        device_mem = {id(m) for m, d in zip(mems, dev, strict=True) if d}
        self._prepare(result)
        with kvikio.defaults.set(settings):
            try:
                for t in file_bytes:
                    path = layout.data_file(self.targets, name, t, result.save_id)
                    files[t] = self._open_cufile(path, "w", reasons)
                for p in pieces:
                    futures.append(
                        files[p.target].pwrite(
                            kvikio_buffer(
                                p.mem[p.start : p.start + p.length], id(p.mem) in device_mem
                            ),
                            p.length,
                            p.file_offset,
                        )
                    )
                if self.options.checksums:
                    # While kvikio's threads write: on the device for device tensors.
                    h0 = time.perf_counter_ns()
                    for e, m, d in zip(entries, mems, dev, strict=True):
                        self._hash(e, m if d else m.numpy())
                    result.hash_s = (time.perf_counter_ns() - h0) / 1e9
            finally:
                try:
                    # Every issued write ends before its file closes, also after a failure: a
                    # write in flight on a closed descriptor could land in whatever file reuses it.
                    written = _wait_all(futures)
                    self._device_sync()
                finally:
                    for f in files.values():
                        f.close()
        # A short write is not an error to cuFile; it is one to a checkpoint.
        for p, n in zip(pieces, written, strict=True):
            if n != p.length:
                path = layout.data_file(self.targets, name, p.target, result.save_id)
                raise OSError(
                    errno.EIO, f"kvikio wrote {n} of {p.length} bytes at {p.file_offset}", path
                )
        # cuFile has no fsync of its own: fsync through a plain descriptor of the same file,
        # which flushes the file's data whatever descriptor wrote it.
        for t, n in file_bytes.items():
            fd = os.open(layout.data_file(self.targets, name, t, result.save_id), os.O_WRONLY)
            try:
                if os.fstat(fd).st_size != n:
                    os.ftruncate(fd, n)
                os.fsync(fd)
            finally:
                os.close(fd)
        device_bytes = sum(p.length for p in pieces if id(p.mem) in device_mem)
        small = sum(
            p.length
            for p in pieces
            if id(p.mem) in device_mem and p.length < settings["gds_threshold"]
        )
        if small:
            reasons.append(
                f"{small} device bytes were in pieces under gds_threshold "
                f"({settings['gds_threshold']} B) and went through kvikio's POSIX bounce path"
            )
        registered = sum(n for a, (_, n) in self._registered.items() if _in(a, mems, dev))
        result.gds_mode = self._label(reasons, device_bytes)
        result.extra = {
            "io": "kvikio",
            "kvikio": getattr(kvikio, "__version__", None),
            **settings,
            "compat_mode": "OFF (fallback ON per file)" if self.options.allow_compat else "OFF",
            "files": len(file_bytes),
            "device_bytes": device_bytes,
            "host_bytes": result.bytes
            - sum(e.nbytes for e, d in zip(entries, dev, strict=True) if d),
            "registered_bytes": registered,
            **({"register_note": self._register_note} if self._register_note else {}),
            "checksum": "wsum64 on the device" if self.options.checksums else "off",
            **({"compat_reasons": reasons} if reasons else {}),
        }
        self._commit(result, tree, entries, file_bytes)

    def _device_sync(self) -> None:
        self.device.synchronize()

    # -- emulation on CUDA: device pieces through a pinned bounce buffer ---------------------

    def _write_piece(self, fd: int, piece: layout.Piece) -> None:
        if not isinstance(piece.mem, torch.Tensor):
            super()._write_piece(fd, piece)
            return
        # Device memory (io=emulated on CUDA): copy the piece into this thread's pinned bounce
        # buffer at the file offset's misalignment and write whole blocks (the layout gives
        # every piece blocks of its own), as kvikio's POSIX path does.
        a = odirect.ALIGN
        mis = piece.file_offset % a
        span = odirect.align_up(mis + piece.length)
        buf = self._bounce_buffer(span)
        arr = buf.array
        arr[:mis] = 0
        arr[mis + piece.length : span] = 0
        dst = torch.from_numpy(arr[mis : mis + piece.length])
        dst.copy_(piece.mem[piece.start : piece.start + piece.length])
        bucket = self._buckets[piece.target]
        if bucket is not None:
            bucket.take(piece.length)
        odirect.pwrite_all(fd, memoryview(arr[:span]), piece.file_offset - mis)

    def _bounce_buffer(self, span: int) -> PinnedBuffer:
        buf = getattr(self._bounce, "buf", None)
        if buf is None or buf.nbytes < span:
            buf = PinnedBuffer(max(span, self.options.chunk_bytes + 2 * odirect.ALIGN))
            with self._bounce_lock:
                self._bounces.append(buf)
            self._bounce.buf = buf
        return buf

    # -- restore ----------------------------------------------------------------------------

    def load(self, name: str, device: str = "cpu", checksums: bool = True) -> Any:
        """Restore `name`; into CUDA memory through kvikio pread (the GDS read path) when this
        engine writes with kvikio, else through host memory like the other engines."""
        dev = torch.device(device)
        if self.io != "kvikio" or dev.type != "cuda":
            self.restore_mode, self.restore_detail = "host", {}
            return super().load(name, device, checksums)
        check_name(name)
        m = manifest.read(self.targets, name)
        layout.check_files(self.targets, m)
        kvikio = self._kvikio
        settings = self._settings()
        reasons: list[str] = []
        files: dict[int, Any] = {}
        futures: list[Any] = []
        out: dict[int, torch.Tensor] = {}
        # Tensors hashed on the host at save time (host tensors of the state) are read through
        # host memory and checked there; the rest go straight into device memory.
        host_side = [i for i, e in enumerate(m.tensors) if e.xxh3 is not None]
        with kvikio.defaults.set(settings):
            try:
                for t in m.files:
                    files[t] = self._open_cufile(layout.data_path(self.targets, m, t), "r", reasons)
                for i, e in enumerate(m.tensors):
                    if i in host_side:
                        continue
                    buf = device_empty(e.nbytes, dev)
                    out[i] = buf
                    pos = 0
                    for t, off, length in e.extents:
                        futures.append(
                            files[t].pread(
                                kvikio_buffer(buf[pos : pos + length], True), length, off
                            )
                        )
                        pos += length
            finally:
                try:
                    got = _wait_all(futures)
                    self._device_sync()
                finally:
                    for f in files.values():
                        f.close()
        want = [
            length
            for i, e in enumerate(m.tensors)
            if i not in host_side
            for _, _, length in e.extents
        ]
        if got != want:
            raise UserError(f"checkpoint {name!r}: kvikio read fewer bytes than its manifest lists")
        if checksums and m.checksums:
            for i, buf in out.items():
                layout.check_entry(self.targets, m, m.tensors[i], buf)
        if host_side:
            for i, t in zip(
                host_side,
                layout.read_tensors(self.targets, m, only=host_side, check=checksums),
                strict=True,
            ):
                out[i] = to_device(t.reshape(-1).view(torch.uint8) if t.numel() else t, dev)
        device_bytes = sum(m.tensors[i].nbytes for i in out if i not in host_side)
        self.restore_mode = self._label(reasons, device_bytes)
        self.restore_detail = {**settings, **({"compat_reasons": reasons} if reasons else {})}
        tensors = [layout.typed(out[i], e) for i, e in enumerate(m.tensors)]
        return unflatten(m.tree, tensors)


def _in(addr: int, mems: list[torch.Tensor], dev: list[bool]) -> bool:
    return any(d and m.numel() and m.data_ptr() == addr for m, d in zip(mems, dev, strict=True))


def _wait_all(futures: list[Any]) -> list[int]:
    """Bytes moved by each kvikio future, waiting for every one; then the first error, if any."""
    done: list[int] = []
    error: Exception | None = None
    for f in futures:
        try:
            done.append(f.get())
        except Exception as e:  # raised once all are done
            error = error or e
            done.append(-1)
    if error is not None:
        raise error
    return done
