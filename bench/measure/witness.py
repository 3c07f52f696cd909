"""The block device as a witness: did a save's bytes and a cache flush reach the device, did a
restore read its bytes from it.

"Durable" in a row is otherwise what the code under test did (its fsync calls, in the right
order). Here the harness asks the block layer instead: Linux counts, per block device, the
sectors read and written and the flush requests it completed (`/sys/block/<dev>/stat`, fields
documented in the kernel's Documentation/block/stat.rst; sectors are 512 bytes whatever the
device's block size; flush requests are fields 16-17 since kernel 5.5), and says whether the
device keeps a volatile write cache (`queue/write_cache`: "write back" or "write through") and
honours FUA (`queue/fua`).

The devices behind a target (`Chain`): the device its file system sits on (a partition is read
as its disk: the kernel counts flush requests on the whole disk), then what that device is made
of, down to the devices with nothing below them (`leaves`): device-mapper and md devices through
`slaves/`, a loop device through the device holding its backing file. A target on tmpfs, a
network or FUSE file system (no block device: st_dev has major 0), or on devices whose stat
cannot be read, has no witness, and says why.

A save is judged (`Judge.save`) on the counters read right before save() and right when it is
durable, against the sizes of the checkpoint's files (data and manifest) on each device:
- `yes`: every device the files sit on, and the leaves below it together, received at least
  those bytes, and every device with a write-back cache that counts flushes received at least
  one flush request after the save began;
- `no: <why>`: fewer bytes reached a device than the files hold there, or no flush reached a
  write-back device;
- `unavailable: <why>`: no block device, or no counters to read.
Other traffic on the same devices can only add to the counts, so `no` is conclusive and `yes`
is necessary, not sufficient: a flush that another writer (or the file system's own journal
commit) sent in the same interval counts too, a flush before the data counts as one after it,
and a disk that acknowledges a flush it did not make is beyond any host-side check.

Device-mapper and md devices pass flushes down without counting them as flush requests, so
flushes are asked of request-based devices only (disks, loop devices): the ones that hold a
cache.

A restore (`Judge.restore`) is judged on the bytes read from the devices while the timed load
ran, against the files' sizes: `yes` when at least those bytes were read, else `no: <why>`
(the restore read from memory: the page cache was not dropped, or something kept it).

The harness's clock (bench.measure.clock) reads the counters before save(), when it returns
(`return_witness`: what a tool that stops its clock there saw) and when the save is durable:
three reads of a small sysfs file per device and save, about 0.3 ms in all here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import psutil

from bench.common import sizes

SECTOR = 512  # the unit of every sector count in /sys/block/*/stat (Documentation/block/stat.rst)
FLUSH_FIELDS = 17  # a stat line that counts flush requests (kernel 5.5 and later) has 17 fields

YES = "yes"


@dataclass(frozen=True)
class Stat:
    """The counters of one block device that the witness reads: bytes read and written since
    boot, and flush requests completed (None: the kernel's stat has no flush fields)."""

    read_bytes: int
    written_bytes: int
    flushes: int | None


def parse_stat(text: str) -> Stat:
    """One /sys/block/<dev>/stat line: fields 3 (sectors read), 7 (sectors written) and 16
    (flush requests completed, where the line has it). ValueError on a line that is none."""
    f = text.split()
    if len(f) < 11 or not all(x.isdigit() for x in f):
        raise ValueError(f"not a block device stat line: {text.strip()[:80]!r}")
    flushes = int(f[15]) if len(f) >= FLUSH_FIELDS else None
    return Stat(int(f[2]) * SECTOR, int(f[6]) * SECTOR, flushes)


@dataclass(frozen=True)
class Device:
    """One block device behind a target: its name (`vda`, `loop3`, `dm-0`), its sysfs folder
    (/sys/block/<name>), whether its write cache is volatile (`write_cache`: "write back",
    "write through" or "" where unreadable), whether it honours FUA (`fua`) and whether its
    stat counts flush requests (`counts_flushes`: request-based devices on kernels that count
    them; device-mapper and md pass flushes down uncounted)."""

    name: str
    path: str
    write_cache: str
    fua: bool | None
    counts_flushes: bool

    @property
    def write_back(self) -> bool:
        return self.write_cache == "write back"

    def read(self) -> Stat:
        with open(os.path.join(self.path, "stat")) as f:
            return parse_stat(f.read())

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "write_cache": self.write_cache,
            "fua": self.fua,
            "counts_flushes": self.counts_flushes,
        }


