"""The device ceilings, typed: every kind of ceiling a run measures (`KINDS`), what one measurement
of a kind keeps (`Measured`: every run, the configuration, the search), the ceilings measured
together before or after a sweep (`Ceilings`: per target count and for the host), a probe between
workloads (`Probe`), and all of a run's (`RunCeilings`: before, after, the probes), each with
to_json/from_json. bench.measure.ceilings.measure measures them; efficiency, the model, the
summary and the report read them through these types, never through env.json's keys.

A kind is declared once, in KINDS: its name in env.json, how reports say it, whether it is
measured per target count (the disk) or once for the host (memory), and which part of which
engines it is the ceiling of (`judges`, by the engine's traits, never by its name). Adding a kind
is an entry here plus the function that measures it (bench.measure.ceilings.measure.MEASURERS);
the measurement, env.json, the best of a run, drift, efficiency, the summary and the report
follow.

env.json keeps the shape every earlier version wrote (`per_ssd_count` of flat `{kind}_Bps`,
`{kind}_runs`, `{kind}_config`, `{kind}_search` keys, the host's at the top), so that the runs
already written read into the same numbers; only this module spells those keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from bench.common.traits import Traits

# The part of a checkpoint a ceiling judges: its write end to end (total_bytes / total_s), its
# stall where the stall is a snapshot (total_bytes / stall_s), or its restore (total_bytes /
# restore_s, the checkpoint read back from a cold page cache).
Phase = Literal["write", "snapshot", "restore"]


@dataclass(frozen=True)
class Writers:
    """A storage configuration: writers (readers, for a read kind) per target, each on its own
    part of the file, and the requests each keeps in flight (O_DIRECT; 1 when buffered)."""

    jobs: int
    iodepth: int = 1

    def describe(self, worker: str = "writer") -> str:
        return f"{self.jobs} {worker}(s)" + (f", depth {self.iodepth}" if self.iodepth > 1 else "")

    def to_json(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "iodepth": self.iodepth}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Writers:
        return cls(int(d["jobs"]), int(d.get("iodepth", 1)))


@dataclass(frozen=True)
class Tried:
    """One configuration of a search, run once."""

    writers: Writers
    Bps: float

    def to_json(self) -> dict[str, Any]:
        return {**self.writers.to_json(), "Bps": self.Bps}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Tried:
        return cls(Writers.from_json(d), d["Bps"])


@dataclass(frozen=True)
class Measured:
    """One kind of ceiling measured once: the ceiling it gives (B/s) and everything behind it."""

    # The ceiling: the best run, the search's run of the configuration kept included (a ceiling
    # is the best the device did); a probe's memory copy takes the median of its runs instead.
    Bps: float
    runs: tuple[float, ...] = ()  # every run, B/s (whole bytes per second)
    writers: Writers | None = None  # the configuration the runs used (storage)
    search: tuple[Tried, ...] = ()  # the configurations tried first, once each

    @classmethod
    def best_of(
        cls, runs: Sequence[float], writers: Writers | None = None, search: Sequence[Tried] = ()
    ) -> Measured:
        """The best of `runs` and of the search's run of the same configuration."""
        again = [t.Bps for t in search if t.writers == writers]
        return cls(max([*runs, *again]), tuple(round(r) for r in runs), writers, tuple(search))

    @classmethod
    def median_of(cls, runs: Sequence[float], writers: Writers | None = None) -> Measured:
        kept = tuple(round(r) for r in runs)
        return cls(float(np.median(kept)), kept, writers)

    def median(self) -> float:
        """What the device typically did: the median of the runs (the ceiling without them)."""
        return float(np.median(self.runs)) if self.runs else float(self.Bps)

    def to_json(self, name: str) -> dict[str, Any]:
        """env.json's keys for this measurement of kind `name`."""
        out: dict[str, Any] = {f"{name}_Bps": self.Bps}
        if self.runs:
            out[f"{name}_runs"] = list(self.runs)
        if self.writers is not None:
            out[f"{name}_config"] = self.writers.to_json()
        if self.search:
            out[f"{name}_search"] = [t.to_json() for t in self.search]
        return out

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> Measured | None:
        """The measurement of kind `name` in an env.json block; None where it has none. Its
        `{name}_median_Bps`, which versions before typed ceilings wrote, is the median of the
        runs beside it: derived again (`median`), not read."""
        v = d.get(f"{name}_Bps")
        if not isinstance(v, int | float) or isinstance(v, bool):
            return None
        config = d.get(f"{name}_config")
        return cls(
            v,
            tuple(d.get(f"{name}_runs") or ()),
            Writers.from_json(config) if isinstance(config, Mapping) else None,
            tuple(Tried.from_json(t) for t in d.get(f"{name}_search") or ()),
        )


