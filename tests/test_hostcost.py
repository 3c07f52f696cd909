"""What a save costs the host (bench.measure.hostcost), held against known loads.

A test engine burns a known CPU time in a background thread, in a child process it waits for,
and in a long-lived child it does not wait for; each burner reports what it burned by its own
clock (CLOCK_THREAD_CPUTIME_ID, or the child's getrusage), which is the reference.

What holds on a busy machine, and so what is asserted:

- CPU time is what the kernel accounted to a task, not wall time: another process's load does
  not change it. The process figures must find each reference within 10 % (the measurement's
  own CPU is taken away; a burn of 0.4 s leaves room for the readings' tick rounding).
- /proc/stat's busy time over a save = this process + other processes + kernel threads and
  interrupts, to a few ticks. host_cpu_s takes away the other processes (by their own
  accounting) and the baseline's kernel background (rate x wall time), so
      host_cpu_s - process CPU = kernel work during the save - baseline x wall (+- ticks).
  Kernel work is never negative, so host_cpu_s >= process - baseline x wall - ticks holds
  whatever runs. It has no upper bound of its own: another process's I/O makes kernel work
  here. The upper bound asserted adds the kernel work that the process table and /proc/stat
  show for the same interval (kernel threads' CPU, interrupt time), measured beside the save.
  Within those, host_cpu_s must be within 25 % of the reference; to make the machine busy
  for certain, an unrelated process (not a child of this one) burns both CPUs meanwhile.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import result_row

from bench.engines.base import PendingSave, SaveResult
from bench.measure import columns, hostcost, results
from bench.measure import timers as measure
from bench.run import protocol, rows

BURN_S = 0.4
TICK = 1.0 / hostcost.CLK_TCK
CPUS = os.cpu_count() or 1

BURN_CODE = """
import resource, sys, time
def burn(s):
    t0 = time.process_time()
    while time.process_time() - t0 < s:
        pass
if sys.argv[1] == "once":
    burn(float(sys.argv[2]))
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(r.ru_utime + r.ru_stime, flush=True)
else:  # serve: burn what stdin asks, answer with the CPU time it took, until EOF
    for line in sys.stdin:
        t0 = time.process_time()
        burn(float(line))
        print(time.process_time() - t0, flush=True)
"""


def burn_thread(seconds: float) -> float:
    """Burn `seconds` of this thread's CPU; what it burned by the thread's own clock."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass
    return time.thread_time() - t0