@dataclass(frozen=True)
class Chain:
    """The devices behind one target: `top` (the file system's device; a partition read as its
    disk), `leaves` (what it is made of, down to devices with nothing below; `[top]` for a plain
    disk), `middle` (the devices on the way between them: device-mapper and md layers, loop
    devices), and `why` (empty, or why the target has no witness: then top is None)."""

    target: str
    st_dev: int
    top: Device | None
    leaves: tuple[Device, ...] = ()
    middle: tuple[Device, ...] = ()
    why: str = ""

    @property
    def devices(self) -> tuple[Device, ...]:
        """Every device of the chain, each once."""
        if self.top is None:
            return ()
        seen: dict[str, Device] = {self.top.name: self.top}
        for d in (*self.middle, *self.leaves):
            seen.setdefault(d.name, d)
        return tuple(seen.values())

    def to_json(self) -> dict[str, object]:
        if self.top is None:
            return {"witness": f"unavailable: {self.why}"}
        return {
            "witness": "available",
            "top": self.top.to_json(),
            "middle": [d.to_json() for d in self.middle],
            "leaves": [d.to_json() for d in self.leaves],
        }


def mount_of(path: str) -> dict[str, str]:
    """Mount point, filesystem type, source and options of the mount holding `path`."""
    best = {"mount": "/", "fstype": "unknown", "source": "unknown", "opts": ""}
    real = os.path.realpath(path)
    for p in psutil.disk_partitions(all=True):
        mp = p.mountpoint
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best["mount"]):
            best = {"mount": mp, "fstype": p.fstype, "source": p.device, "opts": p.opts}
    return best


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _device(sys_root: str, name: str) -> Device:
    path = os.path.join(sys_root, "block", name)
    fua = _read(os.path.join(path, "queue", "fua"))
    stat = _read(os.path.join(path, "stat"))
    request_based = not (name.startswith("dm-") or name.startswith("md"))
    return Device(
        name=name,
        path=path,
        write_cache=_read(os.path.join(path, "queue", "write_cache")),
        fua=None if fua == "" else fua == "1",
        counts_flushes=request_based and len(stat.split()) >= FLUSH_FIELDS,
    )


def _disk_of(sys_root: str, dev: int) -> str | None:
    """The name of the disk that holds block device `dev` (a partition's parent disk)."""
    link = os.path.join(sys_root, "dev", "block", f"{os.major(dev)}:{os.minor(dev)}")
    if not os.path.exists(link):
        return None
    real = os.path.realpath(link)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    return os.path.basename(real)


def _below(
    sys_root: str, name: str, depth: int = 0
) -> tuple[list[str], list[str]]:  # (middle, leaves)
    """What device `name` is made of: (the devices on the way, the devices with nothing below)."""
    if depth > 16:
        raise ValueError(f"{name}: devices nested more than 16 deep")
    base = os.path.join(sys_root, "block", name)
    below: list[str] = []
    slaves = os.path.join(base, "slaves")
    if os.path.isdir(slaves):
        for s in sorted(os.listdir(slaves)):
            # a slave may be a partition: read it as its disk, as for the top
            real = os.path.realpath(os.path.join(slaves, s))
            if os.path.exists(os.path.join(real, "partition")):
                real = os.path.dirname(real)
            below.append(os.path.basename(real))
    backing = _read(os.path.join(base, "loop", "backing_file"))
    if backing:
        try:
            st = os.stat(backing.removesuffix(" (deleted)"))
        except OSError as e:
            raise ValueError(
                f"{name}: its backing file {backing} cannot be read ({e.strerror})"
            ) from None
        disk = _disk_of(sys_root, st.st_dev)
        if disk is None:
            raise ValueError(f"{name}: its backing file {backing} is on no block device")
        below.append(disk)
    if not below:
        return [], [name]
    middle, leaves = [], []
    for b in dict.fromkeys(below):
        m, lv = _below(sys_root, b, depth + 1)
        middle += m
        leaves += lv
    return [name, *middle], leaves