# -- the kinds -------------------------------------------------------------------------------


def _direct_path(t: Traits) -> bool:
    return not t.page_cache


def _page_cache_path(t: Traits) -> bool:
    return t.page_cache


def _snapshots(t: Traits) -> bool:
    return t.stall == "snapshot" and not t.from_device


def _judges_none(t: Traits) -> bool:
    return False


@dataclass(frozen=True)
class Kind:
    """A kind of ceiling: what env.json calls it, how reports say it, where it is measured and
    what it judges."""

    name: str  # in env.json: {name}_Bps, {name}_runs, {name}_config, {name}_search
    label: str  # in the summary, the report and figures
    storage: bool  # measured for each target count (the disk), else once for the host (memory)
    # The part of a save it is the ceiling of, for the engines whose traits it `fits`; None: a
    # ceiling the model reads, no efficiency column.
    judges: Phase | None = None
    fits: Callable[[Traits], bool] = _judges_none
    # Where a measurement holds no run of its own of this kind, how the other kinds measured with
    # it give one (None: not at all).
    derive: Callable[[Mapping[Kind, Measured]], Measured | None] | None = None
    reads: bool = False  # a storage kind that reads files back (its workers are readers)

    def describe(self, m: Measured) -> str:
        """How the measurement of this kind ran (workers, depth), or "" where it does not say."""
        return m.writers.describe("reader" if self.reads else "writer") if m.writers else ""

    def __repr__(self) -> str:
        return f"Kind({self.name})"


def _one_writer(got: Mapping[Kind, Measured]) -> Measured | None:
    """The one-writer buffered ceiling from the buffered measurement: itself where it kept one
    writer, else its search's run of one writer."""
    b = got.get(BUFFERED_WRITE)
    if b is None:
        return None
    if b.writers is not None and b.writers.jobs == 1:
        return b
    one = [t for t in b.search if t.writers.jobs == 1]
    return Measured(one[0].Bps, (one[0].Bps,), one[0].writers) if one else None


DIRECT_WRITE = Kind("direct_write", "O_DIRECT", True, "write", _direct_path)
BUFFERED_WRITE = Kind("buffered_write", "buffered + fsync", True, "write", _page_cache_path)
# What an engine writing its one file with one thread (torch.save, safetensors) can reach
# through the page cache: the model's P1. Probes measure it; before and after the sweep it is
# the buffered search's run of one writer.
BUFFERED_WRITE_1 = Kind(
    "buffered_write_1", "buffered + fsync, one writer", True, derive=_one_writer
)
# The read ceilings: a restore through O_DIRECT (cpu-single, gds) against the first, one through
# the page cache (cpu-double, the baselines' loaders) against the second, its file's pages
# evicted first, as a restore after a restart finds them.
DIRECT_READ = Kind("direct_read", "O_DIRECT read", True, "restore", _direct_path, reads=True)
BUFFERED_READ = Kind(
    "buffered_read", "buffered read, cold cache", True, "restore", _page_cache_path, reads=True
)
D2H = Kind("d2h", "device-to-host", False, "snapshot", _snapshots)
# On CUDA, host-to-device from pinned memory: what bounds a CPU path's restore to the device
# (the model reads it; no efficiency column).
H2D = Kind("h2d", "host-to-device", False)
# A snapshot is judged against the device-to-host copy where there is one (CUDA), else this.
COPY = Kind("copy", "copy into a warm buffer", False, "snapshot", _snapshots)
SERIALIZE = Kind("serialize", "torch.save to memory", False)

# Every kind, in the order they are measured, shown, and preferred where two judge the same.
KINDS: tuple[Kind, ...] = (
    DIRECT_WRITE,
    BUFFERED_WRITE,
    BUFFERED_WRITE_1,
    DIRECT_READ,
    BUFFERED_READ,
    D2H,
    H2D,
    COPY,
    SERIALIZE,
)


def _kinds(storage: bool) -> Iterator[Kind]:
    return (k for k in KINDS if k.storage == storage)


