"""The CPU floor: what the work of a checkpoint must cost the host's CPUs at least, done by the
best tools, measured in the same run as the engines so that each path's CPU per GB can be read
against it (the report's host section, Figure 9).

Its parts, each in CPU-seconds for `nbytes` (per GB in `per_GB`):

- **I/O**: fio's own job CPU writing the bytes with O_DIRECT through io_uring (`bs`, `iodepth`,
  `end_fsync=1`) into a preallocated file, and reading them back the same way (its pages
  dropped first): (`usr_cpu` + `sys_cpu`) / 100 x `job_runtime`, fio's accounting of its job
  alone, so its start-up and buffer fill are left out. Without fio: the built-in O_DIRECT writer
  and reader (bench.measure.ceilings.builtin), this process's CPU time around them, and the
  floor says so (`io_tool`); where neither runs, "fio not installed" and no number.
- **copy**: one thread copying the bytes into a warm (pre-faulted) buffer: thread CPU time, the
  best of 3 after a warm-up. A snapshot path must do it once.
- **hash**: xxh3-64 over the bytes (bench.storage.checksums, the engines' host checksum):
  thread CPU time, best of 3.
- **serialize**: torch.save of tensors of the bytes into a sink that keeps nothing (its pickling,
  zip records and CRC alone: into a BytesIO its buffer's regrowth cost 3-4x more here): this
  process's CPU time, best of 3; what a path that serialises (torch.save, DCP) cannot skip.

An engine's floor is the parts its work needs (analysis.cost.floor_of): I/O, plus the copy for
a snapshot path, the hash where it checksums, the serialisation where it serialises.

Imports: bench.common, bench.storage, and bench.measure's own ceilings runners.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import IO, Any, cast

import numpy as np

from bench.storage import odirect

GB = 1e9
BLOCK = 16 << 20  # the striped paths' default chunk
DEPTH = 16
MAX_BYTES = 1 << 30  # a floor is a rate: a larger checkpoint is measured on its first GiB
NO_FIO = "fio not installed"


@dataclass(frozen=True)
class Floor:
    """The floor's parts for `nbytes`, in CPU-seconds (None: not measured, `why` says)."""

    nbytes: int
    block_bytes: int
    depth: int
    # "fio-3.33 io_uring, job CPU", "built-in O_DIRECT writer and reader, process CPU (fio not
    # installed)"; where no I/O part was measured, NO_FIO or "fio failed" (`why` says why)
    io_tool: str
    write_cpu_s: float | None
    read_cpu_s: float | None
    copy_cpu_s: float
    hash_cpu_s: float
    serialize_cpu_s: float | None
    why: str = ""

    def per_GB(self, part: str) -> float | None:
        """Part `part` (write, read, copy, hash, serialize) in CPU-seconds per GB."""
        v = getattr(self, f"{part}_cpu_s")
        return None if v is None else v / (self.nbytes / GB)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Floor:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


def fio_cpu(path: str, nbytes: int, rw: str, block: int = BLOCK, depth: int = DEPTH) -> float:
    """fio's job CPU-seconds for an O_DIRECT io_uring `rw` (write or read) of `nbytes` of
    `path` (preallocated; a write ends with fsync, a read starts with its pages dropped)."""
    from bench.measure.ceilings.fio import fio_env

    cmd = [
        "fio",
        "--output-format=json",
        "--name=floor",
        f"--filename={path}",
        f"--size={nbytes}",
        f"--rw={rw}",
        f"--bs={block}",
        "--direct=1",
        "--ioengine=io_uring",
        f"--iodepth={depth}",
        "--fallocate=none",
        *(["--end_fsync=1"] if rw == "write" else ["--invalidate=1"]),
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, check=True, env=fio_env()[0]
    )
    return job_cpu_s(out.stdout)


