"""`gds`: GPUDirect Storage through kvikio's CuFile, straight from device memory.

There is no staging copy: training may not touch the tensors until their bytes are durable, so
the stall is the whole durable write (pwrite of every piece, fsync of every file, manifest).

Two I/O back ends, chosen by the `io` option:
- `kvikio`: kvikio CuFile.pwrite from the device tensors. Whether the bytes really went over GDS
  is recorded in `gds_mode`: `gds` only when kvikio uses cuFile (not its POSIX compat mode) and
  the cuFile driver reports GDS available; otherwise `compat`. Compat numbers are never GDS numbers.
- `emulated` (host-emulated, where kvikio cannot run without libcuda.so.1): O_DIRECT straight from
  the source tensors' memory, the aligned middle of each tensor in place and only the unaligned
  head and tail through a one-block bounce buffer; `gds_mode=emulated`. A non-contiguous tensor
  must be copied first; the result counts such copies in `copied_tensors`.
`auto` takes kvikio on CUDA when it imports, else the emulation.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from bench import layout, manifest
from bench.engines.base import PendingSave, register
from bench.engines.striped import StripedEngine, StripedOptions
from bench.errors import UserError


def import_kvikio() -> Any:
    """The kvikio module (tests put a fake in its place)."""
    import kvikio  # noqa: PLC0415 - optional extra

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
    """`gds` if kvikio's writes go through cuFile with GDS active, else `compat`."""
    try:
        if kvikio.defaults.is_compat_mode_preferred():
            return "compat"
        props = kvikio.cufile_driver.properties
        return "gds" if props.is_gds_available else "compat"
    except Exception:  # noqa: BLE001 - any failure to tell means we cannot claim GDS
        return "compat"


@dataclass(frozen=True, kw_only=True)
class GdsOptions(StripedOptions):
    """Knobs of the gds path, on top of the striping ones."""

    io: str = "auto"  # auto, kvikio or emulated
    allow_compat: bool = True  # if false, refuse to run when kvikio would use compat mode

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.io not in ("auto", "kvikio", "emulated"):
            raise ValueError(f"io must be auto, kvikio or emulated, got {self.io!r}")


@register
class Gds(StripedEngine):
    name = "gds"
    o_direct = True
    Options = GdsOptions

    def __init__(self, targets: list[str], **options: Any) -> None:
        super().__init__(targets, **options)
        io = self.options.io
        if io == "auto":
            io = "kvikio" if self.device.is_cuda and kvikio_unavailable() is None else "emulated"
        self.io = io
        self._kvikio = None
        if io == "kvikio":
            try:
                self._kvikio = import_kvikio()
            except ImportError as e:
                raise UserError(f"engine gds: io=kvikio but kvikio does not import ({e})") from None
            if not self.options.allow_compat and kvikio_mode(self._kvikio) != "gds":
                raise UserError(
                    "engine gds: kvikio would run in compat mode and allow_compat is false"
                )

    @classmethod
    def unavailable(cls) -> str | None:
        # The emulated back end runs anywhere O_DIRECT works; the label says what it is.
        return None

    def gds_mode(self) -> str:
        return kvikio_mode(self._kvikio) if self.io == "kvikio" else "emulated"

    def _save(self, pending: PendingSave, tree: Any, tensors: list, entries: list) -> None:
        result = pending.result
        mems = []
        for _, t in tensors:
            src = t.detach()
            if not src.is_contiguous():
                src = src.contiguous()
                result.copied_tensors += 1
            mems.append(
                src.reshape(-1).view(torch.uint8)
                if src.numel()
                else torch.empty(0, dtype=torch.uint8, device=src.device)
            )
        if self.io == "emulated":
            if any(m.device.type != "cpu" for m in mems):
                raise UserError("engine gds: io=emulated needs host tensors; use io=kvikio on CUDA")
            host = [m.numpy() for m in mems]
            pieces, file_bytes = layout.direct(
                host, entries, len(self.targets), self.options.chunk_bytes
            )
            self._persist(result, result.name, tree, entries, pieces, file_bytes, host)
        else:
            pieces, file_bytes = layout.direct(
                mems, entries, len(self.targets), self.options.chunk_bytes
            )
            self._persist_kvikio(result, tree, entries, pieces, file_bytes, mems)
        # Training may touch the tensors only now: the stall is the whole durable write.
        result.stall_s = (time.perf_counter_ns() - pending.t0_ns) / 1e9
        pending.finish_now()

    def _persist_kvikio(
        self,
        result: Any,
        tree: Any,
        entries: list[manifest.TensorEntry],
        pieces: list[layout.Piece],
        file_bytes: dict[int, int],
        mems: list[torch.Tensor],
    ) -> None:
        """Write with kvikio CuFile.pwrite from device memory, fsync, commit the manifest."""
        kvikio = self._kvikio
        name = result.name
        files: dict[int, Any] = {}
        futures: list[Any] = []
        try:
            for t in file_bytes:
                files[t] = kvikio.CuFile(
                    layout.data_file(self.targets, name, t, result.save_id), "w"
                )
            for p in pieces:
                futures.append(
                    files[p.target].pwrite(
                        p.mem[p.start : p.start + p.length], p.length, p.file_offset
                    )
                )
        finally:
            try:
                # Every issued write ends before its file closes, also after a failure: a write
                # in flight on a closed descriptor could land in whatever file reuses it.
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
        if self.options.checksums:
            # Hashing needs the bytes on the host: a device-to-host copy per tensor, timed apart.
            h0 = time.perf_counter_ns()
            for e, m in zip(entries, mems, strict=True):
                e.xxh3 = manifest.checksum(m.cpu().numpy())
            result.hash_s = (time.perf_counter_ns() - h0) / 1e9
        self._commit(result, tree, entries, file_bytes)

    def _device_sync(self) -> None:
        if self.device.is_cuda:
            self.device.synchronize()


def _wait_all(futures: list[Any]) -> list[int]:
    """Bytes written by each kvikio future, waiting for every one; then the first error, if any."""
    written: list[int] = []
    error: Exception | None = None
    for f in futures:
        try:
            written.append(f.get())
        except Exception as e:  # noqa: BLE001 - raised once all are done
            error = error or e
            written.append(-1)
    if error is not None:
        raise error
    return written
