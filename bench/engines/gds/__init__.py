"""`gds`: GPUDirect Storage through kvikio's CuFile, straight from device memory.

There is no staging copy: training may not touch the tensors until their bytes are durable, so
the stall is the whole durable write (pwrite of every piece, fsync of every file, manifest).

Two I/O back ends, chosen by the `io` option:
- `kvikio`: kvikio CuFile.pwrite from the device tensors, run the way a GDS user tunes it:
  kvikio's thread pool sized to the engine's writer threads (`threads_per_target` x targets; its
  default is one thread), `task_size` = `chunk_bytes`, `gds_threshold` as set (0 by default, so
  that no device piece takes kvikio's POSIX bounce path for being small). These are kvikio's
  process-wide settings: the engine puts them in force once, when it is made and again in
  `warm()`, outside the timed region (a change of `num_threads` tears kvikio's thread pool down
  and spawns it again), and gives the old values back in `close()`. A save that finds them
  changed by someone else sets them again and says so (`settings_reset_in_save`).
  The state's device tensors are registered with cuFile in `warm()` (kvikio's memory_register,
  i.e. cuFileBufRegister), once per CUDA allocation: kvikio registers the whole allocation that
  holds a pointer, and a second registration inside it fails, so tensors that share one of
  torch's caching-allocator segments are registered together. A failure is recorded with the
  tensors it left unregistered, and the rest are still registered. Host tensors in the state (an
  optimizer's `step` scalars) are handed to kvikio as host buffers and go through its POSIX path;
  their bytes are counted apart (`host_bytes`). `fallocate` and `max_write_bw` apply as on the
  other striped engines (a capped target's pieces are handed to kvikio no faster than its cap).
  Checksums of device tensors are computed on the device by torch kernels (`wsum64`) on a side
  stream of their own, so that they neither wait for nor hold up the copies kvikio's compat path
  queues on its own streams (created with CU_STREAM_DEFAULT, which synchronise with the legacy
  default stream), and read back to the host once per save; `hash_s` says how long they took.
  `gds_mode` is decided for each save from what its files really did: `gds` only when cuFile is
  available with the nvidia-fs driver, every file was opened with kvikio's compat mode OFF (so
  cuFile registered it: kvikio's AUTO mode would fall back to POSIX per file silently), no device
  piece went below `gds_threshold`, and the bytes went GPU-direct. That last part is read from
  nvidia-fs's own counters (/proc/driver/nvidia-fs/stats, system-wide) before and after the save
  where the driver keeps them; elsewhere, and only when cufile.json allows cuFile's own compat
  mode, from a list of where GDS serves files natively (see `native_gds_reason`). The row's
  `io_detail.gds_evidence` says which of the two decided. Otherwise `compat`, with the reasons in
  the row's `io_detail`. With `allow_compat: false` a file cuFile cannot take is an error instead
  of a fallback. kvikio's errors (C++ exceptions, RuntimeError in Python) in a write or read are
  raised as OSError naming the file, so that the sweep records an error row.
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

import ctypes
import errno
import importlib
import os
import re
import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench.common.errors import UserError
from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, StateSize, check_name
from bench.engines.striped import Job, StripedEngine, batch_copy, check_into
from bench.measure import env as env_mod
from bench.storage import checksums, generations, layout, odirect
from bench.storage.plan import SavePlan
from bench.storage.staging import PinnedBuffer
from bench.storage.tree import flatten, unflatten

MiB = 1 << 20

# Where GDS serves files natively, from NVIDIA's nvidia-fs documentation ("Key Features",
# docs.nvidia.com/gpudirect-storage/nvidia_fs): "EXT4 in ordered mode on NVMe and NVMe-oF",
# "XFS on NVMe and NVMe-oF", "NFS over RDMA", and "RDMA-capable distributed file systems,
# including DDN EXAScaler [lustre], WekaFS, VAST, IBM Spectrum Scale [gpfs], and BeeGFS".
# Anywhere else (ext4 or xfs on virtio, SATA/SCSI, LVM/device-mapper or loop devices, ext4 in
# writeback or journal data mode, NFS over TCP) cuFile serves the file through POSIX.
NVME_FILESYSTEMS = ("ext4", "xfs")
DISTRIBUTED_GDS_FILESYSTEMS = ("lustre", "gpfs", "wekafs", "beegfs")

# nvidia-fs's statistics: cumulative, system-wide counters of the I/O that went GPU-direct
# (bytes only while its IO stats are enabled: `rw_stats_enabled`).
NVFS_STATS = "/proc/driver/nvidia-fs/stats"


def import_kvikio() -> Any:
    """The kvikio package with the submodules the engine uses: `import kvikio` alone does not
    make `kvikio.defaults` or `kvikio.cufile_driver` attributes of the package."""
    import kvikio  # optional extra
    import kvikio.cufile_driver
    import kvikio.defaults

    return kvikio


def _one_line(e: BaseException, limit: int = 200) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:limit]


def kvikio_load_error() -> str | None:
    """None if kvikio and its submodules import here, else why not. Any failure counts, not only
    ImportError: libkvikio loads libcufile through cuda.pathfinder, which raises its own error
    (a RuntimeError) when the library is missing."""
    try:
        import_kvikio()
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("kvikio", "libkvikio"):
            return f"kvikio is not installed ({e})"
        return f"kvikio does not load ({_one_line(e)})"
    except Exception as e:  # a library it loads is missing or broken
        return f"kvikio does not load ({_one_line(e)})"
    return None


def kvikio_unavailable() -> str | None:
    """None if kvikio imports and can do I/O here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device: kvikio needs libcuda.so.1"
    return kvikio_load_error()


def kvikio_mode(kvikio: Any) -> str:
    """`gds` if kvikio can use cuFile with the nvidia-fs driver loaded, else `compat` (a
    property of the machine; a save's own label also depends on its files, see `Gds`)."""
    return "gds" if _global_reason(kvikio) is None else "compat"