def job_cpu_s(fio_json: str) -> float:
    """fio's own CPU-seconds for its (first) job, from its JSON output: `usr_cpu` and `sys_cpu`
    are percentages of one CPU over `job_runtime` (ms), the job's own run, without fio's
    start-up and buffer fill."""
    job = json.loads(fio_json[fio_json.index("{") :])["jobs"][0]
    missing = [k for k in ("usr_cpu", "sys_cpu", "job_runtime") if k not in job]
    if missing:  # an fio too old to say, or not fio at all
        raise ValueError(f"fio's JSON has no {', '.join(missing)}")
    return (float(job["usr_cpu"]) + float(job["sys_cpu"])) / 100.0 * float(job["job_runtime"]) / 1e3


def fio_version() -> str | None:
    if shutil.which("fio") is None:
        return None
    out = subprocess.run(["fio", "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or None


def _io(target: str, nbytes: int, block: int, depth: int) -> tuple[str, float, float]:
    """(tool, write CPU-s, read CPU-s) of the same bytes written and read with O_DIRECT."""
    version = fio_version()
    if version is not None:
        path = os.path.join(target, ".ckptbench-floor-fio")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.posix_fallocate(fd, 0, nbytes)  # a full disk fails here, and leaves nothing
            finally:
                os.close(fd)
            w = fio_cpu(path, nbytes, "write", block, depth)
            r = fio_cpu(path, nbytes, "read", block, depth)
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return f"{version} io_uring, job CPU", w, r
    from bench.measure.ceilings.builtin import builtin_read, builtin_write
    from bench.measure.ceilings.data import make_read_files, remove_files

    t0 = time.process_time()
    builtin_write([target], nbytes, block, True, 1, depth)
    w = time.process_time() - t0
    files = make_read_files([target], nbytes, block)
    try:
        t0 = time.process_time()
        builtin_read(files, nbytes, block, True, 1, depth)
        r = time.process_time() - t0
    finally:
        remove_files(files)
    return f"built-in O_DIRECT writer and reader, process CPU ({NO_FIO})", w, r


def _best_thread_cpu(fn: Any, reps: int = 3) -> float:
    fn()  # warm-up: pages faulted, caches and code paths warm
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


class _Sink(io.RawIOBase):
    """A write-only stream that keeps nothing: torch.save's own work, no buffer to grow."""

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return memoryview(b).nbytes


def _serialize_cpu(nbytes: int, reps: int = 3) -> float:
    import torch

    state = {f"t{i}": torch.ones(max(1, nbytes // 4 // 4), dtype=torch.float32) for i in range(4)}
    best = float("inf")
    for _ in range(reps + 1):
        t0 = time.process_time()
        torch.save(state, cast(IO[bytes], _Sink()))
        best = min(best, time.process_time() - t0)
    return best


def measure(target: str, nbytes: int, block: int = BLOCK, depth: int = DEPTH) -> Floor:
    """The floor's parts for `nbytes` (at most MAX_BYTES, in 4 KiB units; the block no larger),
    the I/O in directory `target` (a target of the run: the disk the engines write)."""
    from bench.measure.ceilings.data import random_bytes
    from bench.storage import checksums

    n = max(odirect.ALIGN, min(nbytes, MAX_BYTES) // odirect.ALIGN * odirect.ALIGN)
    block = min(block, n)  # a checkpoint smaller than a block: one block of its size
    src = random_bytes(n)
    dst = odirect.HostBuffer(n)
    try:
        copy = _best_thread_cpu(lambda: np.copyto(dst.array[:n], src))
        digest = _best_thread_cpu(lambda: checksums.checksum(src))
    finally:
        dst.close()
    serialize = _serialize_cpu(n)
    try:
        tool, w, r = _io(target, n, block, depth)
        write: float | None = w
        read: float | None = r
        why = ""
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        tool = NO_FIO if fio_version() is None else "fio failed"
        write, read, why = None, None, f"{type(e).__name__}: {e}"
    return Floor(n, block, depth, tool, write, read, copy, digest, serialize, why)
