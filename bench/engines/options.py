"""Every engine's knobs, as strict models validated like the rest of a config (bench.common.schema):
unknown keys and bad values fail with the key's path. Nothing here imports torch or an engine,
so a config is checked before anything heavy loads.

An engine names its options model in its registration line (bench/engines/registry.py); a new
engine reuses one of these or adds its own here.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import field_validator

from bench.common.schema import NonNeg, PosInt, Rate, Size, SizeOrZero, Strict

ALIGN = 4096  # O_DIRECT alignment (bench.storage.odirect.ALIGN)


# What `ckptbench tune` may search (bench.run.tune): each model's TUNABLE maps a knob to the values
# tried by default, the model's own default among them; a config's `tune:` section narrows or
# widens a range, each value checked by the model (bench.engines.registry.knob_grid).
Knobs = dict[str, tuple[Any, ...]]
MiB = 1 << 20


class NoOptions(Strict):
    """An engine without knobs."""

    TUNABLE: ClassVar[Knobs] = {}


class StripedOptions(Strict):
    """Knobs every striped data path has (gds, cpu-double, cpu-single)."""

    chunk_bytes: Size = 16 << 20  # stripe unit and largest single write
    threads_per_target: PosInt = 2  # writer threads per target
    checksums: bool = True  # per tensor, computed on the persist path, checked on load
    device: Literal["auto", "cuda", "host-emulated"] = "auto"  # where the state lives
    # Reserve each data file's full length (posix_fallocate) before writing: O_DIRECT writes
    # inside the file's size can run in parallel, where appends that extend it are serialised by
    # the filesystem (ext4 takes its inode lock exclusively for them). See bench/PERF.md.
    fallocate: bool = True
    # Write-bandwidth cap in bytes/s (emulated slower SSDs): one value for every target, or a
    # list with one per target (None: uncapped). Paced per target by a token bucket.
    max_write_bw: Rate | list[Rate | None] | None = None

    TUNABLE: ClassVar[Knobs] = {
        "threads_per_target": (1, 2, 4, 8),
        "chunk_bytes": (4 * MiB, 16 * MiB, 64 * MiB),
    }

    @field_validator("chunk_bytes")
    @classmethod
    def _aligned(cls, v: int) -> int:
        if v % ALIGN:
            raise ValueError(f"must be a multiple of {ALIGN}, got {v}")
        return v


class SnapshotOptions(StripedOptions):
    """Knobs of the CPU paths (cpu-single, cpu-double): the striping ones and the snapshot's."""

    # Bounded staging: a ring of this many chunks instead of the whole state; 0: off.
    staging_chunks: NonNeg = 0
    # Threads that copy host tensors into staging (host-emulated snapshot); 0: one per CPU, at
    # most 8. A device-to-host snapshot is a DMA and ignores it.
    copy_threads: NonNeg = 0
    # Write each chunk as soon as it is in staging, while later chunks are still being
    # copied, so that persisting overlaps the snapshot (the stall still ends at the last byte).
    # auto: on where the writes do not take cores from the copy, i.e. the snapshot is a
    # device-to-host DMA (CUDA), or the copy threads leave a core free; off where the copy
    # threads hold every core (there a write beside the copy stretched the stall by 20-60 %
    # for no gain in time to durability, bench/PERF.md).
    overlap: bool | Literal["auto"] = "auto"
    # With overlap: writes in flight while the snapshot still runs (0: no limit).
    overlap_writes: NonNeg = 1
    # O_DIRECT reads in flight per target on a restore (bench.storage.readback): a read into
    # fresh memory faults its pages in as it lands, so more reads than writers keep the disk
    # busy. 256 MiB of 64 MiB tensors, one target, side by side against the O_DIRECT read
    # ceiling: 2 threads 0.78x, 4 0.80-0.84x, 8 0.87-0.92x, 16 0.92x (bench/PERF.md). A restore
    # through the ring (to CUDA, or in place) holds one chunk per thread, plus one. cpu-double
    # reads through the page cache and ignores it. (gds reads with its writers' threads, as
    # kvikio's thread pool does.)
    read_threads_per_target: PosInt = 8
    # A restart (a restore into existing host tensors, cpu-single): O_DIRECT reads straight into
    # the tensors' memory where a chunk's bytes are one tensor's and aligned there
    # (bench.storage.readback.direct_chunks), the rest through the ring; false: every chunk
    # through the ring and a memcpy (two copies), for a side-by-side measurement.
    restore_direct: bool = True

    TUNABLE: ClassVar[Knobs] = {
        **StripedOptions.TUNABLE,
        "staging_chunks": (0, 8),  # the whole state staged, or a ring of 8 chunks
    }


class DoubleOptions(SnapshotOptions):
    """cpu-double: overlapping its buffered writes with the snapshot competes with the snapshot
    for memory bandwidth (the writes copy into the page cache), so it is off by default."""

    overlap: bool | Literal["auto"] = False