# kvikio's own reasons to prefer compat mode (its `defaults::compat_mode()` documentation and
# `is_cufile_available()`, cpp/src/shim/cufile.cpp and cpp/src/shim/utils.cpp, 26.x): compat mode
# asked for (KVIKIO_COMPAT_MODE), or in AUTO: libcufile.so.0 does not load, /run/udev is not a
# directory (a container started without `--volume /run/udev:/run/udev:ro`), or WSL (the kernel
# release names Microsoft). Python sees only the verdict (`is_compat_mode_preferred`); the
# checks are made again here, the same way, to name the reason.
RUN_UDEV = "/run/udev"
LIBCUFILE = "libcufile.so.0"


def _compat_asked(kvikio: Any) -> bool:
    """kvikio's compat mode is ON (not AUTO): asked for by KVIKIO_COMPAT_MODE or its defaults."""
    try:
        mode = kvikio.defaults.get("compat_mode")
        name = getattr(mode, "name", None) or kvikio.CompatMode(int(mode)).name
    except Exception:  # an older kvikio: the environment variable says it
        name = os.environ.get("KVIKIO_COMPAT_MODE", "").upper()
    return name == "ON"


def _libcufile_error() -> str | None:
    """None if libcufile loads the way kvikio loads it (dlopen of its soname), else why not."""
    try:
        ctypes.CDLL(LIBCUFILE)
    except OSError as e:
        return " ".join(str(e).split())[:160]
    return None


def _run_udev_readable() -> bool:
    return os.path.isdir(RUN_UDEV)


def _in_wsl() -> bool:
    return "icrosoft" in os.uname().release


def compat_reasons(kvikio: Any) -> list[str]:
    """Why kvikio prefers compat mode, by its own checks (empty: none of them holds)."""
    if _compat_asked(kvikio):
        return ["compat mode is asked for (KVIKIO_COMPAT_MODE=ON or set in kvikio.defaults)"]
    out = []
    why = _libcufile_error()
    if why is not None:
        out.append(f"{LIBCUFILE} does not load ({why})")
    if not _run_udev_readable():
        out.append(
            f"{RUN_UDEV} is not a readable directory, which cuFile needs (in a container: "
            "start it with --volume /run/udev:/run/udev:ro)"
        )
    if _in_wsl():
        out.append("running in WSL, where kvikio does not use cuFile")
    return out


def _global_reason(kvikio: Any) -> str | None:
    try:
        if kvikio.defaults.is_compat_mode_preferred():
            why = "; ".join(compat_reasons(kvikio)) or "none of its own checks says why"
            return f"kvikio prefers compat mode: {why}"
        if not kvikio.cufile_driver.properties.is_gds_available:
            return "the nvidia-fs driver is not loaded (cuFile can only do POSIX I/O)"
    except Exception as e:  # any failure to tell means we cannot claim GDS
        return f"kvikio cannot tell whether GDS is available ({_one_line(e)})"
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


def native_gds_reason(info: dict[str, Any]) -> str | None:
    """Why GDS would not serve target `info` (a row of `env.targets_info`) natively, or None.
    Only used where nvidia-fs keeps no byte counters to tell what really happened."""
    fs = info.get("fstype", "unknown")
    path = info.get("path", "?")
    disk = (info.get("block") or {}).get("disk") or (info.get("block") or {}).get("name") or "?"
    opts = set((info.get("opts") or "").split(","))
    if fs in NVME_FILESYSTEMS:
        if not disk.startswith("nvme"):
            return f"{path} is {fs} on {disk}, not on an NVMe device, which GDS does not serve"
        if fs == "ext4" and opts & {"data=writeback", "data=journal"}:
            return f"{path} is ext4 not in ordered mode, which GDS does not serve"
        return None
    if fs in ("nfs", "nfs4"):
        if "proto=rdma" in opts or "rdma" in opts:
            return None
        return f"{path} is NFS over TCP (GDS serves NFS over RDMA only)"
    if fs in DISTRIBUTED_GDS_FILESYSTEMS:
        return None
    return f"{path} is on {fs}, which GDS does not serve natively"


def nvfs_counters(path: str | None = None) -> dict[str, int] | None:
    """nvidia-fs's cumulative I/O counters, or None where its statistics file is absent.

    Keys: `write_err`, `read_err`, `pg_cache` (writes nvidia-fs sent to the page cache), and,
    while its IO statistics are enabled, `write_ops`, `write_MiB`, `read_ops`, `read_MiB`
    (the byte counts are printed in whole MiB)."""
    try:
        with open(path or NVFS_STATS) as f:
            text = f.read()
    except OSError:
        return None
    out: dict[str, int] = {}
    names = {
        "Writes": {"n": "write_ops", "writeMiB": "write_MiB", "err": "write_err"},
        "Reads": {"n": "read_ops", "readMiB": "read_MiB", "err": "read_err"},
    }
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        key = key.strip()
        if not sep or key not in names:
            continue
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z-]+)=(\d+)", rest))
        for key_name, name in names[key].items():
            if key_name in fields:
                out[name] = int(fields[key_name])
        if key == "Writes" and "pg-cache" in fields:
            out["pg_cache"] = int(fields["pg-cache"])
    return out


def nvfs_verdict(
    before: dict[str, int] | None, after: dict[str, int] | None, device_bytes: int, op: str
) -> tuple[str | None, str | None]:
    """What nvidia-fs's counters say of `device_bytes` moved by `op` (`write` or `read`)
    between two readings: (evidence, reason). `evidence` is None where they cannot tell (no
    statistics file, or its IO statistics off), else a line of what they counted; `reason` is
    why the bytes did not all go GPU-direct, or None.

    The counter is printed floored to whole MiB, so all `device_bytes` went GPU-direct only if it
    grew by at least floor(device_bytes / MiB) (floor(a + b) >= floor(a) + floor(b)); less
    means that at least 1 MiB went another way. Other processes' GDS I/O in the same interval
    counts too: the counters can wrongly confirm, never wrongly deny."""
    if before is None or after is None:
        return None, None
    key = f"{op}_MiB"
    if key not in before or key not in after:
        return None, None
    moved = after[key] - before[key]
    ops = after.get(f"{op}_ops", 0) - before.get(f"{op}_ops", 0)
    want = device_bytes // MiB
    evidence = (
        f"nvidia-fs counted {moved} MiB in {ops} {op}s GPU-direct of {want} MiB on the device"
    )
    if device_bytes and (moved < want or ops < 1):
        return evidence, f"{evidence}: cuFile moved the rest through POSIX"
    if op == "write" and after.get("pg_cache", 0) > before.get("pg_cache", 0):
        n = after["pg_cache"] - before.get("pg_cache", 0)
        return evidence, f"nvidia-fs sent {n} writes to the page cache"
    return evidence, None


