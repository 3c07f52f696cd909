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

from bench.engines.gds.coalesce import coalesce_window
from bench.engines.gds.cuda import kvikio_buffer
from bench.engines.gds.engine import Gds
from bench.engines.gds.environment import kvikio_info
from bench.engines.gds.kvikio_lib import (
    _global_reason,
    _memory_fn,
    compat_reasons,
    import_kvikio,
    kvikio_load_error,
    kvikio_mode,
    kvikio_unavailable,
)
from bench.engines.gds.labels import native_gds_reason, nvfs_counters, nvfs_verdict

__all__ = [
    "Gds",
    "_global_reason",
    "_memory_fn",
    "coalesce_window",
    "compat_reasons",
    "import_kvikio",
    "kvikio_buffer",
    "kvikio_info",
    "kvikio_load_error",
    "kvikio_mode",
    "kvikio_unavailable",
    "native_gds_reason",
    "nvfs_counters",
    "nvfs_verdict",
]
