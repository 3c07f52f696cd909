"""What a save costs the host: CPU time of this process and its children, CPU time of the whole
machine, and DRAM traffic where the memory controllers can be read, each split into the stall
and the persist phase.

Three readings bracket a save: before `save()`, when it returns (the stall ends) and when the
bytes are durable. From them:

- **process** (`cpu_user_s`, `cpu_sys_s`, `stall_cpu_s`): every thread of this process
  (getrusage RUSAGE_SELF), the children it waited for (RUSAGE_CHILDREN) and the descendants
  still alive (their utime/stime and cutime/cstime in /proc/PID/stat, counted from the first
  reading; a descendant that exits and is reaped in between counts through its reaper, its
  time before the first reading taken away). CPU time is what the scheduler accounted to the
  tasks, so another process's load does not change it.
- **host** (`host_cpu_s`, `stall_host_cpu_s`): the busy time of every CPU from /proc/stat
  (user + nice + system + irq + softirq; steal and idle/iowait are not busy), minus the CPU
  time of every other user-space process over the same interval (read as above), minus an
  idle baseline measured in the same run (`measure_baseline`: the machine's background rate of
  the rest, in cores, times the save's wall time). What remains is this process's own CPU plus
  what the kernel did beside it: kernel threads (writeback kworkers, journal commits, ksoftirqd)
  and interrupts, which the buffered paths lean on.
- **DRAM** (`dram_bytes`): Intel uncore IMC counters (`cas_count_read` + `cas_count_write`,
  perf_event_open on each socket) where the kernel exposes them and the user may open them,
  minus the baseline's rate; None elsewhere (a VM, AMD, perf_event_paranoid > 0 without root).

The measurement's own CPU (the readings, the page-cache sampler's thread) is taken away from
the process and host figures (`meter_cpu_s` says how much it was).

What /proc/stat can and cannot say on a busy machine: its busy time always contains this
process's CPU time (up to the tick sampling of its counters, a few ticks of 1/USER_HZ), so the
host figure before any subtraction is never below the process's. Other user processes are
removed exactly as far as their own CPU accounting goes (to the tick), so they do not inflate
it. Kernel threads and interrupts cannot be attributed to a process: those caused by another
process's I/O during the save are counted here, and the baseline removes them only as far as
they ran at the same rate during its window. On a machine whose CPUs are all busy the figure
still holds (other processes are removed by their own accounting, not by idle time), but it can
move by the kernel work of the others. Steal time (a hypervisor's) counts as neither.

psutil reads /proc/stat here; the process table is read directly: psutil has no access to a
task's PF_KTHREAD flag and builds an object per process, where one read per process suffices.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK")
PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
BASELINE_S = 0.5  # the idle window a run measures before its saves (and again after); a
# config's `host_baseline_s` (bench.config.sweep.Config, same default) sets it for its run

# One process: (ppid, kernel thread, utime, stime, cutime, cstime) in ticks.
Proc = tuple[int, bool, int, int, int, int]


def process_table() -> dict[tuple[int, int], Proc]:
    """Every process now, keyed by (pid, start time) so that a reused pid is another key."""
    out: dict[tuple[int, int], Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:  # exited between listdir and open
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        rest = raw[raw.rindex(b")") + 2 :].split()
        flags = int(rest[6])
        ut, st, cut, cst = (int(x) for x in rest[11:15])
        out[(int(name), int(rest[19]))] = (int(rest[1]), bool(flags & PF_KTHREAD), ut, st, cut, cst)
    return out


def descendants(table: dict[tuple[int, int], Proc], root: int) -> set[tuple[int, int]]:
    """The keys of `root`'s descendants (not `root` itself) in a process table."""
    children: dict[int, list[tuple[int, int]]] = {}
    for key, p in table.items():
        children.setdefault(p[0], []).append(key)
    out: set[tuple[int, int]] = set()
    todo = [root]
    while todo:
        for key in children.get(todo.pop(), []):
            if key not in out and key[0] != root:
                out.add(key)
                todo.append(key[0])
    return out