# The seam where tests put a fake CUDA (tests/fake_kvikio.py): which tensors are device memory,
# how device memory is presented to kvikio, which CUDA allocation holds a tensor, and how device
# memory is allocated and filled on restore.
def on_device(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def cuda_array(mem: torch.Tensor) -> Any:
    """Device memory as kvikio takes it: a CUDA tensor has `__cuda_array_interface__`."""
    return mem


_libcuda: Any = None


def allocation_of(mem: torch.Tensor) -> tuple[int, int]:
    """(base address, bytes) of the CUDA allocation that holds `mem`'s first byte, as the
    driver reports it (cuMemGetAddressRange): the range kvikio's memory_register hands to
    cuFileBufRegister for any pointer inside it."""
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuMemGetAddressRange_v2
        fn.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]
        fn.restype = ctypes.c_int
        _libcuda = fn
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = _libcuda(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(mem.data_ptr()))
    if rc != 0:
        raise RuntimeError(f"cuMemGetAddressRange failed (CUresult {rc})")
    return base.value, size.value


def device_empty(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device)


def kvikio_buffer(mem: torch.Tensor, device: bool) -> Any:
    """What kvikio gets for a flat uint8 tensor: device memory through `cuda_array`, host memory
    as a numpy array (kvikio takes the buffer protocol, which torch tensors lack: a torch CPU
    tensor would be a TypeError)."""
    return cuda_array(mem) if device else mem.numpy()


def _io_choice(options: dict[str, Any]) -> str:
    """The back end `auto` resolves to for these options."""
    io = options.get("io", "auto")
    if io != "auto":
        return io
    dev = options.get("device", "auto")
    cuda = dev == "cuda" or (dev == "auto" and torch.cuda.is_available())
    return "kvikio" if cuda else "emulated"


def _kvikio_error(e: BaseException, path: str) -> OSError:
    """A failed kvikio I/O call (a C++ exception: RuntimeError in Python) as the OSError it is,
    naming the file, so that the sweep records an error row rather than a bug."""
    if isinstance(e, OSError):
        return e
    return OSError(errno.EIO, f"kvikio: {' '.join(str(e).split())[:300]}", path)


