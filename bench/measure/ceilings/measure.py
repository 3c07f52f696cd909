"""How each kind of ceiling is measured, and when: before and after the sweep (`measure`, given
its `Options`), the configurations chosen before measured again after it (a disk's speed can
drift within the hour), and between a workload's warm-ups and its timed saves (`probe`).

- Storage, for N targets written at once, one file each of the checkpoint's per-target share
  (at least `min_bytes` in all, to reach steady state, and at most `max_bytes`, each run cut
  off after `max_seconds`: a probe's cost does not grow with the checkpoint, and its rate is
  a rate once steady state is reached), **preallocated as the engines preallocate** and filled
  with random bytes:
  - O_DIRECT: a small search over writers per target (1, 2, 4; each its own part of the file)
    and queue depth (8, 16, 32), with fio (`direct=1, ioengine=libaio`) when it is installed,
    else the built-in runs (threads with pwrite: depth is the thread count); both write from
    transparent huge pages, as the engines' staging does (`fio.fio_env`);
  - buffered write ended by fsync (fio `direct=0, ioengine=psync, end_fsync=1`), writers 1, 2, 4;
  - the same two reads, of files of random bytes written first (untimed) with O_DIRECT: O_DIRECT
    read (fio `rw=read, direct=1, ioengine=libaio`) over the same search, and buffered read of
    a cold file (its pages evicted before each run; fio `invalidate=1`), readers 1, 2, 4. No
    rate cap: the engines' restores are not paced.
  The best configuration of the search is then run `repetitions` times; the ceiling is the best
  run (every run and the search are kept). Which tool ran is recorded.
- Memory: a copy into a warm buffer with the snapshot's own mechanism (8 MiB pieces from one
  queue over `copy_threads` threads), of the checkpoint's size up to PROBE_COPY_BYTES; on CUDA
  also a device-to-host copy into exactly pinned memory and a host-to-device copy from it. Best
  of 5 after a warm-up copy; every run kept.
- Serialisation (the baselines' own ceiling): torch.save of a state of the checkpoint's tensor
  size into memory, no disk: what a torch.save-based path cannot exceed before its write.

Bandwidths are bytes per second, measured as bytes / wall time to durability. Each kind of
bench.measure.ceilings.types.KINDS has its function here (`MEASURERS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from bench.common.devices import Device
from bench.measure.ceilings import types as ceiling_types
from bench.measure.ceilings.builtin import builtin_read, builtin_write
from bench.measure.ceilings.data import make_read_files, remove_files
from bench.measure.ceilings.fio import fio_env, fio_read, fio_version, fio_write, queue_depth
from bench.measure.ceilings.memory import (
    COPY_REPS,
    copy_bandwidth,
    d2h_bandwidth,
    h2d_bandwidth,
    serialize_bandwidth,
)
from bench.measure.ceilings.types import (
    BUFFERED_READ,
    BUFFERED_WRITE,
    BUFFERED_WRITE_1,
    COPY,
    D2H,
    DIRECT_READ,
    DIRECT_WRITE,
    H2D,
    SERIALIZE,
    Ceilings,
    Count,
    Kind,
    Measured,
    Method,
    Probe,
    Tried,
    Writers,
)

DIRECT_SEARCH = [(j, q) for j in (1, 2, 4) for q in (8, 16, 32)]  # (writers per target, depth)
BUFFERED_SEARCH = [(j, 1) for j in (1, 2, 4)]  # the defaults of bench.config.sweep.CeilingSpec
PROBE_COPY_BYTES = 1 << 30  # the largest copy a ceiling or a probe measures
# A storage run writes at most this much in all, and stops issuing writes after MAX_SECONDS
# (then fsyncs): the defaults of bench.config.sweep.CeilingSpec.
MAX_BYTES = 4 << 30
MAX_SECONDS = 10.0
# Runs of each page-cache write a probe takes; it keeps the best (a ceiling is the best the
# device does). On a VM with a balloon one buffered write runs at either ~0.6 or ~1.4 GB/s
# (bench/PERF.md): one run alone put the model's page-cache rate 2x off. The O_DIRECT write
# varies less: one run.
PROBE_RUNS = 2


def probe_bytes(checkpoint_bytes: int, min_bytes: int, max_bytes: int) -> int:
    """What a storage run writes in all: the checkpoint, at least `min_bytes` (steady state),
    at most `max_bytes` (a cost that does not grow with the checkpoint)."""
    return min(max(checkpoint_bytes, min_bytes), max(max_bytes, min_bytes))


# -- each kind's measurement -------------------------------------------------------------------

# fio_write or builtin_write: (targets, file_bytes, block, direct, jobs, depth, caps, seconds)
Write = Callable[..., float]
# fio_read or builtin_read: (files, file_bytes, block, direct, jobs, depth, seconds)
Read = Callable[..., float]
READS = tuple(k for k in ceiling_types.KINDS if k.reads)


class ReadFiles:
    """The files the read kinds of one session read: written (untimed) at the first read run of
    the session, read by every one after it, and removed when the `with` block that holds them
    ends. The cache is this object's, not the session's: a `Session` is frozen and holds it."""

    def __init__(self, targets: Sequence[str], share: int, block: int) -> None:
        self.targets = tuple(targets)
        self.share = share
        self.block = block
        self._files: list[str] | None = None

    def get(self) -> list[str]:
        """The files, written first if this is their first read."""
        if self._files is None:
            self._files = make_read_files(self.targets, self.share, self.block)
        return self._files

    def remove(self) -> None:
        if self._files is not None:
            remove_files(self._files)
            self._files = None

    def __enter__(self) -> ReadFiles:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


@dataclass(frozen=True, kw_only=True)
class Session:
    """What the measurer of each kind gets: where and how this measurement runs."""

    write: Write  # the storage runs' tool
    read: Read  # the read kinds' tool
    device: Device
    targets: tuple[str, ...]  # written at once, one file each (a storage kind's)
    share: int  # each target's file
    block: int  # each write
    nbytes: int  # the checkpoint's bytes
    caps: tuple[int | None, ...] | None = None  # each target's write cap
    drop: Callable[[], object] | None = None  # empties the page cache before each storage run
    repetitions: int = 3  # runs of the configuration a search chose
    max_seconds: float | None = MAX_SECONDS  # a storage run issues no write after this
    copy_threads: int = 1
    tensor_bytes: int = 64 << 20
    grids: Mapping[Kind, Sequence[Writers]] = field(default_factory=dict)  # what is searched
    chosen: Mapping[Kind, Writers] = field(default_factory=dict)  # run again, no search
    # A probe between workloads: the chosen configurations only, once (the page-cache writes
    # PROBE_RUNS times), the copy the median of 3 into buffers kept in `keep` (the caller's,
    # released by bench.measure.ceilings.memory.release), no serialisation.
    probe: bool = False
    keep: dict[int, Any] | None = None
    progress: Callable[[str], object] | None = None  # called after each storage run
    reads: bool = True  # measure the read kinds
    files: ReadFiles | None = None  # what the read kinds read (a storage session's)

    def run(self, kind: Kind, direct: bool, w: Writers) -> float:
        """One storage run of `kind` (B/s), the page cache emptied first where it can be."""
        files = None
        if kind in READS:
            if self.files is None:
                raise RuntimeError(f"{kind.name}: this session has no files to read")
            files = self.files.get()
        if self.drop:
            self.drop()
        if files is not None:
            bw = self.read(
                files, self.share, self.block, direct, w.jobs, w.iodepth, self.max_seconds
            )
        else:
            bw = self.write(
                self.targets,
                self.share,
                self.block,
                direct,
                w.jobs,
                w.iodepth,
                self.caps,
                self.max_seconds,
            )
        if self.progress:
            self.progress(
                f"{kind.name.replace('_', ' ')} x{len(self.targets)}: {bw / 1e9:.2f} GB/s"
            )
        return bw


def _storage(s: Session, kind: Kind, direct: bool, probe_runs: int) -> Measured | None:
    """Before and after the sweep: a search over the kind's grid once each (when it has more
    than one configuration), then the best configuration `repetitions` times, or the chosen
    one alone. In a probe: the chosen configuration `probe_runs` times (none chosen: None)."""
    chosen = s.chosen.get(kind)
    if s.probe:
        if chosen is None:
            return None
        return Measured.best_of(
            [round(s.run(kind, direct, chosen)) for _ in range(probe_runs)], chosen
        )
    configs = [chosen] if chosen else list(s.grids[kind])
    if direct:  # a depth beyond a writer's blocks is the same run: measured once, as it ran
        configs = list(
            dict.fromkeys(
                Writers(w.jobs, queue_depth(s.share, s.block, w.jobs, w.iodepth)) for w in configs
            )
        )
    search = []
    if len(configs) > 1:
        search = [Tried(w, round(s.run(kind, direct, w))) for w in configs]
        writers = max(search, key=lambda t: t.Bps).writers
    else:
        writers = configs[0]
    runs = [s.run(kind, direct, writers) for _ in range(s.repetitions)]
    return Measured.best_of(runs, writers, search)


def direct_write(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """O_DIRECT writes (fio `direct=1, ioengine=libaio`)."""
    return _storage(s, DIRECT_WRITE, True, 1)


def buffered_write(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """Buffered writes ended by fsync (fio `direct=0, ioengine=psync, end_fsync=1`), the best
    of PROBE_RUNS in a probe."""
    return _storage(s, BUFFERED_WRITE, False, PROBE_RUNS)


def buffered_write_1(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """Buffered writes by one writer, in a probe: what torch.save and safetensors are (the same
    runs as `buffered_write` where that kept one writer). Before and after the sweep the
    buffered search's run of one writer stands for it (BUFFERED_WRITE_1.derive): None."""
    b = got.get(BUFFERED_WRITE)
    if not s.probe or b is None:
        return None
    if b.writers is not None and b.writers.jobs == 1:
        return b
    one = Writers(1)
    runs = [round(s.run(BUFFERED_WRITE_1, False, one)) for _ in range(PROBE_RUNS)]
    return Measured.best_of(runs, one)


