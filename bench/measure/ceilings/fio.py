"""The storage ceilings measured with fio: O_DIRECT (`direct=1, ioengine=libaio`) and buffered
(`direct=0, ioengine=psync`) writes to durability (`end_fsync`) of one preallocated file per
target, and the same reads of files written before (`invalidate=1`: from a cold cache), each
target's file shared by its writers (readers), each on its own part of it. fio writes from
transparent huge pages, as the engines' staging does (`fio_env`). bench.measure.ceilings.builtin
makes the same runs without fio."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence

from bench.measure.ceilings.data import make_files, remove_files


def fio_version() -> str | None:
    """fio's version string if fio is installed, else None."""
    exe = shutil.which("fio")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# glibc's tunable that advises malloc's large mappings MADV_HUGEPAGE (glibc 2.35 and newer)
MALLOC_HUGETLB = "glibc.malloc.hugetlb=1"


def _glibc_version() -> tuple[int, int] | None:
    try:
        _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()  # "glibc 2.36"
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except (ValueError, OSError, AttributeError):
        return None


def fio_env() -> tuple[dict[str, str], str]:
    """fio's environment, and the pages its write buffers come from.

    fio mallocs its buffers (its default `mem=malloc`), and glibc maps them with 4 KiB pages,
    so an O_DIRECT write of 16 MiB pins 4096 pages where the engines, writing from staging on
    transparent huge pages (bench.storage.odirect.HostBuffer), pin 8. On the development VM that alone
    held fio to 2.2 GB/s on a disk its huge-page runs wrote at 3.7 (bench/PERF.md): a ceiling
    below what the engines reach. glibc's `glibc.malloc.hugetlb=1` advises malloc's mappings
    MADV_HUGEPAGE, so fio writes from huge pages too (where THP is not `never`)."""
    from bench.measure.env import thp_mode

    env = dict(os.environ)
    glibc = _glibc_version()
    mode = thp_mode()
    if mode in (None, "never"):
        return env, f"4 KiB pages (transparent huge pages: {mode or 'unknown'})"
    if glibc is None or glibc < (2, 35):
        return env, "4 KiB pages (no glibc.malloc.hugetlb before glibc 2.35)"
    have = env.get("GLIBC_TUNABLES", "")
    if MALLOC_HUGETLB not in have.split(":"):
        env["GLIBC_TUNABLES"] = f"{have}:{MALLOC_HUGETLB}" if have else MALLOC_HUGETLB
    return env, f"transparent huge pages ({MALLOC_HUGETLB})"


def queue_depth(file_bytes: int, block: int, jobs: int, depth: int) -> int:
    """The deepest queue a writer of `file_bytes / jobs` in `block`s can keep: its blocks."""
    part = max(block, file_bytes // jobs // block * block)
    return max(1, min(depth, part // block))


def fio_write(
    targets: Sequence[str],
    file_bytes: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    caps: Sequence[int | None] | None = None,
    seconds: float | None = None,
) -> float:
    """Aggregate write bandwidth (bytes/s) of fio writing one preallocated file per target, each
    by `jobs` writers on their own part of it, to durability (`end_fsync`, counted in fio's
    runtime), from buffers on huge pages (`fio_env`); a capped target gets fio's `rate` limit,
    shared by its writers; `seconds` ends the writing early (fio's `runtime`), the bytes
    written by then counting. A writer's queue is never deeper than the blocks it has to write:
    fio allocates depth x block of buffer per writer, and 16 writers at depth 32 over 16 MiB
    blocks faulted in 8 GiB for 256 MiB of I/O (12.7 s of wall time, 21 s of system time, for
    a run whose I/O took 0.2 s)."""
    part = max(block, file_bytes // jobs // block * block)
    files = make_files(targets, part * jobs)
    try:
        return _fio("write", files, part, block, direct, jobs, depth, caps, seconds)
    finally:
        remove_files(files)


def fio_read(
    files: list[str],
    file_bytes: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    seconds: float | None = None,
) -> float:
    """Aggregate read bandwidth (bytes/s) of fio reading `files` (`data.make_read_files`), each
    by `jobs` readers on their own part of it, into buffers on huge pages; fio drops each file's
    pages before it starts (`invalidate=1`). No rate cap: the engines' restores are not paced."""
    part = max(block, file_bytes // jobs // block * block)
    return _fio("read", files, part, block, direct, jobs, depth, None, seconds)


def _fio(
    rw: str,
    files: list[str],
    part: int,
    block: int,
    direct: bool,
    jobs: int,
    depth: int,
    caps: Sequence[int | None] | None,
    seconds: float | None,
) -> float:
    """One fio run of `rw` over `files`, each by `jobs` workers of `part` bytes; its bytes/s."""
    depth = queue_depth(part * jobs, block, jobs, depth)
    cmd = [
        "fio",
        "--output-format=json",
        "--group_reporting=1",
        *(["--end_fsync=1", "--fallocate=none"] if rw == "write" else ["--invalidate=1"]),
        "--thread=1",
        *([f"--runtime={max(1, round(seconds))}"] if seconds else []),
    ]
    common = [
        f"--rw={rw}",
        f"--bs={block}",
        f"--size={part}",
        f"--numjobs={jobs}",
        f"--offset_increment={part}",
        f"--direct={int(direct)}",
        f"--ioengine={'libaio' if direct else 'psync'}",
        f"--iodepth={depth if direct else 1}",
    ]
    for i, f in enumerate(files):
        cap = caps[i] if caps else None
        rate = [f"--rate={max(1, cap // jobs)}"] if cap else []
        cmd += [f"--name=t{i}", f"--filename={f}", *common, *rate]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=fio_env()[0])
    if out.returncode:
        raise RuntimeError(f"fio failed: {out.stderr.strip()[:300]}")
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    return float(job[rw]["io_bytes"]) / (float(job[rw]["runtime"]) / 1e3)