def coalesce_window(options: Any) -> int:
    """One half of the coalescing buffer: `coalesce_bytes` / 2 in whole chunks, at least one."""
    chunk = options.chunk_bytes
    return max(chunk, options.coalesce_bytes // 2 // chunk * chunk)


@dataclass
class Round:
    """One window of the coalesced stream: the tensors copied into the buffer for it, where,
    and the chunks then written from the buffer."""

    tensors: list[int]  # the plan's tensor indices
    starts: list[int]  # their offsets in the buffer
    pieces: list[tuple[int, int, int, int]]  # (target, file offset, buffer offset, length)
    # bound: (tensor indices, typed views of the buffer), one batch of device tensors and one
    # of host tensors (a batched copy takes its tensors from one device)
    batches: list[tuple[list[int], list[torch.Tensor]]] = field(default_factory=list)


class Coalescing:
    """Where gds puts one plan's tensors (`Gds._place`): the small ones in windows of the
    coalescing buffer (`rounds`), the others written from their own memory (`direct`), and the
    files' lengths of the coalesced part. Bound to a buffer (`bind`), once for the layout: the
    copies' destinations, the pieces and the host views hashed."""

    def __init__(
        self,
        rounds: list[Round],
        direct: list[int],
        file_bytes: dict[int, int],
        nbytes: int,
        size: int,
    ) -> None:
        self.rounds = rounds
        self.direct = direct
        self.file_bytes = file_bytes
        self.nbytes = nbytes  # tensor bytes coalesced
        self.size = size  # bytes of buffer it needs (one window, or less)
        self.buffer: torch.Tensor | None = None
        self._pieces: list[list[layout.Piece]] = []
        self._views: list[list[np.ndarray]] = []  # host buffer: each tensor's bytes, by round

    def bind(self, buffer: torch.Tensor, plan: SavePlan, device: bool, as_numpy: bool) -> None:
        """`device`: the buffer is device memory (hashed there); `as_numpy`: its pieces are
        written from a numpy view (the emulation's O_DIRECT writes take the buffer protocol)."""
        entries = plan.entries
        host = None if device else buffer.numpy()
        mem: Any = host if as_numpy and host is not None else buffer
        self._pieces, self._views = [], []
        for r in self.rounds:
            at = dict(zip(r.tensors, r.starts, strict=True))

            def batch(idx: list[int], at: dict[int, int] = at) -> tuple[list[int], list[Any]]:
                return idx, [
                    buffer[at[i] : at[i] + entries[i].nbytes]
                    .view(plan.dtypes[i])
                    .view(plan.shapes[i])
                    for i in idx
                ]

            r.batches = [
                batch(idx)
                for idx in (
                    [i for i in r.tensors if plan.cuda[i]],
                    [i for i in r.tensors if not plan.cuda[i]],
                )
                if idx
            ]
            self._pieces.append([layout.Piece(t, f, mem, at, n) for t, f, at, n in r.pieces])
            if host is not None:
                self._views.append(
                    [
                        host[s : s + entries[i].nbytes]
                        for i, s in zip(r.tensors, r.starts, strict=True)
                    ]
                )
        self.buffer = buffer

    def unbind(self) -> None:
        for r in self.rounds:
            r.batches = []
        self._pieces, self._views, self.buffer = [], [], None

    def pieces_of(self, k: int) -> list[layout.Piece]:
        return self._pieces[k]

    def hash_round(self, k: int, job: Job) -> None:
        """The checksums of window k's tensors, from the buffer: xxh3 on the host, wsum64 of
        all of them at once on the device (`checksums.segment_sums`)."""
        r = self.rounds[k]
        if self._views:
            for i, v in zip(r.tensors, self._views[k], strict=True):
                job.xxh3[i] = checksums.checksum(v)
            return
        assert self.buffer is not None
        entries = job.plan.entries
        sizes = [entries[i].nbytes for i in r.tensors]
        sums = checksums.segment_sums(self.buffer, r.starts, sizes).tolist()
        for i, (s1, s2), n in zip(r.tensors, sums, sizes, strict=True):
            job.wsum64[i] = checksums.wsum64_digest(s1, s2, n)

    def describe(self) -> dict[str, Any]:
        """For the row's io_detail: what was coalesced."""
        return {
            "coalesced_tensors": sum(len(r.tensors) for r in self.rounds),
            "coalesced_bytes": self.nbytes,
            "coalesce_rounds": len(self.rounds),
        }


@dataclass
class Writes:
    """What one gds save writes: its coalesced tensors, the pieces of the others (from their own
    memory, `mems`, by tensor index), each file's length, and which tensors are on the device."""

    co: Coalescing
    pieces: list[layout.Piece]
    file_bytes: dict[int, int]
    mems: dict[int, torch.Tensor]
    dev: list[bool]


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
        self._kvikio: Any = None
        # CUDA allocation base -> (a tensor inside it, the allocation's bytes), as registered
        self._registered: dict[int, tuple[torch.Tensor, int]] = {}
        self._registered_ptrs: dict[int, int] = {}  # registered tensor address -> its base
        self._register_failed: list[tuple[str, str]] = []  # (tensor path, why)
        self._register_note = ""
        self._kv_before: dict[str, Any] | None = None  # kvikio's settings before this engine's
        self._hash_stream: Any = None
        self._coalesce: Coalescing | None = None  # of the plan (bench.storage.plan)
        self._cbuf: torch.Tensor | None = None  # the coalescing buffer
        self._cbuf_bytes = 0
        self._cbuf_host: odirect.HostBuffer | None = None  # its memory when on the host
        self._kvikio_pinned = 0  # kvikio's compat bounce buffers, derived (`_derived_pinned`)
        self._bounce = threading.local()
        self._bounces: list[PinnedBuffer] = []
        self._bounce_lock = threading.Lock()
        self.restore_mode = "none"
        self.restore_detail: dict[str, Any] = {}
        if self.io == "kvikio":
            why = kvikio_load_error()
            if why is not None:
                raise UserError(f"engine gds: io=kvikio but {why}")
            self._kvikio = import_kvikio()
            if not self.options.allow_compat and kvikio_mode(self._kvikio) != "gds":
                raise UserError(
                    "engine gds: kvikio would run in compat mode and allow_compat is false "
                    f"({_global_reason(self._kvikio)})"
                )
            self._fs_reasons = self._filesystem_reasons()
            self._ensure_settings()

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        if _io_choice(options or {}) != "kvikio":
            return None  # the emulation runs anywhere O_DIRECT works; the label says what it is
        why = kvikio_load_error()
        if why is not None:
            return (
                f"{why}: on CUDA gds writes device memory through kvikio "
                "(pip install -e '.[gds]'); engine_options.gds.io: emulated runs a host "
                "emulation instead (gds_mode=emulated, not GDS)"
            )
        return None

    def gds_mode(self) -> str:
        if self.io != "kvikio":
            return "emulated"
        return kvikio_mode(self._kvikio)

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """No staging but the coalescing buffer (at most `coalesce_bytes`, or the state, in
        device memory on CUDA with the checksums' temporaries beside it: 4 words of 8 bytes
        for each of `checksums.SEGMENT_WORDS`). Through kvikio: its bounce buffers
        (`bounce_buffer_size`, 16 MiB by default, per thread, in compat mode) and restores
        straight into device memory; the emulation on CUDA: a pinned bounce buffer per writer
        thread."""
        threads = options.threads_per_target * size.targets
        base = super().memory_plan(size, options)
        coalesce = 0
        if options.coalesce_below and size.tensors and size.smallest < options.coalesce_below:
            both = 2 * coalesce_window(options)
            coalesce = min(both, size.nbytes + size.tensors * layout.TENSOR_ALIGN)
        device = coalesce + (32 * checksums.SEGMENT_WORDS if coalesce and options.checksums else 0)
        kvikio = size.cuda and options.io in ("auto", "kvikio")
        if kvikio:
            return MemoryPlan(
                staging=threads * (16 << 20),
                staging_device=device,
                restore_device=size.nbytes,
                in_place_host=0,
            )
        bounce = threads * (options.chunk_bytes + 2 * odirect.ALIGN) if size.cuda else 0
        return MemoryPlan(
            staging=bounce + (0 if size.cuda else coalesce),
            staging_device=device if size.cuda else 0,
            pinned=size.cuda,
            restore_host=base.restore_host,
            restore_device=base.restore_device,
            in_place_host=base.in_place_host,
        )

    # -- kvikio settings and files ----------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        """kvikio's runtime settings for this engine's I/O."""
        return {
            "num_threads": self.options.threads_per_target * len(self.targets),
            "task_size": self.options.chunk_bytes,
            "gds_threshold": self.options.gds_threshold,
        }

    def _ensure_settings(self) -> bool:
        """Put this engine's kvikio settings in force, setting only those that differ (a new
        `num_threads` rebuilds kvikio's thread pool); True if any had to change. The values
        found the first time are given back by `close()`."""
        defaults = self._kvikio.defaults
        want = self._settings()
        have = {k: defaults.get(k) for k in want}
        changed = {k: v for k, v in want.items() if have[k] != v}
        if not changed:
            return False
        if self._kv_before is None:
            self._kv_before = have
        defaults.set(changed)
        return True

    def _restore_settings(self) -> None:
        if self._kv_before is not None:
            before, self._kv_before = self._kv_before, None
            self._kvikio.defaults.set(before)

    def _filesystem_reasons(self) -> list[str]:
        """Why GDS would not serve a target natively (`native_gds_reason`): used to label a
        save only where nvidia-fs keeps no byte counters, and only when cufile.json allows
        cuFile's own compat mode."""
        out = []
        for info in env_mod.targets_info(self.targets)["targets"]:
            why = native_gds_reason(info)
            if why:
                out.append(why)
        return out

    def _open_cufile(self, path: str, flags: str, reasons: list[str]) -> Any:
        """A CuFile for `path`. Opened with compat mode OFF, so that it either uses cuFile or
        fails; on failure (and with allow_compat) opened again through POSIX, with the reason
        appended to `reasons`: the fallback kvikio's AUTO mode would make silently. OFF is
        asked for only where kvikio says cuFile works: without a CUDA driver kvikio 26.10's
        CuFile spins forever opening a file with compat mode OFF."""
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
        try:
            with kv.defaults.set("compat_mode", kv.CompatMode.ON):
                return kv.CuFile(path, flags)
        except RuntimeError as e:  # kvikio's open failures are RuntimeErrors
            raise _kvikio_error(e, path) from None

    def _label(
        self,
        reasons: list[str],
        device_bytes: int,
        nvfs_before: dict[str, int] | None,
        op: str,
    ) -> tuple[str, str]:
        """(label, evidence) of a save or restore: `compat` if anything in `reasons`, if no
        device bytes, or if the bytes did not go GPU-direct: by nvidia-fs's counters where it
        keeps them, else by the filesystem list (only when cufile.json allows compat mode)."""
        if device_bytes == 0:
            reasons.append("no tensor was in device memory: nothing went over GDS")
        evidence, why = nvfs_verdict(nvfs_before, nvfs_counters(), device_bytes, op)
        if evidence is not None:
            if why:
                reasons.append(why)
        else:
            evidence = (
                "filesystem list: no nvidia-fs statistics"
                if nvfs_before is None
                else "filesystem list: nvidia-fs IO statistics are off (rw_stats_enabled)"
            )
            if _cufile_allows_compat(self._kvikio) and self._fs_reasons:
                reasons.extend(f"cufile.json allows compat mode and {r}" for r in self._fs_reasons)
        return ("compat" if reasons else "gds"), evidence

    # -- buffer registration ----------------------------------------------------------------

    def warm(self, state: Any) -> None:
        """Put kvikio's settings in force and register the state's device memory with cuFile
        (kvikio memory_register), as GDS users are told to for buffers used again and again;
        outside the timed region. kvikio registers the whole CUDA allocation holding a pointer
        and refuses a second registration inside it, so each allocation is registered once,
        for all the tensors in it; a failure is recorded with the tensors it left out, and the
        other allocations are still registered. First the state's plan and its coalescing
        buffer are made (registered with the rest)."""
        self.wait_idle()
        plan, _, _ = self._plan_for(state)
        self._bound_coalesce(plan)
        if self.io != "kvikio":
            return
        self._ensure_settings()
        if not self.options.register_buffers:
            return
        self._deregister()
        kv = self._kvikio
        if kv.defaults.is_compat_mode_preferred():
            self._register_note = "not registered: kvikio is in compat mode"
            return
        _, tensors = flatten(state)
        if self._cbuf is not None and on_device(self._cbuf):
            tensors = [*tensors, ("(the coalescing buffer)", self._cbuf)]
        groups: dict[int, tuple[int, torch.Tensor, list[str]]] = {}
        failed: list[tuple[str, str]] = []
        ptr_of = {path: t.data_ptr() for path, t in tensors}
        for path, t in tensors:
            # A non-contiguous tensor is copied at save time: its copy is not registered.
            if not (on_device(t) and t.numel() and t.is_contiguous()):
                continue
            mem = t.detach().reshape(-1).view(torch.uint8)
            try:
                base, size = allocation_of(mem)
            except Exception as e:  # kvikio's register would fail the same way
                failed.append((path, _one_line(e)))
                continue
            if base in groups:
                groups[base][2].append(path)
            else:
                groups[base] = (size, mem, [path])
        register = _memory_fn(kv, "memory_register")
        for base, (size, mem, paths) in groups.items():
            try:
                register(kvikio_buffer(mem, True))
            except Exception as e:  # registration only helps: go on without it, and say so
                failed.extend((p, _one_line(e)) for p in paths)
                continue
            self._registered[base] = (mem, size)
            for p in paths:
                self._registered_ptrs[ptr_of[p]] = base
        self._register_failed = failed
        self._register_note = ""
        if failed:
            first = "; ".join(f"{p}: {why}" for p, why in failed[:3])
            self._register_note = f"{len(failed)} tensors not registered ({first})"[:400]

    def _deregister(self) -> None:
        self._registered_ptrs.clear()
        self._register_failed = []
        if not self._registered:
            return
        deregister = _memory_fn(self._kvikio, "memory_deregister")
        for mem, _ in self._registered.values():
            try:
                deregister(kvikio_buffer(mem, True))
            except Exception:  # the buffers are released with the engine anyway
                pass
        self._registered.clear()

    def _deregister_buffer(self, buf: torch.Tensor) -> None:
        """Before the coalescing buffer is freed: its registration goes, and with it that of
        the tensors sharing its allocation (`warm()` registers them again)."""
        if buf.numel() and buf.data_ptr() in self._registered_ptrs:
            self._deregister()

    def release(self) -> None:
        """Free what the engine holds between saves: the coalescing buffer, and the cuFile
        registrations with the views of the state they keep (a state released here must not
        stay in device memory while the next one is built); `warm()` makes them again."""
        super().release()
        self._free_coalesce_buffer()
        if self._kvikio is not None:
            self._deregister()

    def close(self) -> None:
        super().close()
        self._free_coalesce_buffer()
        if self._kvikio is not None:
            self._deregister()
            self._restore_settings()
        with self._bounce_lock:
            for b in self._bounces:
                b.close()
            self._bounces.clear()

    @property
    def pinned_bytes(self) -> int:
        """The emulation's pinned bounce buffers; through kvikio, what its compat path pins,
        derived from its settings (`kvikio_pinned`), once a save went through it."""
        return sum(b.nbytes for b in self._bounces) + self._kvikio_pinned

    def _derived_pinned(self) -> int:
        """kvikio's compat path stages device bytes through pinned bounce buffers, one per task
        running at once and kept in a pool once made: num_threads x bounce_buffer_size (16 MiB
        unless KVIKIO_BOUNCE_BUFFER_SIZE says otherwise). Derived from its settings: kvikio
        does not report what it holds."""
        defaults = self._kvikio.defaults
        try:
            size = int(defaults.get("bounce_buffer_size"))
        except Exception:  # an older kvikio: its documented default
            size = 16 << 20
        return int(defaults.get("num_threads")) * size

    # -- save -------------------------------------------------------------------------------

    def _place(self, plan: SavePlan, tensors: list[torch.Tensor]) -> None:
        """Coalesce the small tensors, as a GDS user with many of them would: every tensor
        under `coalesce_below` is copied (device to device, at HBM speed on a GPU) into one
        buffer of `coalesce_bytes` and written from there in chunks, where thousands of small
        writes would each pay a cuFile call and a file system round trip (on the emulation, an
        O_DIRECT write each: 170 us a 4 KiB tensor here). They are packed as the snapshot
        engines pack staging (64-byte aligned, chunks dealt round-robin), in windows of the
        buffer's halves that no tensor straddles: one half is filled while the other is
        written. The file of each target holds its coalesced chunks first, then the other
        tensors, written from their own memory (`layout.direct`, placed at every save: their
        addresses decide it)."""
        entries, chunk, n = plan.entries, self.options.chunk_bytes, len(self.targets)
        below = self.options.coalesce_below
        window = coalesce_window(self.options)
        # (a tensor larger than a half of the buffer is written from its own memory)
        small = [i for i, e in enumerate(entries) if 0 < e.nbytes < below and e.nbytes <= window]
        offsets, pos = [], 0
        for i in small:
            nb = entries[i].nbytes
            pos = -(-pos // layout.TENSOR_ALIGN) * layout.TENSOR_ALIGN
            if pos // window != (pos + nb - 1) // window:
                pos = (pos // window + 1) * window  # start the next window: none straddles
            offsets.append(pos)
            pos += nb
        pieces, file_bytes = layout.packed(
            np.empty(0, dtype=np.uint8), pos, [entries[i] for i in small], offsets, n, chunk
        )
        rounds = [Round([], [], []) for _ in range(-(-pos // window))]
        for i, off in zip(small, offsets, strict=True):
            k = off // window
            rounds[k].tensors.append(i)
            rounds[k].starts.append(off - k * window + (k % 2) * window)
        for p in pieces:
            k = p.start // window
            rounds[k].pieces.append(
                (p.target, p.file_offset, p.start - k * window + (k % 2) * window, p.length)
            )
        chosen = set(small)
        direct = [i for i in range(len(entries)) if i not in chosen]
        if self._coalesce is not None:
            self._coalesce.unbind()
        size = pos if len(rounds) < 2 else 2 * window
        self._coalesce = Coalescing(
            rounds, direct, file_bytes, sum(entries[i].nbytes for i in small), size
        )

    def _save(self, pending: PendingSave, job: Job) -> None:
        result, tensors, plan = job.result, job.tensors, job.plan
        co = self._bound_coalesce(plan)
        if any(plan.cuda) and not self.device.is_cuda:
            raise UserError("engine gds: io=emulated on device tensors needs device: cuda")
        dev = [on_device(t) for t in tensors] if self.device.is_cuda else [False] * len(tensors)
        if any(dev):
            # kvikio orders its writes after the legacy default stream only (its GDS path
            # synchronises it, its compat streams wait on it): a state produced on another
            # stream, as under torch.cuda.stream(s), must be done before the first pwrite, or
            # stale bytes reach the file while the checksums, which wait for that stream, sum
            # the new ones. The same for the emulation's bounce copies from writer threads.
            self.device.wait_current_stream()
        # The other tensors are written from their own memory; a strided one from a copy.
        mems: dict[int, torch.Tensor] = {}
        for i in co.direct:
            src = tensors[i].detach()
            if not src.is_contiguous():
                src = src.contiguous()
                result.copied_tensors += 1
            mems[i] = src.reshape(-1).view(torch.uint8)
        srcs = [mems[i] if dev[i] or self.io != "emulated" else mems[i].numpy() for i in co.direct]
        entries = plan.entries
        pieces, _ = layout.direct(
            srcs,
            [entries[i] for i in co.direct],
            len(self.targets),
            self.options.chunk_bytes,
            start=co.file_bytes,
        )
        assert plan.table is not None
        plan.table.update(co.direct)  # their extents follow their addresses
        file_bytes = dict(co.file_bytes)
        for p in pieces:
            file_bytes[p.target] = max(
                file_bytes.get(p.target, 0), odirect.align_up(p.file_offset + p.length)
            )
        if self.io == "emulated":
            self._persist_emulated(job, Writes(co, pieces, file_bytes, mems, dev))
            result.extra = {
                "io": "emulated",
                "device_bytes": sum(entries[i].nbytes for i, d in enumerate(dev) if d),
            }
        else:
            self._persist_kvikio(job, Writes(co, pieces, file_bytes, mems, dev))
        result.extra.update(co.describe())
        result.pinned_bytes = self.pinned_bytes
        # Training may touch the tensors only once save() returns: the stall is the whole
        # durable write.
        pending.finish_now()

    def _bound_coalesce(self, plan: SavePlan) -> Coalescing:
        """The plan's Coalescing with its buffer made and its destinations bound: device memory
        on CUDA (registered with cuFile in `warm()`), else pre-faulted host memory."""
        co = self._coalesce
        assert co is not None, "a plan is placed before it is bound"
        if co.buffer is None and co.size:
            if self._cbuf is None or self._cbuf_bytes < co.size:
                self._free_coalesce_buffer()
                if self.device.is_cuda:
                    raw = device_empty(co.size + odirect.ALIGN, self.device.torch_device)
                    skip = (-raw.data_ptr()) % odirect.ALIGN
                    self._cbuf = raw[skip : skip + co.size]
                else:
                    host = odirect.HostBuffer(co.size, prefault=True)
                    self._cbuf_host = host
                    self._cbuf = torch.frombuffer(host.mapping, dtype=torch.uint8, count=co.size)
                self._cbuf_bytes = co.size
            cuda = self.device.is_cuda
            co.bind(self._cbuf, plan, cuda, self.io == "emulated" and not cuda)
        return co

    def _free_coalesce_buffer(self) -> None:
        if self._coalesce is not None:
            self._coalesce.unbind()
        if self._cbuf is not None:
            self._deregister_buffer(self._cbuf)
        self._cbuf, self._cbuf_bytes = None, 0
        if self._cbuf_host is not None:
            self._cbuf_host.close()
            self._cbuf_host = None

    def _coalesced_rounds(self, job: Job, co: Coalescing, write_round: Any) -> None:
        """Each window in turn: its tensors copied into its half of the buffer (device to device
        on a GPU), its chunks handed to `write_round(pieces)`, which returns a wait for them,
        its checksums computed while they are written; the next window is copied into the other
        half meanwhile, and a half is reused once its writes are done."""
        tensors, cuda = job.tensors, self.device.is_cuda
        waits: list[Any] = []
        try:
            for k, r in enumerate(co.rounds):
                if k >= 2:
                    waits[k - 2]()  # this half's last writes are done
                for idx, dsts in r.batches:
                    batch_copy(dsts, [tensors[i] for i in idx], cuda)
                if cuda:
                    self._device_sync()
                waits.append(write_round(co.pieces_of(k)))
                if self.options.checksums:
                    h0 = time.perf_counter_ns()
                    co.hash_round(k, job)
                    job.result.hash_s += (time.perf_counter_ns() - h0) / 1e9
        finally:
            for w in waits[max(0, len(waits) - 2) :]:
                w()

    def _persist_emulated(self, job: Job, w: Writes) -> None:
        """O_DIRECT from the tensors' own memory and from the coalescing buffer, as the kvikio
        path writes (the emulation of gds: never GDS numbers)."""
        co, pieces, file_bytes, mems, dev = w.co, w.pieces, w.file_bytes, w.mems, w.dev
        fds = self.writer.open(job.result, file_bytes)
        futures: list[Future] = []

        def write_round(round_pieces: list[layout.Piece]) -> Any:
            fs = self.writer.submit(fds, round_pieces, self._write_piece)
            futures.extend(fs)
            return lambda: [f.result() for f in fs]

        try:
            futures += self.writer.submit(fds, pieces, self._write_piece)
            self._coalesced_rounds(job, co, write_round)
            if self.options.checksums:
                h0 = time.perf_counter_ns()
                for i in co.direct:
                    self._hash_one(job, i, mems[i] if dev[i] else mems[i].numpy())
                job.result.hash_s += (time.perf_counter_ns() - h0) / 1e9
            self.writer.prepare_manifest(job, file_bytes)  # while the last writes run
        except BaseException:
            self.writer.close(fds, futures)
            raise
        self.writer.drain(job, fds, futures, file_bytes)

    def _hash_one(self, job: Job, i: int, view: Any) -> None:
        """Device memory (a tensor here: io=emulated on CUDA) is hashed where it is, by torch
        kernels (wsum64); host memory (a numpy array) with xxh3."""
        if isinstance(view, torch.Tensor):
            job.wsum64[i] = checksums.device_checksum(view)
        else:
            job.xxh3[i] = checksums.checksum(view)

    def _side_stream(self) -> Any:
        """The stream the device checksums run on: a torch side stream (non-blocking with
        respect to the legacy default stream, as torch creates its streams), or None where the
        engine's device is not a CUDA device of torch's."""
        if self.device.torch_device.type != "cuda":
            return None
        if self._hash_stream is None:
            self._hash_stream = torch.cuda.Stream(device=self.device.torch_device)
        return self._hash_stream

    def _hash_kvikio(
        self, job: Job, idx: list[int], mems: dict[int, torch.Tensor], dev: list[bool]
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

    def _persist_kvikio(self, job: Job, w: Writes) -> None:
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
        nvfs_before = nvfs_counters()

        def issue(p: layout.Piece) -> None:
            self.writer.pace(p.target, p.length)
            buf = kvikio_buffer(p.mem[p.start : p.start + p.length], id(p.mem) in device_mem)
            try:
                f = files[p.target].pwrite(buf, p.length, p.file_offset)
            except RuntimeError as e:
                raise _kvikio_error(e, paths[p.target]) from None
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
                    written[k] = _wait_all([f], [paths[issued[k].target]])[0]

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
                issuers = [
                    self.writer.pool.submit(lambda ps: [issue(p) for p in ps], ps)
                    for ps in order.values()
                ]
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
                got = _wait_all([f for _, f in left], [paths[issued[k].target] for k, _ in left])
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
            p.length
            for p in issued
            if id(p.mem) in device_mem and p.length < settings["gds_threshold"]
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
        unregistered = sum(
            m.numel() for m in written_from if m.data_ptr() not in self._registered_ptrs
        )
        result.extra = {
            "io": "kvikio",
            "kvikio": getattr(self._kvikio, "__version__", None),
            **settings,
            **({"settings_reset_in_save": True} if reset else {}),
            "compat_mode": "OFF (fallback ON per file)" if self.options.allow_compat else "OFF",
            "files": len(file_bytes),
            "device_bytes": device_bytes,
            "host_bytes": sum(entries[i].nbytes for i in co.direct if not dev[i]),
            "registered_bytes": sum(self._registered[b][1] for b in registered),
            "unregistered_device_bytes": unregistered,
            **({"register_note": self._register_note} if self._register_note else {}),
            "checksum": "wsum64 on the device" if self.options.checksums else "off",
            **(
                {"pinned_bytes_derived": "num_threads x bounce_buffer_size (kvikio's settings)"}
                if self._kvikio_pinned
                else {}
            ),
            "gds_evidence": evidence,
            **({"compat_reasons": reasons} if reasons else {}),
        }
        self.writer.commit(job, file_bytes)

    def _device_sync(self) -> None:
        self.device.synchronize()

    # -- emulation on CUDA: device pieces through a pinned bounce buffer ---------------------

    def _write_piece(self, fd: int, piece: layout.Piece) -> None:
        if not isinstance(piece.mem, torch.Tensor):
            self.writer.write(fd, piece)
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
        self.writer.pace(piece.target, piece.length)
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

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        """Restore `name`; into CUDA memory through kvikio pread (the GDS read path) when this
        engine writes with kvikio, else through host memory like the other engines. `into`: a
        state whose tensors the bytes are read into, in place (through kvikio, the contiguous
        device tensors straight into their memory)."""
        dev = torch.device(device)
        dst: list[torch.Tensor] | None = None
        if into is not None:
            dst = [t for _, t in flatten(into)[1]]
            dev = next((t.device for t in dst if on_device(t)), dev)
        if self.io != "kvikio" or dev.type != "cuda":
            self.restore_mode, self.restore_detail = "host", {}
            return super().load(name, device, checksums, into)
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
        nvfs_before = nvfs_counters()
        try:
            for t in m.files:
                files[t] = self._open_cufile(layout.data_path(self.targets, m, t), "r", reasons)
            for i, e in enumerate(m.tensors):
                if i in host_side:
                    continue
                buf = (
                    dst[i].detach().reshape(-1).view(torch.uint8)
                    if dst is not None and on_device(dst[i]) and dst[i].is_contiguous()
                    else device_empty(e.nbytes, dev)
                )
                out[i] = buf
                pos = 0
                for t, off, length in e.extents:
                    path = layout.data_path(self.targets, m, t)
                    try:
                        futures.append(
                            files[t].pread(
                                kvikio_buffer(buf[pos : pos + length], True), length, off
                            )
                        )
                    except RuntimeError as err:
                        raise _kvikio_error(err, path) from None
                    where.append(path)
                    pos += length
        finally:
            try:
                got = _wait_all(futures, where)
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
        device_bytes = sum(m.tensors[i].nbytes for i in out)
        self.restore_mode, evidence = self._label(reasons, device_bytes, nvfs_before, "read")
        if self.restore_mode == "compat" and device_bytes:
            self._kvikio_pinned = max(self._kvikio_pinned, self._derived_pinned())
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
        self.restore_detail = {
            **settings,
            **({"settings_reset_in_restore": True} if reset else {}),
            "gds_evidence": evidence,
            **({"compat_reasons": reasons} if reasons else {}),
        }
        tensors = [layout.typed(out[i], e) for i, e in enumerate(m.tensors)]
        if dst is not None:
            for t, got in zip(dst, tensors, strict=True):
                if got.numel() and t.data_ptr() != got.data_ptr():
                    t.copy_(got)  # read elsewhere: a host tensor, or a strided device one
            return into
        return unflatten(m.tree, tensors)


def _wait_all(futures: list[Any], paths: list[str]) -> list[int]:
    """Bytes moved by each kvikio future (None: never issued, counted -1), waiting for every
    one; then the first error, if any, as an OSError naming its file."""
    done: list[int] = []
    error: OSError | None = None
    for f, path in zip(futures, paths, strict=True):
        if f is None:
            done.append(-1)
            continue
        try:
            done.append(f.get())
        except (RuntimeError, OSError) as e:  # raised once all are done
            error = error or _kvikio_error(e, path)
            done.append(-1)
    if error is not None:
        raise error
    return done


def kvikio_info() -> dict[str, Any]:
    """kvikio and cuFile versions and the mode kvikio would use; absent when it cannot load. The
    engine's block of the environment (env.json `kvikio`), registered in bench.engines."""
    if not torch.cuda.is_available():
        return {"available": False, "reason": "no CUDA device (kvikio needs libcuda.so.1)"}
    why = kvikio_load_error()  # any failure to load, not only ImportError
    if why is not None:
        return {"available": False, "reason": why}
    kvikio = import_kvikio()
    counters = nvfs_counters()
    info: dict[str, Any] = {
        "available": True,
        "version": getattr(kvikio, "__version__", None),
        "mode": kvikio_mode(kvikio),
        # where a save's gds label comes from: nvidia-fs's byte counters, or the filesystem list
        "nvidia_fs_stats": "absent"
        if counters is None
        else "bytes counted"
        if "write_MiB" in counters
        else "IO statistics off",
    }

    def props() -> Any:
        return kvikio.cufile_driver.properties

    for key, fn in [
        ("compat_mode", lambda: getattr(kvikio.defaults.get("compat_mode"), "name", None)),
        ("num_threads", lambda: kvikio.defaults.get("num_threads")),
        ("task_size", lambda: kvikio.defaults.get("task_size")),
        ("gds_threshold", lambda: kvikio.defaults.get("gds_threshold")),
        ("libcufile_version", lambda: kvikio.cufile_driver.libcufile_version()),
        ("nvidia_fs_available", lambda: bool(props().is_gds_available)),
        ("nvidia_fs_version", lambda: f"{props().major_version}.{props().minor_version}"),
        ("cufile_allow_compat_mode", lambda: bool(props().allow_compat_mode)),
    ]:
        try:
            info[key] = fn()
        except Exception as e:  # record, never fail the run for it
            info[key] = f"unknown ({type(e).__name__})"
    return info