class GdsOptions(StripedOptions):
    """Knobs of the gds path, on top of the striping ones (no snapshot: the snapshot's knobs
    are refused rather than ignored)."""

    io: Literal["auto", "kvikio", "emulated"] = "auto"
    allow_compat: bool = True  # if false, a file cuFile cannot take is an error, not a fallback
    # Device pieces smaller than this go through kvikio's POSIX bounce path (kvikio's default is
    # 16 KiB); 0 sends every device byte to cuFile.
    gds_threshold: SizeOrZero = 0
    register_buffers: bool = True  # register the state's device tensors with cuFile in warm()
    # Tensors smaller than this are copied (device to device on a GPU) into one coalescing
    # buffer and written from it in chunks, instead of one small write each (0: off).
    coalesce_below: SizeOrZero = 1 << 20
    # That buffer's size (at least two chunks): one half is filled while the other is written.
    coalesce_bytes: Size = 64 << 20

    @field_validator("coalesce_bytes")
    @classmethod
    def _window(cls, v: int) -> int:
        if v % ALIGN:
            raise ValueError(f"must be a multiple of {ALIGN}, got {v}")
        return v


class DcpOptions(Strict):
    """Knobs of the dcp baseline, by default as a user tuning it runs it: DCP's DefaultStager
    with cached staging (one host copy of the state, reused across saves; pinned on CUDA),
    filled by `warm()` outside the timed region as the CPU paths fill theirs."""

    thread_count: PosInt = 2  # FileSystemWriter threads (files)
    # cached: DefaultStager(StagingOptions(...)) kept across saves; plain: async_save's default
    # (a fresh, unpinned host copy of the state inside every save's stall).
    staging: Literal["cached", "plain"] = "cached"
    # thread: DCP's default async checkpointer; process: AsyncCheckpointerType.PROCESS (the
    # writes in a separate process; needs a process group, one of one rank is made if none).
    checkpointer: Literal["thread", "process"] = "thread"

    TUNABLE: ClassVar[Knobs] = {"thread_count": (1, 2, 4, 8)}


class FastPersistOptions(Strict):
    """DeepSpeed FastPersist's knobs, by default as the issue's measurements ran it (16 MiB
    blocks, queue depth 64, 4 threads) with DeepSpeed's default 64 MiB page-locked buffer,
    double-buffered."""

    block_bytes: Size = 16 << 20  # aio block size
    queue_depth: PosInt = 64
    threads: PosInt = 4  # aio intra_op_parallelism
    buffer_bytes: Size = 64 << 20

    TUNABLE: ClassVar[Knobs] = {
        "threads": (1, 2, 4, 8),
        "buffer_bytes": (16 * MiB, 64 * MiB, 256 * MiB),
        "queue_depth": (8, 64),
    }

    @field_validator("buffer_bytes")
    @classmethod
    def _buffer(cls, v: int, info: Any) -> int:
        # double buffering splits it in two; each half must be aligned to threads x 512 bytes
        unit = 2 * 512 * info.data.get("threads", 4)
        if v % unit:
            raise ValueError(f"must be a multiple of 2 x threads x 512 = {unit}, got {v}")
        return v


class NixlOptions(Strict):
    """Knobs of the nixl peer (NVIDIA's NIXL file transfers), by default as nixlbench drives its
    POSIX backend: io_uring, 256 kernel queue entries, a pool of 65,536 I/O descriptors, files
    opened with O_DIRECT (`--storage_enable_direct`), the transfer requests busy-polled to their
    end. The backend is one of NIXL's storage plugins: POSIX through io_uring or Linux AIO on any
    host; GDS_MT and GDS (cuFile) only where CUDA is."""

    backend: Literal["posix-uring", "posix-aio", "gds-mt", "gds"] = "posix-uring"
    # Bytes of one descriptor, the size of each I/O the backend submits (nixlbench's block size)
    request_bytes: Size = 16 << 20
    # Descriptors per transfer request (nixlbench's batch size); a window's requests are all
    # posted before the first is polled
    batch: PosInt = 16
    # The registered host buffer the bytes pass through, in two halves: one is filled (or
    # emptied, on a restore) while the other's transfer is in flight. A state on a GPU written
    # with gds or gds-mt is transferred from its own registered device memory instead.
    buffer_bytes: Size = 256 << 20
    # GDS_MT's thread_count (nixlbench --gds_mt_num_threads); the POSIX backends have none
    threads: PosInt = 4
    # POSIX io queue: entries in the kernel's ring (io_uring) or context (AIO)
    kernel_queue_size: PosInt = 256

    TUNABLE: ClassVar[Knobs] = {
        "backend": ("posix-uring", "posix-aio"),
        "request_bytes": (4 * MiB, 16 * MiB, 64 * MiB),
        "batch": (4, 16, 64),
    }

    @field_validator("request_bytes")
    @classmethod
    def _request(cls, v: int) -> int:
        if v % ALIGN:
            raise ValueError(f"must be a multiple of {ALIGN} (O_DIRECT), got {v}")
        return v

    @field_validator("buffer_bytes")
    @classmethod
    def _halves(cls, v: int, info: Any) -> int:
        unit = 2 * info.data.get("request_bytes", 16 << 20)
        if v % unit:
            raise ValueError(f"must be a multiple of 2 x request_bytes = {unit}, got {v}")
        return v