def chain(target: str, sys_root: str = "/sys") -> Chain:
    """The devices behind `target` (a directory or file), read from sysfs under `sys_root`."""
    st = os.stat(target)
    if os.major(st.st_dev) == 0:
        fs = mount_of(target)["fstype"]
        return Chain(
            target, st.st_dev, None, why=f"{fs} at {target} has no block device of its own"
        )
    top = _disk_of(sys_root, st.st_dev)
    if top is None:
        return Chain(
            target,
            st.st_dev,
            None,
            why=f"no sysfs entry for device {os.major(st.st_dev)}:{os.minor(st.st_dev)}",
        )
    try:
        middle, leaves = _below(sys_root, top)
    except ValueError as e:
        return Chain(target, st.st_dev, None, why=str(e))
    made = {n: _device(sys_root, n) for n in dict.fromkeys([top, *middle, *leaves])}
    for d in made.values():
        try:
            d.read()
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) else str(e)
            return Chain(target, st.st_dev, None, why=f"{d.name}: stat unreadable ({why})")
    return Chain(
        target,
        st.st_dev,
        made[top],
        tuple(made[n] for n in dict.fromkeys(leaves)),
        tuple(made[n] for n in dict.fromkeys(middle) if n != top),
    )


@functools.lru_cache(maxsize=256)
def _cached_chain(target: str, st_dev: int, sys_root: str) -> Chain:
    return chain(target, sys_root)


def chains(targets: Iterable[str], sys_root: str = "/sys") -> list[Chain]:
    """The chain of each target, resolved once per target and device (sysfs walks are cached;
    a target remounted on another device is resolved again)."""
    out = []
    for t in targets:
        try:
            dev = os.stat(t).st_dev
        except OSError as e:
            out.append(Chain(t, -1, None, why=f"{t}: {e.strerror}"))
            continue
        out.append(_cached_chain(t, dev, sys_root))
    return out


@dataclass(frozen=True)
class Counters:
    """The counters of every device of some chains at one moment (`read`)."""

    stats: Mapping[str, Stat]

    @staticmethod
    def read(devices: Iterable[Device]) -> Counters:
        return Counters({d.name: d.read() for d in devices})


@dataclass(frozen=True)
class Verdict:
    """A judgement: `text` is `yes`, `no: <why>` or `unavailable: <why>` (the row's column);
    the bytes and flushes the devices counted in the interval (None: unavailable)."""

    text: str
    bytes: int | None = None
    flushes: int | None = None

    @property
    def denied(self) -> bool:
        return self.text.startswith("no")


def _pair(got: int, need: int) -> str:
    """'64MiB of the checkpoint's 256MiB', in bytes where the two would read the same."""
    a, b = sizes.format_size(got), sizes.format_size(need)
    if got and abs(need - got) < need / 100:  # close: the short forms would read alike
        a, b = f"{got:,} B", f"{need:,} B"
    return f"{a} of the checkpoint's {b}"