def _delta(
    a: dict[tuple[int, int], Proc],
    b: dict[tuple[int, int], Proc],
    keys: set[tuple[int, int]],
    reaped: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """(user, system) CPU-seconds spent by the processes `keys` between tables a and b.

    Each process alive in b counts the growth of its own utime/stime. Processes that ended in
    between count through their reapers: the growth of the cutime/cstime of those alive in b
    (plus `reaped`, the growth of this process's RUSAGE_CHILDREN where it is the reaper) holds
    the whole lives of the children they reaped, so the lives the ended ones had already lived
    at a are taken away from that pool. The pool is never taken below zero: a kernel thread, the
    child of a parent that ignores SIGCHLD, or one reaped outside `keys` lands in no reaper's
    cutime here, and its life must not be taken away from the others' (what it ran between a and
    its end is then lost). The pool does not need to know who reaped whom: an orphan reparented
    to init and reaped there counts through init's cutime."""
    own_u = own_s = 0
    pool_u, pool_s = reaped[0] * CLK_TCK, reaped[1] * CLK_TCK
    for k in keys:
        pa, pb = a.get(k), b.get(k)
        if pb is not None:
            own_u += pb[2] - (pa[2] if pa else 0)
            own_s += pb[3] - (pa[3] if pa else 0)
            pool_u += pb[4] - (pa[4] if pa else 0)
            pool_s += pb[5] - (pa[5] if pa else 0)
        elif pa is not None:
            pool_u -= pa[2] + pa[4]
            pool_s -= pa[3] + pa[5]
    return (own_u + max(0.0, pool_u)) / CLK_TCK, (own_s + max(0.0, pool_s)) / CLK_TCK


def busy_s() -> float:
    """CPU-seconds every CPU has been busy since boot (/proc/stat via psutil): user, nice,
    system, irq, softirq; guest time is inside user, steal is the hypervisor's."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def _thread_cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return ru.ru_utime, ru.ru_stime


@dataclass
class Reading:
    """One reading of the counters. `own` is the reading's own CPU time (user, sys) in the
    calling thread; `sampler` the page-cache sampler thread's CPU so far."""

    t_ns: int = 0
    self_cpu: tuple[float, float] = (0.0, 0.0)
    children_cpu: tuple[float, float] = (0.0, 0.0)
    busy_s: float = 0.0
    procs: dict[tuple[int, int], Proc] = field(default_factory=dict)
    dram: int | None = None
    own: tuple[float, float] = (0.0, 0.0)
    sampler: tuple[float, float] = (0.0, 0.0)


def read(imc: Imc | None = None, sampler: Any = None, first: bool = True) -> Reading:
    """The counters now. `first`: the opening reading of an interval, which reads this
    process's own times first (its own cost then falls inside the interval, where it is taken
    away); a closing reading reads them last, for the same reason."""
    t0 = _thread_cpu()
    r = Reading()

    def mine() -> None:
        s, c = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        r.self_cpu = (s.ru_utime, s.ru_stime)
        r.children_cpu = (c.ru_utime, c.ru_stime)
        r.t_ns = time.perf_counter_ns()

    if first:
        mine()
        r.busy_s = busy_s()
        r.procs = process_table()
        r.dram = imc.read() if imc else None
    else:
        r.dram = imc.read() if imc else None
        r.procs = process_table()
        r.busy_s = busy_s()
        mine()
    r.sampler = sampler.own_cpu() if sampler is not None else (0.0, 0.0)
    t1 = _thread_cpu()
    r.own = (t1[0] - t0[0], t1[1] - t0[1])
    return r


@dataclass(frozen=True)
class Baseline:
    """The machine at rest, measured in the same run: busy time per second (cores) of all
    CPUs, of the other processes, of this one, and of the rest (kernel threads, interrupts):
    `background_cores`, the rate a save's host figure has taken away. DRAM bytes per second
    when measured."""

    seconds: float
    busy_cores: float
    others_cores: float
    own_cores: float
    background_cores: float
    dram_Bps: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Cost:
    """A save's cost to the host, in the result columns' names (seconds, bytes): each field is a
    column of bench.measure.results.Row, documented there, and fills it
    (bench.measure.columns.fill)."""

    cpu_user_s: float  # this process and its children, the measurement's own CPU taken away
    cpu_sys_s: float
    stall_cpu_s: float  # the same (user + sys), from save() called until it returned
    host_cpu_s: float  # the whole machine: busy - other processes - baseline - measurement
    stall_host_cpu_s: float
    host_busy_s: float  # raw: every CPU's busy time over the save, nothing taken away
    host_others_cpu_s: float  # other user-space processes' CPU time, taken away
    host_baseline_cores: float  # the baseline rate taken away (x the save's wall time)
    meter_cpu_s: float  # the measurement's own CPU (readings, sampler thread), taken away
    dram_bytes: int | None = None  # IMC read + write bytes, baseline taken away; None: no IMC
    stall_dram_bytes: int | None = None


class Span:
    """The counters between two readings, split by process class. `own`: the readings' own
    CPU (user, sys) that fell between them (see `read`), taken away with the sampler's."""

    def __init__(self, a: Reading, b: Reading, own: tuple[float, float]) -> None:
        self.a, self.b = a, b
        self.wall_s = (b.t_ns - a.t_ns) / 1e9
        me = os.getpid()
        ours = descendants(a.procs, me) | descendants(b.procs, me)
        every = set(a.procs) | set(b.procs)
        kernel = {k for k in every if (a.procs.get(k) or b.procs[k])[1]}
        mine = {k for k in every if k[0] == me}
        others = every - ours - kernel - mine
        # Descendants reaped by this process count in RUSAGE_CHILDREN (their whole lives),
        # which joins their reapers' pool in _delta.
        grew = (b.children_cpu[0] - a.children_cpu[0], b.children_cpu[1] - a.children_cpu[1])
        du, ds = _delta(a.procs, b.procs, ours, grew)
        self.user = b.self_cpu[0] - a.self_cpu[0] + du
        self.sys = b.self_cpu[1] - a.self_cpu[1] + ds
        ou, os_ = _delta(a.procs, b.procs, others)
        self.others = ou + os_
        self.busy = b.busy_s - a.busy_s
        self.dram = None if a.dram is None or b.dram is None else b.dram - a.dram
        self.meter_user = own[0] + b.sampler[0] - a.sampler[0]
        self.meter_sys = own[1] + b.sampler[1] - a.sampler[1]


def measure_baseline(seconds: float = BASELINE_S, imc: Imc | None = None) -> Baseline:
    """The machine's background over `seconds` of doing nothing here (sleeping between two
    readings): the rate at which CPUs are busy beyond the other processes and this one."""
    a = read(imc, first=True)
    time.sleep(seconds)
    b = read(imc, first=False)
    s = Span(a, b, (a.own[0] + b.own[0], a.own[1] + b.own[1]))
    wall = max(s.wall_s, 1e-9)
    own = s.user + s.sys - s.meter_user - s.meter_sys
    bg = s.busy - s.others - own - s.meter_user - s.meter_sys
    return Baseline(
        seconds=round(wall, 4),
        busy_cores=s.busy / wall,
        others_cores=s.others / wall,
        own_cores=own / wall,
        # Never negative: a negative rest is the ticks' sampling noise, and adding it to
        # every save would invent CPU time.
        background_cores=max(0.0, bg / wall),
        dram_Bps=None if s.dram is None else s.dram / wall,
    )


class Meter:
    """Three readings around one save: `start()` before save() is called, `stall()` when it
    returns, `stop()` when the bytes are durable (returns the Cost). `sampler` is the page-cache
    sampler running beside it (bench.measure.timers.Sampler), whose thread's CPU is taken away."""

    def __init__(
        self, baseline: Baseline | None = None, sampler: Any = None, imc: Imc | None = None
    ) -> None:
        self.baseline = baseline
        self.sampler = sampler
        self.imc = imc
        self._a: Reading | None = None
        self._m: Reading | None = None

    def start(self) -> Meter:
        self._a = read(self.imc, self.sampler, first=True)
        return self

    def stall(self) -> None:
        # Read like an opening reading: the stall ends as this process's times are read,
        # and the reading's own cost falls after that, in the persist phase.
        self._m = read(self.imc, self.sampler, first=True)

    def stop(self) -> Cost:
        assert self._a is not None, "Meter.stop() before start()"
        a = self._a
        b = read(self.imc, self.sampler, first=False)
        m = self._m or b  # no stall reading (save() raised): all of it is stall
        mid = self._m.own if self._m else (0.0, 0.0)
        whole = Span(a, b, (a.own[0] + mid[0] + b.own[0], a.own[1] + mid[1] + b.own[1]))
        stall = Span(a, m, a.own if self._m else (a.own[0] + b.own[0], a.own[1] + b.own[1]))
        bl = self.baseline
        bg = bl.background_cores if bl else 0.0

        def host(s: Span) -> float:
            return s.busy - s.others - bg * s.wall_s - s.meter_user - s.meter_sys

        def dram(s: Span) -> int | None:
            if s.dram is None:
                return None
            rate = bl.dram_Bps if bl and bl.dram_Bps else 0.0
            return int(s.dram - rate * s.wall_s)

        # The measurement's own CPU comes off the total, which the kernel accounts to the
        # nanosecond; its user/sys split is sampled at ticks, so the rest keeps the process's
        # own split rather than going negative on one side for a save that did little.
        total = max(0.0, whole.user + whole.sys - whole.meter_user - whole.meter_sys)
        share = whole.user / (whole.user + whole.sys) if whole.user + whole.sys > 0 else 0.0
        share = min(1.0, max(0.0, share))
        return Cost(
            cpu_user_s=total * share,
            cpu_sys_s=total * (1 - share),
            stall_cpu_s=stall.user + stall.sys - stall.meter_user - stall.meter_sys,
            host_cpu_s=host(whole),
            stall_host_cpu_s=host(stall),
            host_busy_s=whole.busy,
            host_others_cpu_s=whole.others,
            host_baseline_cores=bg,
            meter_cpu_s=whole.meter_user + whole.meter_sys,
            dram_bytes=dram(whole),
            stall_dram_bytes=dram(stall),
        )


class Host:
    """This run's view of its host: the idle baseline and the DRAM counters (None where the
    machine has none). `Host.measure()` opens the counters and measures the baseline; a bare
    `Host()` takes nothing away and reads no DRAM."""

    def __init__(self, baseline: Baseline | None = None, imc: Imc | None = None) -> None:
        self.baseline = baseline
        self.imc = imc
        self.imc_why_not = "" if imc else Imc.why_not

    @classmethod
    def measure(cls, seconds: float = BASELINE_S) -> Host:
        imc = Imc.open()
        return cls(measure_baseline(seconds, imc), imc)

    def meter(self, sampler: Any = None) -> Meter:
        return Meter(self.baseline, sampler, self.imc)

    def info(self) -> dict[str, Any]:
        """For env.json `host_cost`: how the host figures were taken."""
        return {
            "baseline": self.baseline.to_json() if self.baseline else None,
            "dram": "uncore IMC counters" if self.imc else f"not measured ({self.imc_why_not})",
            "clk_tck": CLK_TCK,
            "method": "host_cpu_s = /proc/stat busy - other processes' CPU - baseline "
            "background_cores x wall - the measurement's own CPU",
        }

    def close(self) -> None:
        if self.imc is not None:
            self.imc.close()
            self.imc = None


# --- DRAM traffic: Intel uncore IMC counters through perf_event_open ---------------------------

EVENT_SOURCES = "/sys/bus/event_source/devices"
# (PMU name prefix, read event, write event): the servers' per-channel CAS counters, else the
# client parts' data counters (Linux's names for them; not tried on such hardware here).
IMC_EVENTS = (
    ("uncore_imc", "cas_count_read", "cas_count_write"),
    ("uncore_imc", "data_reads", "data_writes"),
    ("uncore_imc_free_running", "data_read", "data_write"),
)
_SYSCALL = {"x86_64": 298, "aarch64": 241}  # __NR_perf_event_open
UNITS = {"": 1.0, "bytes": 1.0, "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30}


class _PerfAttr(ctypes.Structure):
    """struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1, 72 bytes); the kernel takes
    an older, shorter struct. flags 0: enabled from the open, counting user and kernel."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
    ]


def perf_open(type_: int, config: dict[str, int], pid: int, cpu: int) -> int:
    """perf_event_open(2) of one counting event; the fd, or OSError with the errno."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise OSError(f"perf_event_open: no syscall number known for {platform.machine()}")
    attr = _PerfAttr()
    attr.type = type_
    attr.size = ctypes.sizeof(_PerfAttr)
    attr.config = config.get("config", 0)
    attr.config1 = config.get("config1", 0)
    attr.config2 = config.get("config2", 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(
        ctypes.c_long(nr), ctypes.byref(attr), ctypes.c_int(pid), ctypes.c_int(cpu), -1, 0
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open: {os.strerror(err)}")
    return int(fd)


def perf_count(fd: int) -> int:
    """The counter's value now."""
    return int(struct.unpack("Q", os.read(fd, 8))[0])


def event_config(pmu_dir: str, event: str) -> dict[str, int]:
    """An event's perf_event_attr config words from sysfs: `events/NAME` holds terms such as
    `event=0x04,umask=0x03`, and `format/TERM` where each goes (`config:8-15`)."""
    with open(os.path.join(pmu_dir, "events", event)) as f:
        terms = f.read().strip()
    out: dict[str, int] = {}
    for term in filter(None, (t.strip() for t in terms.split(","))):
        name, _, value = term.partition("=")
        v = int(value, 0) if value else 1
        with open(os.path.join(pmu_dir, "format", name)) as f:
            word, _, bits = f.read().strip().partition(":")
        shift = 0
        for part in bits.split(","):
            lo, _, hi = part.partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
            width = hi_i - lo_i + 1
            out[word] = out.get(word, 0) | (((v >> shift) & ((1 << width) - 1)) << lo_i)
            shift += width
    return out


def event_scale(pmu_dir: str, event: str) -> float:
    """Bytes per count of an event (its `.scale` times its `.unit`; 1 without them)."""

    def text(suffix: str) -> str:
        try:
            with open(os.path.join(pmu_dir, "events", event + suffix)) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    scale = float(text(".scale") or 1.0)
    unit = text(".unit").lower()
    if unit not in UNITS:
        raise ValueError(f"{pmu_dir}: event {event} in unknown unit {unit!r}")
    return scale * UNITS[unit]


def _cpus(mask: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, mask.strip().split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


class Imc:
    """Bytes read from and written to DRAM by every memory controller, from the uncore IMC
    counters (one event per PMU and socket). `Imc.open()` returns None, with the reason in
    `Imc.why_not`, where they cannot be read."""

    why_not: str = ""

    def __init__(self, counters: list[tuple[int, float]]) -> None:
        self.counters = counters  # (fd, bytes per count)

    @classmethod
    def open(cls, root: str = EVENT_SOURCES) -> Imc | None:
        try:
            names = sorted(os.listdir(root))
        except OSError as e:
            cls.why_not = f"{root}: {e.strerror}"
            return None
        for prefix, rd, wr in IMC_EVENTS:
            pmus = [n for n in names if n.startswith(prefix) and n[len(prefix) :][:1] in ("_", "")]
            if prefix == "uncore_imc":  # not the free-running ones, tried first
                pmus = [n for n in pmus if not n.startswith("uncore_imc_free_running")]
            pmus = [p for p in pmus if os.path.exists(os.path.join(root, p, "events", rd))]
            if not pmus:
                continue
            counters: list[tuple[int, float]] = []
            try:
                for p in pmus:
                    d = os.path.join(root, p)
                    with open(os.path.join(d, "type")) as f:
                        type_ = int(f.read())
                    try:
                        with open(os.path.join(d, "cpumask")) as f:
                            cpus = _cpus(f.read()) or [0]  # one CPU per socket
                    except FileNotFoundError:
                        cpus = [0]
                    for ev in (rd, wr):
                        cfg, scale = event_config(d, ev), event_scale(d, ev)
                        for cpu in cpus:
                            counters.append((perf_open(type_, cfg, -1, cpu), scale))
            except (OSError, ValueError) as e:
                for fd, _ in counters:
                    os.close(fd)
                cls.why_not = f"{prefix}: {e}"
                return None
            cls.why_not = ""
            return cls(counters)
        cls.why_not = "no uncore IMC counters in " + root
        return None

    def read(self) -> int:
        return int(sum(perf_count(fd) * scale for fd, scale in self.counters))

    def close(self) -> None:
        for fd, _ in self.counters:
            os.close(fd)
        self.counters = []