class BurnEngine:
    """A test engine whose save does nothing but burn CPU where it is told: in `save()` itself
    (the stall) or in the background (the persist phase), in a thread, a child process it waits
    for, or a long-lived child started before the save (as DCP's process-based async_save keeps
    one). `burned` holds what each burner reported."""

    name = "burn"
    pinned_bytes = 0
    options = None

    def __init__(self, stall: str = "none", persist: str = "none", seconds: float = BURN_S):
        self.stall_kind, self.persist_kind, self.seconds = stall, persist, seconds
        self.burned: list[float] = []
        self.server: subprocess.Popen[str] | None = None
        if "server" in (stall, persist):
            self.server = subprocess.Popen(
                [sys.executable, "-c", BURN_CODE, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

    def _burn(self, kind: str) -> None:
        if kind == "thread":
            self.burned.append(burn_thread(self.seconds))
        elif kind == "child":
            out = subprocess.run(
                [sys.executable, "-c", BURN_CODE, "once", str(self.seconds)],
                capture_output=True,
                text=True,
                check=True,
            )
            self.burned.append(float(out.stdout))  # its whole life, start-up included
        elif kind == "server":
            assert self.server is not None and self.server.stdin and self.server.stdout
            self.server.stdin.write(f"{self.seconds}\n")
            self.server.stdin.flush()
            self.burned.append(float(self.server.stdout.readline()))
        elif kind == "sleep":
            time.sleep(self.seconds)

    def save(self, state: Any, name: str) -> PendingSave:
        pending = PendingSave(SaveResult(name=name, bytes=0))
        self._burn(self.stall_kind)
        if self.persist_kind == "none":
            pending.finish_now()
        elif self.persist_kind == "thread":
            # a thread of our own doing the burn, as an engine's persist thread does
            pending.run_in_background(lambda: self._burn("thread"))
        else:
            pending.run_in_background(lambda: self._burn(self.persist_kind))
        return pending

    def close(self) -> None:
        if self.server is not None:
            assert self.server.stdin is not None
            self.server.stdin.close()
            self.server.wait(timeout=30)


def kernel_work() -> tuple[dict[tuple[int, int], hostcost.Proc], float]:
    """What the kernel does beside the processes: its threads (process table) and the
    interrupt time of /proc/stat."""
    t = psutil.cpu_times()
    return hostcost.process_table(), getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def kernel_between(a: Any, b: Any) -> tuple[float, float]:
    """Kernel threads' CPU and interrupt time between two `kernel_work()` readings, and how far
    the tick counters can be off over that interval: /proc/stat's busy fields (5 of them, each
    floored to a tick at both ends) and two counters a process whose times moved (each floored
    too; the module docstring), in CPU-seconds."""
    keys = {k for k, p in {**a[0], **b[0]}.items() if p[1]}
    u, s = hostcost._delta(a[0], b[0], keys)
    moved = sum(1 for k in set(a[0]) | set(b[0]) if a[0].get(k, ())[2:] != b[0].get(k, ())[2:])
    return u + s + (b[1] - a[1]), (2 * 5 + 2 * moved) * TICK


@pytest.fixture
def busy_other() -> Iterator[None]:
    """An unrelated process (reparented away from this one: `sh` starts it in the background
    and exits) burning every CPU for a while, so the machine is busy for certain."""
    pids = []
    for _ in range(CPUS):
        out = subprocess.run(
            [
                "sh",
                "-c",
                f"{sys.executable} -c 'import time\nt=time.time()\nwhile time.time()-t<20: pass'"
                " >/dev/null 2>&1 & echo $!",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        pids.append(int(out.stdout))
    assert all(psutil.Process(p).ppid() != os.getpid() for p in pids)
    time.sleep(0.2)  # running before the baseline is taken
    yield
    for p in pids:
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass


def measured(eng: BurnEngine, host: hostcost.Host) -> tuple[dict[str, Any], tuple[float, float]]:
    """One save through protocol.save_phase (as the sweep does); the row, the kernel's own work
    over the same interval and the ticks' slack (`kernel_between`)."""
    row = result_row(total_bytes=0)
    a = kernel_work()
    try:
        protocol.save_phase(row, eng, None, "x", None, host=host)
    finally:
        eng.close()
    b = kernel_work()
    return columns.values(row), kernel_between(a, b)


def process(row: dict[str, Any]) -> float:
    return row["cpu_user_s"] + row["cpu_sys_s"]


def check_host(
    row: dict[str, Any], host: hostcost.Host, ref: float, kernel: tuple[float, float]
) -> None:
    """host_cpu_s within 25 % of `ref`, widened only by what the module docstring says: the
    baseline taken away (below), the kernel's own work measured beside the save (above), and
    the tick counters' rounding (both)."""
    assert host.baseline is not None
    work, ticks = kernel
    # the readings bracket the save: their interval is total_s and a little more
    wall = row["total_s"] + 0.2
    low = 0.75 * ref - host.baseline.background_cores * wall - ticks
    high = 1.25 * ref + work + ticks
    assert low <= row["host_cpu_s"] <= high, (row, kernel)
    # the raw busy time always holds this process's CPU
    assert row["host_busy_s"] >= process(row) - ticks


@pytest.fixture
def host(busy_other: None) -> hostcost.Host:
    return hostcost.Host.measure(0.3)


def test_a_thread_burning_in_the_persist_phase(host: hostcost.Host) -> None:
    eng = BurnEngine(persist="thread")
    row, kernel = measured(eng, host)
    (ref,) = eng.burned
    assert ref >= BURN_S
    assert process(row) == pytest.approx(ref, rel=0.10)
    # all of it after save() returned: the persist phase, not the stall
    assert row["stall_cpu_s"] < 0.1 * ref
    assert row["stall_host_cpu_s"] < 0.25 * ref + kernel[0] + kernel[1]
    check_host(row, host, ref, kernel)


def test_a_waited_child_burning_in_the_stall(host: hostcost.Host) -> None:
    eng = BurnEngine(stall="child")
    row, kernel = measured(eng, host)
    (ref,) = eng.burned
    assert process(row) == pytest.approx(ref, rel=0.10)
    assert row["stall_cpu_s"] == pytest.approx(ref, rel=0.10)
    check_host(row, host, ref, kernel)


def test_a_long_lived_child_burning_in_the_persist_phase(host: hostcost.Host) -> None:
    # started before the save and still alive after it: no getrusage sees it, /proc does
    eng = BurnEngine(persist="server")
    time.sleep(0.3)  # its start-up is not the save's
    row, kernel = measured(eng, host)
    (ref,) = eng.burned
    assert process(row) == pytest.approx(ref, rel=0.10)
    assert row["stall_cpu_s"] < 0.1 * ref
    check_host(row, host, ref, kernel)


def test_a_save_with_nothing_to_do_comes_out_near_zero(host: hostcost.Host, monkeypatch) -> None:
    # The page-cache sampler polls without a pause, so that the measurement's own CPU is most of
    # what this process spends during the save: taken away, what is left (starting a thread,
    # waking up, whatever else the process's threads do meanwhile) is a small part of it. A
    # ratio of two CPU times of one save, not a bound on how fast anything runs.
    sampler = measure.Sampler
    monkeypatch.setattr(measure, "Sampler", lambda: sampler(interval_s=0.0))
    eng = BurnEngine(persist="sleep", seconds=1.0)
    row, kernel = measured(eng, host)
    assert row["total_s"] >= 1.0
    assert row["meter_cpu_s"] > 0
    assert 0 <= process(row) < 0.2 * row["meter_cpu_s"], (process(row), row["meter_cpu_s"])
    # the other processes kept the CPUs busy (what a hypervisor steals is nobody's): all of
    # it was taken away
    assert row["host_others_cpu_s"] > 0.25 * CPUS * 0.5
    assert row["host_busy_s"] >= row["host_others_cpu_s"] - kernel[1]
    check_host(row, host, 0.0, kernel)


def test_the_baseline_is_taken_away_for_the_saves_wall_time() -> None:
    # A baseline of 0.5 busy cores in the background: a save of 0.4 s of nothing loses 0.2
    # CPU-seconds of its host figure to it, and says what rate it took away.
    quiet = hostcost.Host(hostcost.Baseline(0.1, 0.5, 0.0, 0.0, 0.0))
    loud = hostcost.Host(hostcost.Baseline(0.1, 0.5, 0.0, 0.0, 0.5))
    got = {}
    for name, h in (("quiet", quiet), ("loud", loud)):
        row, _ = measured(BurnEngine(persist="sleep", seconds=0.4), h)
        got[name] = row
    assert got["loud"]["host_baseline_cores"] == 0.5
    assert got["quiet"]["host_baseline_cores"] == 0.0
    for name, bl in (("quiet", 0.0), ("loud", 0.5)):
        r = got[name]
        raw = r["host_busy_s"] - r["host_others_cpu_s"] - r["meter_cpu_s"]
        # the readings bracket the save: their interval is total_s and a little more
        assert (
            raw - bl * (r["total_s"] + 0.2) - 1e-9
            <= r["host_cpu_s"]
            <= raw - bl * r["total_s"] + 1e-9
        )


def test_the_baseline_sees_other_processes_as_others(busy_other: None) -> None:
    a = kernel_work()
    b = hostcost.measure_baseline(0.3)
    _, ticks = kernel_between(a, kernel_work())
    assert b.seconds >= 0.3
    # busy CPUs, most of it the unrelated burners', next to nothing ours (a hypervisor may
    # steal some: it is nobody's busy time); the counters agree to their ticks
    assert b.others_cores > 0.5 * CPUS
    assert b.busy_cores >= b.others_cores - ticks / b.seconds
    assert abs(b.own_cores) < 0.1
    assert b.background_cores >= 0


def test_descendants_and_the_delta_of_a_process_table() -> None:
    me = os.getpid()
    table = {
        (me, 1): (1, False, 100, 10, 0, 0),
        (50, 2): (me, False, 5, 5, 0, 0),  # a child
        (51, 3): (50, False, 1, 1, 0, 0),  # a grandchild
        (60, 4): (1, False, 7, 7, 0, 0),  # someone else's
        (me + 1, 5): (2, True, 3, 3, 0, 0),  # a kernel thread
    }
    assert hostcost.descendants(table, me) == {(50, 2), (51, 3)}
    later = dict(table)
    later[(50, 2)] = (me, False, 9, 6, 2, 1)  # grew, and reaped the grandchild (3 ticks)
    del later[(51, 3)]
    later[(52, 6)] = (50, False, 1, 0, 0, 0)  # born in between
    # the grandchild's life is in its reaper's cutime/cstime: its time before is taken away
    u, s = hostcost._delta(table, later, {(50, 2), (51, 3), (52, 6)})
    assert (u, s) == pytest.approx(((9 + 2 - 5 - 1 + 1) * TICK, (6 + 1 - 5 - 1) * TICK))


def test_a_pid_reused_is_another_process() -> None:
    init = (1, 0)
    a = {init: (0, False, 0, 0, 0, 0), (70, 1): (1, False, 100, 0, 0, 0)}
    # the first 70 exited after 10 more ticks and init reaped it (its cutime took all 110); a
    # new process took pid 70 and ran 3 ticks
    b = {init: (0, False, 0, 0, 110, 0), (70, 9): (1, False, 3, 0, 0, 0)}
    assert hostcost._delta(a, b, {init, (70, 1), (70, 9)}) == pytest.approx(((10 + 3) * TICK, 0))


def test_an_exit_nobody_took_in_counts_nothing() -> None:
    # A kernel thread, or the child of a parent that ignores SIGCHLD: its life lands in no
    # one's cutime. Taking it away would make its whole life of 500 ticks negative time.
    kthreadd = (2, 0)
    a = {kthreadd: (0, True, 0, 0, 0, 0), (80, 1): (2, True, 0, 500, 0, 0)}
    b = {kthreadd: (0, True, 0, 0, 0, 0)}
    assert hostcost._delta(a, b, {kthreadd, (80, 1)}) == (0, 0)
    # this process's own children: RUSAGE_CHILDREN's growth joins their reapers' pool
    me = os.getpid()
    a = {(me, 1): (1, False, 0, 0, 0, 0), (81, 2): (me, False, 40, 0, 0, 0)}
    b = {(me, 1): (1, False, 0, 0, 0, 0)}
    assert hostcost._delta(a, b, {(81, 2)}, (45 * TICK, 0)) == pytest.approx((5 * TICK, 0))
    assert hostcost._delta(a, b, {(81, 2)}, (0, 0)) == (0, 0)


def test_an_orphan_reaped_by_init_counts_once() -> None:
    # Its parent left; init reaped it and took its whole life (300 ticks, 20 in between): the
    # other processes' time is 20 ticks, not init's 300.
    init, parent = (1, 0), (90, 1)
    a = {
        init: (0, False, 0, 0, 0, 0),
        parent: (1, False, 0, 0, 0, 0),
        (91, 2): (90, False, 280, 0, 0, 0),
    }
    b = {init: (0, False, 0, 0, 300, 0)}
    assert hostcost._delta(a, b, {init, parent, (91, 2)}) == pytest.approx((20 * TICK, 0))


# --- DRAM counters: perf_event_open and the sysfs description of uncore IMC events ----------


def test_event_config_places_each_term_where_format_says(tmp_path: Path) -> None:
    pmu = tmp_path / "uncore_imc_0"
    (pmu / "events").mkdir(parents=True)
    (pmu / "format").mkdir()
    (pmu / "events" / "cas_count_read").write_text("event=0x04,umask=0x0f\n")
    (pmu / "events" / "cas_count_read.scale").write_text("6.103515625e-5\n")
    (pmu / "events" / "cas_count_read.unit").write_text("MiB\n")
    (pmu / "format" / "event").write_text("config:0-7\n")
    (pmu / "format" / "umask").write_text("config:8-15\n")
    assert hostcost.event_config(str(pmu), "cas_count_read") == {"config": 0x0F04}
    # 64-byte cache lines: the scale and unit say one count is 64 bytes
    assert hostcost.event_scale(str(pmu), "cas_count_read") == pytest.approx(64.0)
    (pmu / "events" / "split").write_text("wide=0x1ff\n")
    (pmu / "format" / "wide").write_text("config1:0-3,8-12\n")  # as the kernel writes it
    assert hostcost.event_config(str(pmu), "split") == {"config1": 0xF | (0x1F << 8)}


def fake_pmu(root: Path, name: str, type_: int, event: str, config: str) -> None:
    """A sysfs PMU description (as /sys/bus/event_source/devices/NAME holds) for one event."""
    d = root / name
    (d / "events").mkdir(parents=True)
    (d / "format").mkdir()
    (d / "type").write_text(f"{type_}\n")
    (d / "cpumask").write_text("0\n")
    (d / "format" / "config").write_text("config:0-63\n")
    for ev in (event, event.replace("read", "write")):
        (d / "events" / ev).write_text(config + "\n")


def test_no_imc_counters_say_why(tmp_path: Path) -> None:
    assert hostcost.Imc.open(str(tmp_path)) is None
    assert "no uncore IMC counters" in hostcost.Imc.why_not
    assert "not measured (no uncore IMC counters" in hostcost.Host().info()["dram"]


def test_imc_counts_through_perf_event_open(tmp_path: Path) -> None:
    # No memory controller counters on this machine: a PMU described like one, whose events
    # are the kernel's software CPU clock (type 1, config 0: nanoseconds), goes through the same
    # discovery, config and perf_event_open(pid=-1, cpu) as the IMC counters would.
    fake_pmu(tmp_path, "uncore_imc_0", 1, "cas_count_read", "config=0")
    try:
        imc = hostcost.Imc.open(str(tmp_path))
    except OSError:
        imc = None
    if imc is None:
        if "Permission" in hostcost.Imc.why_not or "not permitted" in hostcost.Imc.why_not:
            pytest.skip(f"system-wide perf events not allowed here: {hostcost.Imc.why_not}")
        pytest.fail(hostcost.Imc.why_not)
    try:
        assert len(imc.counters) == 2  # read and write, one socket
        a = imc.read()
        time.sleep(0.05)
        b = imc.read()
        # two CPU clocks of CPU 0, each counting its 50 ms of wall time
        assert b - a >= 2 * 0.04e9
    finally:
        imc.close()


def test_perf_open_counts_this_threads_task_clock() -> None:
    # pid 0, cpu -1: this process's own task clock, allowed at every perf_event_paranoid
    # level below 3 (the default 2).
    try:
        fd = hostcost.perf_open(1, {"config": 1}, 0, -1)
    except OSError as e:
        pytest.skip(f"perf_event_open not allowed here: {e}")
    try:
        a = hostcost.perf_count(fd)
        burn_thread(0.05)
        assert hostcost.perf_count(fd) - a >= 0.04e9
    finally:
        os.close(fd)


def test_sampler_reports_its_own_thread_cpu() -> None:
    s = measure.Sampler(interval_s=0.001)
    s.start()
    time.sleep(0.3)
    own = s.own_cpu()
    s.stop()
    # hundreds of polls of /proc: some CPU, far from all of the 0.3 s
    assert 0 < own[0] + own[1] < 0.3


def test_sweep_rows_and_env_carry_the_host_cost(tmp_path: Path) -> None:
    from bench.common import devices
    from bench.config import sweep as config
    from bench.run.sweep import Sweep

    targets = [tmp_path / "t0"]
    targets[0].mkdir()
    raw = {
        "name": "hostcost",
        "engines": ["cpu-double"],
        "total_sizes": ["16MiB"],
        "tensor_sizes": ["4MiB"],
        "ssd_counts": [1],
        "targets": [str(t) for t in targets],
        "repetitions": 1,
        "warmups": 0,
        "ceilings": {"enabled": False},
    }
    s = Sweep(
        config.from_dict(raw), devices.detect("host-emulated"), str(tmp_path / "r"), quiet=True
    )
    run_dir = s.run()
    import json

    import pandas as pd

    df = pd.read_csv(os.path.join(run_dir, "results.csv"))
    r = df.iloc[0]
    assert r["host_busy_s"] >= r["cpu_user_s"] + r["cpu_sys_s"] - 2 * CPUS * TICK
    assert r["stall_cpu_s"] <= r["cpu_user_s"] + r["cpu_sys_s"] + 0.01
    assert r["meter_cpu_s"] > 0
    assert pd.isna(r["dram_bytes"])  # no IMC counters in a VM
    env = json.load(open(os.path.join(run_dir, "env.json")))
    hc = env["host_cost"]
    assert hc["baseline"]["seconds"] >= hostcost.BASELINE_S
    assert hc["baseline_after"]["seconds"] >= hostcost.BASELINE_S
    assert r["host_baseline_cores"] == pytest.approx(hc["baseline"]["background_cores"], abs=1e-6)
    assert hc["dram"].startswith("not measured")


def test_the_aggregate_of_ranks_counts_each_nodes_kernel_work_once() -> None:
    # Two ranks on node 0, one on node 1. Each rank's host figure is its own process plus
    # its node's kernel work; the aggregate adds the processes and each node's kernel once.
    def row(rank: int, node: int, proc: float, host: float, busy: float) -> results.Row:
        return result_row(
            rank=rank,
            node_rank=node,
            cpu_user_s=proc,
            cpu_sys_s=0.0,
            stall_cpu_s=proc / 2,
            host_cpu_s=host,
            stall_host_cpu_s=host / 2,
            host_busy_s=busy,
            host_others_cpu_s=1.0,
            host_baseline_cores=0.01,
            meter_cpu_s=0.01,
            dram_bytes=None,
            stall_dram_bytes=None,
        )

    rows_ = [row(0, 0, 1.0, 1.3, 3.0), row(1, 0, 2.0, 2.2, 3.1), row(2, 1, 1.0, 1.1, 1.5)]
    agg = rows._host_aggregate(rows_)
    # processes 1 + 2 + 1, node 0's kernel max(0.3, 0.2), node 1's 0.1
    assert agg["host_cpu_s"] == pytest.approx(4.0 + 0.3 + 0.1)
    assert agg["stall_cpu_s"] == pytest.approx(2.0)
    assert agg["host_busy_s"] == pytest.approx(3.1 + 1.5)
    assert agg["host_others_cpu_s"] is None  # the other ranks are each other's "others"
    assert agg["dram_bytes"] is None
    rows_[1].host_cpu_s = None  # a rank without the figure: none for the job
    assert rows._host_aggregate(rows_)["host_cpu_s"] is None


def test_a_resumed_results_csv_keeps_its_columns(tmp_path: Path) -> None:
    # A run begun before the host columns, resumed by this version: its rows must still parse.
    import csv

    path = tmp_path / "results.csv"
    host = {f.name for f in dataclasses.fields(hostcost.Cost)} - {"cpu_user_s", "cpu_sys_s"}
    old = [c for c in results.COLUMNS if c not in host]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([old, ["1"] * len(old)])
    w = results.RowWriter(str(path))  # today's columns, appending
    w.write(result_row(run_id="2", host_cpu_s=2.0))
    w.close()
    with open(path, newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == old and all(len(r) == len(old) for r in got)
    assert dict(zip(old, got[2], strict=True))["run_id"] == "2"


class ClockImc:
    """Stands in for the memory controllers: one byte per nanosecond of wall time; keeps what
    it read."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def read(self) -> int:
        self.reads.append(time.perf_counter_ns())
        return self.reads[-1]

    def close(self) -> None:
        pass


def test_dram_counters_are_read_per_phase_with_the_baseline_taken_away(monkeypatch) -> None:
    # The process table and /proc/stat are read between the clock's and the IMC's readings; on
    # a busy machine that takes a varying share of 0.2 s, so here they answer at once (the CPU
    # columns are not what this test reads).
    table, busy = hostcost.process_table(), hostcost.busy_s()
    monkeypatch.setattr(hostcost, "process_table", lambda: table)
    monkeypatch.setattr(hostcost, "busy_s", lambda: busy)
    imc = ClockImc()
    bl = hostcost.Baseline(0.1, 0.0, 0.0, 0.0, 0.0, dram_Bps=0.25e9)
    host = hostcost.Host(bl, imc)  # type: ignore[arg-type]
    assert host.info()["dram"] == "uncore IMC counters"
    eng = BurnEngine(stall="sleep", persist="sleep", seconds=0.2)
    row, _ = measured(eng, host)
    first, returned, durable = imc.reads[0], imc.reads[1], imc.reads[-1]
    # the readings bracket each timed phase
    assert (durable - first) / 1e9 >= row["total_s"] and (returned - first) / 1e9 >= row["stall_s"]
    # 1e9 B/s of traffic, 0.25e9 of it the baseline's: 0.75e9 x the wall time between readings
    assert row["dram_bytes"] == pytest.approx(0.75 * (durable - first), rel=0.02)
    assert row["stall_dram_bytes"] == pytest.approx(0.75 * (returned - first), rel=0.02)
    assert 0 < row["stall_dram_bytes"] < row["dram_bytes"]