def direct_read(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """O_DIRECT reads (fio `rw=read, direct=1, ioengine=libaio`) of files written before."""
    return _storage(s, DIRECT_READ, True, 1) if s.reads else None


def buffered_read(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """Buffered reads of files whose pages were evicted first (fio `direct=0, ioengine=psync,
    invalidate=1`), the best of PROBE_RUNS in a probe."""
    return _storage(s, BUFFERED_READ, False, PROBE_RUNS) if s.reads else None


def _memory(s: Session, runs: Callable[[int, int], list[float]]) -> Measured:
    """A memory ceiling of the checkpoint's size up to PROBE_COPY_BYTES: the best of COPY_REPS,
    or in a probe the median of 3; `runs(nbytes, reps)` measures it."""
    each = min(s.nbytes, PROBE_COPY_BYTES)
    if s.probe:
        return Measured.median_of(runs(each, 3))
    return Measured.best_of(runs(each, COPY_REPS))


def copy(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """A copy into a warm host buffer by the snapshot's mechanism and threads."""
    return _memory(s, lambda n, reps: copy_bandwidth(n, reps, s.copy_threads, s.keep))


def d2h(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """On CUDA, a device-to-host copy into exactly pinned memory; elsewhere none."""
    if not s.device.is_cuda:
        return None
    return _memory(s, lambda n, reps: d2h_bandwidth(n, s.device, reps))


def h2d(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """On CUDA, a host-to-device copy from exactly pinned memory; elsewhere none."""
    if not s.device.is_cuda:
        return None
    return _memory(s, lambda n, reps: h2d_bandwidth(n, s.device, reps))


def serialize(s: Session, got: Mapping[Kind, Measured]) -> Measured | None:
    """torch.save into memory, best of 3, before and after the sweep only (on these machines it
    is several times the disk: a probe leaves it out)."""
    if s.probe:
        return None
    return Measured.best_of(serialize_bandwidth(min(s.nbytes, 256 << 20), s.tensor_bytes))


# How each kind of ceiling_types.KINDS is measured (tests/test_ceilings.py checks that
# every kind has its measurer): the function, given the session and what was measured before it
# with the same targets, returns the measurement or None (not here, not in a probe).
MEASURERS: dict[Kind, Callable[[Session, Mapping[Kind, Measured]], Measured | None]] = {
    DIRECT_WRITE: direct_write,
    BUFFERED_WRITE: buffered_write,
    BUFFERED_WRITE_1: buffered_write_1,
    DIRECT_READ: direct_read,
    BUFFERED_READ: buffered_read,
    D2H: d2h,
    H2D: h2d,
    COPY: copy,
    SERIALIZE: serialize,
}
# The storage kinds searched before the sweep and their default grids, (writers per target,
# depth): the config's `ceilings.direct_search` and `ceilings.buffered_jobs` replace them.
GRIDS: dict[Kind, list[tuple[int, int]]] = {
    DIRECT_WRITE: DIRECT_SEARCH,
    BUFFERED_WRITE: BUFFERED_SEARCH,
    DIRECT_READ: DIRECT_SEARCH,
    BUFFERED_READ: BUFFERED_SEARCH,
}
# A read kind searches the grid given for its write kind where none is given for itself.
SEARCHED_AS = {DIRECT_READ: DIRECT_WRITE, BUFFERED_READ: BUFFERED_WRITE}


def _grid(kind: Kind, grids: Mapping[Kind, Sequence[Sequence[int]]]) -> Sequence[Sequence[int]]:
    """The (writers, depth) configurations searched for `kind`: given, else given for the write
    kind it searches as, else the default."""
    as_ = SEARCHED_AS.get(kind)
    return grids.get(kind) or (grids.get(as_) if as_ else None) or GRIDS[kind]


def _measure_kinds(s: Session, storage: bool) -> dict[Kind, Measured]:
    """Every kind of the storage (or host) ones, in KINDS order, each given those before it.
    KINDS is read from its module at each call, never bound here: a test plants a kind there."""
    got: dict[Kind, Measured] = {}
    for kind in ceiling_types.KINDS:
        if kind.storage == storage:
            m = MEASURERS[kind](s, got)
            if m is not None:
                got[kind] = m
    return got


@dataclass(frozen=True, kw_only=True)
class Options:
    """What `measure` measures and how: every kind of KINDS, the storage ones for each count of
    `ssd_counts` (the first that many `targets` written at once, each capped at its `caps`).

    Each storage run writes the checkpoint's bytes, at least `min_bytes` and at most
    `max_bytes` in all, in writes of `block`, and stops issuing writes after `max_seconds`;
    with fio where `use_fio` and fio is installed, else the built-in runs. `drop` (if given)
    empties the page cache before each storage run; `progress(label)` is called after each
    (`storage_runs` says how many there are). `configs` (an earlier measurement's
    `Ceilings.chosen()`) are measured again without a search; `grids` ((writers, depth) per
    searched kind) replace the default ones (GRIDS). `reads`: measure the read kinds too."""

    targets: Sequence[str]
    ssd_counts: Sequence[int]
    checkpoint_bytes: int
    block: int
    device: Device
    use_fio: bool = True
    drop: Callable[[], object] | None = None
    caps: Sequence[int | None] | None = None
    repetitions: int = 3
    min_bytes: int = 1 << 30
    copy_threads: int = 1
    tensor_bytes: int = 64 << 20
    configs: Mapping[int, Mapping[Kind, Writers]] | None = None
    grids: Mapping[Kind, Sequence[Sequence[int]]] | None = None
    max_bytes: int = MAX_BYTES
    max_seconds: float | None = MAX_SECONDS
    progress: Callable[[str], object] | None = None
    reads: bool = True

    def __post_init__(self) -> None:
        # Frozen all the way down where it is ours to freeze: the caller's lists become tuples.
        object.__setattr__(self, "targets", tuple(self.targets))
        object.__setattr__(self, "ssd_counts", tuple(self.ssd_counts))
        if self.caps is not None:
            object.__setattr__(self, "caps", tuple(self.caps))

    def storage_bytes(self) -> int:
        """What each storage run writes (reads) in all, over its targets."""
        return probe_bytes(self.checkpoint_bytes, self.min_bytes, self.max_bytes)

    def storage_runs(self) -> int:
        """How many storage runs `measure` makes: per SSD count, for each searched kind (the reads
        only if `reads`) the search (when its grid, `grids` or the default, has more than one
        configuration and no `configs` are given) and the repetitions of the chosen one."""
        searched = self.configs is None
        n = 0
        for kind in GRIDS:
            if kind in READS and not self.reads:
                continue
            grid = len(_grid(kind, self.grids or {}))
            n += (grid if searched and grid > 1 else 0) + self.repetitions
        return n * len(set(self.ssd_counts))


def measure(o: Options) -> Ceilings:
    """All ceilings for a run, as `o` says: every kind of KINDS, the storage ones per SSD
    count."""
    installed = fio_version()  # recorded whichever tool runs
    version = installed if o.use_fio else None
    base = Session(
        write=fio_write if version else builtin_write,
        read=fio_read if version else builtin_read,
        device=o.device,
        targets=tuple(o.targets),
        share=0,
        block=o.block,
        nbytes=o.checkpoint_bytes,
        drop=o.drop,
        repetitions=o.repetitions,
        max_seconds=o.max_seconds,
        copy_threads=o.copy_threads,
        tensor_bytes=o.tensor_bytes,
        grids={kind: [Writers(*c) for c in _grid(kind, o.grids or {})] for kind in GRIDS},
        progress=o.progress,
        reads=o.reads,
    )
    total = o.storage_bytes()
    counts = {}
    for n in sorted(set(o.ssd_counts)):
        share = max(o.block, -(-total // n) // o.block * o.block)
        with ReadFiles(o.targets[:n], share, o.block) as files:
            s = dataclasses.replace(
                base,
                targets=tuple(o.targets[:n]),
                share=share,
                caps=tuple(o.caps[:n]) if o.caps else None,
                chosen=(o.configs or {}).get(n, {}),
                files=files,
            )
            counts[n] = Count(share, _measure_kinds(s, storage=True))
    method = Method(
        tool=version or "builtin",
        fio=installed,
        fio_buffers=fio_env()[1] if version else None,
        block_bytes=o.block,
        checkpoint_bytes=o.checkpoint_bytes,
        min_bytes=o.min_bytes,
        max_bytes=o.max_bytes,
        max_seconds=o.max_seconds,
        repetitions=o.repetitions,
        copy_threads=o.copy_threads,
    )
    return Ceilings(counts, _measure_kinds(base, storage=False), method)


def probe(
    targets: Sequence[str],
    nbytes: int,
    block: int,
    device: Device,
    configs: Mapping[Kind, Writers],
    *,
    use_fio: bool = True,
    drop: Callable[[], object] | None = None,
    caps: Sequence[int | None] | None = None,
    copy_threads: int = 1,
    keep: dict[int, Any] | None = None,
    max_bytes: int = MAX_BYTES,
    max_seconds: float | None = MAX_SECONDS,
) -> Probe:
    """The ceilings again, once, inside a sweep: the configurations chosen before the sweep
    (`configs`, for these targets), plus the page-cache path with a single writer (what
    torch.save and safetensors are) and the copy ceiling (median of 3, of at most 1 GiB,
    buffers reused through `keep`); `nbytes` in all, as the checkpoint. The model predicts each
    workload's rows from the probes around it, so that a disk that drifts 2x within the hour
    drifts in the model too. One run of O_DIRECT (write, then read), the best of PROBE_RUNS of
    each page-cache write and read (every run kept). (Serialisation is left to the ceilings
    before and after: on these machines it is several times the disk.) The storage runs are
    bounded as `measure`'s are (`max_bytes`, `max_seconds`)."""
    fio = use_fio and fio_version()
    share = max(block, -(-min(nbytes, max_bytes) // len(targets)) // block * block)
    # At most PROBE_COPY_BYTES of copy: its buffers stay allocated through the sweep.
    with ReadFiles(targets, share, block) as files:
        s = Session(
            write=fio_write if fio else builtin_write,
            read=fio_read if fio else builtin_read,
            device=device,
            targets=tuple(targets),
            share=share,
            block=block,
            nbytes=nbytes,
            caps=tuple(caps) if caps is not None else None,
            drop=drop,
            max_seconds=max_seconds,
            copy_threads=copy_threads,
            chosen=configs,
            probe=True,
            keep=keep,
            files=files,
        )
        measured = {**_measure_kinds(s, storage=True), **_measure_kinds(s, storage=False)}
    return Probe(len(targets), measured, share)