@dataclass
class Judge:
    """The witness of one save or restore over an engine's targets: `begin()` right before the
    call, `end()` right when it is over (durable, or loaded), then `save(files)` or
    `restore(files)` with the checkpoint's files. A counter that cannot be read makes the
    verdict `unavailable`, never an error of the save."""

    targets: list[str]
    sys_root: str = "/sys"
    _chains: list[Chain] = field(default_factory=list, init=False)
    _before: Counters | None = field(default=None, init=False)
    _after: Counters | None = field(default=None, init=False)
    _failed: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self._chains = chains(self.targets, self.sys_root)

    @property
    def unavailable(self) -> str:
        """Why there is no witness ('' when every target has one and its counters were read)."""
        if not self._chains:
            return "no targets"
        return "; ".join(c.why for c in self._chains if c.top is None) or self._failed

    def devices(self) -> tuple[Device, ...]:
        seen: dict[str, Device] = {}
        for c in self._chains:
            for d in c.devices:
                seen.setdefault(d.name, d)
        return tuple(seen.values())

    def _tops(self) -> list[Device]:
        """The file systems' devices, each once."""
        return list({c.top.name: c.top for c in self._chains if c.top is not None}.values())

    def _read(self) -> Counters | None:
        if self.unavailable:
            return None
        try:
            return Counters.read(self.devices())
        except (OSError, ValueError) as e:
            self._failed = f"counters unreadable ({e})"
            return None

    def begin(self) -> None:
        """Read every device's counters: the moment the interval starts."""
        self._before, self._after = self._read(), None

    def end(self) -> None:
        """Read them again: the moment the interval ends (else the verdict reads them)."""
        self._after = self._read()

    def read(self) -> Counters | None:
        """The counters now, for a verdict on an interval that ends here (`save(files, at)`)."""
        return self._read()

    def _delta(self, at: Counters | None = None) -> dict[str, Stat]:
        assert self._before is not None, "begin() first"
        after = at or self._after or Counters.read(self.devices())
        out = {}
        for n, a in after.stats.items():
            b = self._before.stats[n]
            fl = None if a.flushes is None or b.flushes is None else a.flushes - b.flushes
            out[n] = Stat(a.read_bytes - b.read_bytes, a.written_bytes - b.written_bytes, fl)
        return out

    def _by_top(self, files: Iterable[str]) -> tuple[dict[str, int], dict[str, Chain]]:
        """The files' bytes per chain top (by the device each file sits on)."""
        by_dev = {c.st_dev: c for c in self._chains}
        want: dict[str, int] = {}
        tops: dict[str, Chain] = {}
        for f in files:
            try:
                st = os.stat(f)
            except FileNotFoundError:
                continue
            c = by_dev.get(st.st_dev)
            if c is None or c.top is None:
                continue
            want[c.top.name] = want.get(c.top.name, 0) + st.st_size
            tops[c.top.name] = c
        return want, tops

    def _reported(self, delta: Mapping[str, Stat]) -> tuple[int, int | None]:
        """What a row reports: the bytes written to the file systems' devices (the tops), and
        the flush requests they received (for a device-mapper or md top, its leaves'); None
        where no device counts flushes."""
        tops = {c.top.name: c for c in self._chains if c.top is not None}
        written = sum(delta[n].written_bytes for n in tops)
        asked = {}
        for c in tops.values():
            assert c.top is not None
            for d in [c.top] if c.top.counts_flushes else c.leaves:
                if d.counts_flushes:
                    asked[d.name] = delta[d.name].flushes or 0
        return written, (sum(asked.values()) if asked else None)

    def save(self, files: Iterable[str], at: Counters | None = None) -> Verdict:
        """The verdict on a save whose interval began at `begin()` and ended at `end()` (or at
        the counters `at`, or now): `files` are the checkpoint's files (data and manifest) as
        they stand, durable."""
        if self.unavailable or self._before is None:
            return Verdict(f"unavailable: {self.unavailable or 'counters not read'}")
        delta = self._delta(at)
        written, flushes = self._reported(delta)
        want, tops = self._by_top(files)
        why: list[str] = []
        for name, need in want.items():
            c = tops[name]
            layers = [("", [c.top])] if c.top is not None else []
            if c.leaves and [d.name for d in c.leaves] != [name]:
                layers.append((" (below it)", list(c.leaves)))
            for where, devs in layers:
                got = sum(delta[d.name].written_bytes for d in devs)
                if got < need:
                    names = "+".join(d.name for d in devs)
                    why.append(f"{_pair(got, need)} reached {names}{where}")
        for d in self.devices():
            if not d.write_back:
                continue
            if not d.counts_flushes and d.name.startswith(("dm-", "md")):
                continue  # passes flushes down uncounted: its leaves are asked
            if not d.counts_flushes:
                if not why:
                    return Verdict(
                        f"unavailable: {d.name} has a write-back cache but its stat counts no "
                        "flushes (kernel before 5.5)",
                        written,
                        None,
                    )
                continue
            if (delta[d.name].flushes or 0) == 0:
                why.append(f"no cache flush reached {d.name} (write back)")
        if why:
            return Verdict("no: " + "; ".join(why), written, flushes)
        return Verdict(YES, written, flushes)

    def restore(self, files: Iterable[str]) -> Verdict:
        """The verdict on a restore whose interval began at `begin()` and ends now: did the
        devices of the files read at least their bytes."""
        if self.unavailable or self._before is None:
            return Verdict(f"unavailable: {self.unavailable or 'counters not read'}")
        delta = self._delta()
        read = sum(delta[d.name].read_bytes for d in self._tops())
        want, tops = self._by_top(files)
        for name, need in want.items():
            got = delta[name].read_bytes
            if got < need:
                return Verdict(
                    f"no: {_pair(got, need)} read from {name} (the rest came from memory)", read
                )
        return Verdict(YES, read)


def checkpoint_files(targets: Iterable[str], name: str) -> list[str]:
    """Every file of checkpoint `name` on the targets (data, manifest, records), as the harness
    finds them, not as the engine lists them: each engine keeps a checkpoint under
    `<target>/<name>/`."""
    out = []
    for t in targets:
        for root, _, files in os.walk(os.path.join(t, name)):
            out += [os.path.join(root, f) for f in files]
    return out