def _read_kinds(d: Mapping[str, Any], storage: bool) -> dict[Kind, Measured]:
    out = {}
    for kind in _kinds(storage):
        m = Measured.from_json(kind.name, d)
        if m is not None:
            out[kind] = m
    return out


def _write_kinds(kinds: Mapping[Kind, Measured]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, m in kinds.items():
        out.update(m.to_json(kind.name))
    return out


def _at(kinds: Mapping[Kind, Measured], kind: Kind) -> Measured | None:
    """`kind` as measured, else as derived from the others."""
    got = kinds.get(kind)
    if got is None and kind.derive is not None:
        got = kind.derive(kinds)
    return got


# -- what a measurement holds ----------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """The storage ceilings of one target count, its targets written at once."""

    file_bytes: int | None = None  # what each target's file held
    kinds: Mapping[Kind, Measured] = field(default_factory=dict)


@dataclass(frozen=True)
class Method:
    """How the ceilings were measured, kept beside them."""

    tool: str | None = None  # the storage runs' tool: fio's version, or "builtin"
    fio: str | None = None  # fio's version where it is installed, whichever tool ran
    fio_buffers: str | None = None  # the pages fio's buffers were on
    block_bytes: int | None = None  # each write's size: the engines' chunk
    checkpoint_bytes: int | None = None  # the largest checkpoint of the sweep
    min_bytes: int | None = None  # a storage run's bytes in all: the checkpoint's, at least...
    max_bytes: int | None = None  # ... and at most these
    max_seconds: float | None = None  # a storage run issues no write after this
    repetitions: int | None = None  # runs of the configuration a search chose
    copy_threads: int | None = None  # the memory copy's threads, as the snapshot's
    queue_depth: int | None = None  # runs made before the search: their one O_DIRECT depth

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Method:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class Ceilings:
    """The ceilings measured together (before or after the sweep): the storage kinds per target
    count, the memory kinds once for the host, and how they were measured."""

    counts: Mapping[int, Count] = field(default_factory=dict)
    host: Mapping[Kind, Measured] = field(default_factory=dict)
    method: Method = Method()

    def at(self, kind: Kind, n: int | None = None) -> Measured | None:
        """The measurement of `kind` (a storage kind: over `n` targets), measured or derived."""
        if not kind.storage:
            return _at(self.host, kind)
        count = self.counts.get(n) if n is not None else None
        return _at(count.kinds, kind) if count is not None else None

    def bound(self, phase: Phase, traits: Traits, n: int) -> float | None:
        """The ceiling (B/s) of `phase` of an engine with `traits` that wrote `n` targets: that
        of the first kind that judges the phase for those traits and was measured."""
        for kind in KINDS:
            if kind.judges == phase and kind.fits(traits):
                m = self.at(kind, n)
                if m is not None and m.Bps:
                    return float(m.Bps)
        return None

    def measured(self) -> Iterator[tuple[Kind, int | None, Measured]]:
        """(kind, target count or None for the host, measurement) of what was measured (not
        what is derived), target counts first, in KINDS order."""
        for n in sorted(self.counts):
            for kind in _kinds(True):
                if kind in self.counts[n].kinds:
                    yield kind, n, self.counts[n].kinds[kind]
        for kind in _kinds(False):
            if kind in self.host:
                yield kind, None, self.host[kind]

    def chosen(self) -> dict[int, dict[Kind, Writers]]:
        """The configuration each storage ceiling settled on, per target count: what the
        ceilings after the sweep and the probes measure again, without a search."""
        return {
            n: {k: m.writers for k, m in c.kinds.items() if m.writers is not None}
            for n, c in self.counts.items()
        }

    def drift(self, after: Ceilings, tolerance: float = 0.2) -> list[str]:
        """The storage ceilings that moved by more than `tolerance` from these to `after`."""
        out = []
        for n, count in sorted(self.counts.items()):
            for kind, b in count.kinds.items():
                a = after.counts[n].kinds.get(kind) if n in after.counts else None
                if a is not None and a.Bps and b.Bps and abs(a.Bps / b.Bps - 1) > tolerance:
                    out.append(
                        f"{kind.name.replace('_', ' ')} ceiling of {n} target(s) moved from "
                        f"{b.Bps / 1e9:.2f} GB/s before the sweep to {a.Bps / 1e9:.2f} GB/s after"
                    )
        return out

    def to_json(self) -> dict[str, Any]:
        out = self.method.to_json()
        if self.counts:
            out["per_ssd_count"] = {
                str(n): {
                    **({"file_bytes": c.file_bytes} if c.file_bytes is not None else {}),
                    **_write_kinds(c.kinds),
                }
                for n, c in sorted(self.counts.items())
            }
        out.update(_write_kinds(self.host))
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Ceilings:
        per_n = d.get("per_ssd_count")
        counts = {
            int(n): Count(block.get("file_bytes"), _read_kinds(block, True))
            for n, block in (per_n.items() if isinstance(per_n, Mapping) else ())
            if isinstance(block, Mapping)
        }
        return cls(counts, _read_kinds(d, False), Method.from_json(d))


def best(*measured: Ceilings) -> Ceilings:
    """Each kind's best measurement of `measured` (for each target count), the first one's
    method and files: what efficiencies are judged against."""
    counts: dict[int, dict[Kind, Measured]] = {}
    host: dict[Kind, Measured] = {}
    files: dict[int, int | None] = {}

    def keep(into: dict[Kind, Measured], kind: Kind, m: Measured | None) -> None:
        if m is not None and (kind not in into or m.Bps > into[kind].Bps):
            into[kind] = m

    for c in measured:
        for n, count in c.counts.items():
            files.setdefault(n, count.file_bytes)
            for kind in _kinds(True):
                keep(counts.setdefault(n, {}), kind, _at(count.kinds, kind))
        for kind in _kinds(False):
            keep(host, kind, _at(c.host, kind))
    return Ceilings(
        {n: Count(files[n], kinds) for n, kinds in counts.items()},
        host,
        measured[0].method if measured else Method(),
    )


@dataclass(frozen=True)
class Probe:
    """The ceilings measured once more between a workload's warm-ups and its timed saves, over
    its targets: the configurations chosen before the sweep."""

    n_targets: int
    kinds: Mapping[Kind, Measured] = field(default_factory=dict)  # storage and host kinds
    file_bytes: int | None = None
    workload: str | None = None
    unix_time: float | None = None  # when it ended
    seconds: float | None = None  # how long it took

    def at(self, kind: Kind) -> Measured | None:
        return _at(self.kinds, kind)

    def ceilings(self) -> Ceilings:
        """The probe as ceilings of its one target count."""
        storage = {k: m for k, m in self.kinds.items() if k.storage}
        host = {k: m for k, m in self.kinds.items() if not k.storage}
        return Ceilings({self.n_targets: Count(self.file_bytes, storage)}, host)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n_targets": self.n_targets}
        if self.file_bytes is not None:
            out["file_bytes"] = self.file_bytes
        out.update(_write_kinds(self.kinds))
        for k in ("workload", "unix_time", "seconds"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Probe:
        return cls(
            int(d["n_targets"]),
            {**_read_kinds(d, True), **_read_kinds(d, False)},
            d.get("file_bytes"),
            d.get("workload"),
            d.get("unix_time"),
            d.get("seconds"),
        )


@dataclass(frozen=True)
class RunCeilings:
    """Every ceiling of a run, as env.json keeps them: before the sweep (`ceilings`), after it
    (`ceilings_after`), the probes between workloads in run order (`ceilings_probes`), and why
    they were not measured (`ceilings_error`)."""

    before: Ceilings | None = None
    after: Ceilings | None = None
    probes: tuple[Probe, ...] = ()
    error: str | None = None

    def best(self) -> Ceilings | None:
        """The ceilings efficiencies are judged against: the best of before, after and the
        probes (a ceiling is the best the device did; the disk may drift within the hour)."""
        measured = [c for c in (self.before, self.after) if c is not None]
        measured += [p.ceilings() for p in self.probes]
        return best(*measured) if measured else None

    @classmethod
    def from_env(cls, env: Mapping[str, Any]) -> RunCeilings:
        def block(key: str) -> Ceilings | None:
            d = env.get(key)
            return Ceilings.from_json(d) if isinstance(d, Mapping) and d else None

        probes = env.get("ceilings_probes") or []
        return cls(
            block("ceilings"),
            block("ceilings_after"),
            tuple(
                Probe.from_json(p) for p in probes if isinstance(p, Mapping) and "n_targets" in p
            ),
            env.get("ceilings_error"),
        )
