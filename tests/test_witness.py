"""The block device as a witness (bench.measure.witness): the devices behind a target read from
recorded sysfs trees (a disk, a partition, a device-mapper device over two disks, a loop device,
an old kernel without flush counters), and the verdicts on counters moved by hand; then, on a
loop device made for the test alone (root only), every engine's save and restore judged by the
device's real counters, a save whose fsyncs are dropped (planted, and under eatmydata) denied
and a run with one failing, and a restore from a page cache that was not dropped flagged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import RUNNABLE, result_row

from bench import engines
from bench.measure import timers, witness
from bench.run import protocol, rows

# --- recorded sysfs trees ----------------------------------------------------------------------


def stat_line(read_b: int = 0, written_b: int = 0, flushes: int = 0, fields: int = 17) -> str:
    """A /sys/block/<dev>/stat line with these byte counts (in 512-byte sectors) and flushes;
    `fields` 11 as kernels before 4.18 wrote it, 15 before 5.5, 17 since."""
    f = [5, 0, read_b // 512, 3, 7, 0, written_b // 512, 9, 0, 11, 12, 0, 0, 0, 0, flushes, 2]
    return " ".join(str(x) for x in f[:fields]) + "\n"


class Sysfs:
    """A made-up /sys: block devices with stat, queue/write_cache and queue/fua, partitions,
    slaves and loop backing files, and /sys/dev/block links for the devices the test's files
    sit on."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "block").mkdir(parents=True)
        (root / "dev" / "block").mkdir(parents=True)

    def disk(self, name: str, cache: str = "write back", fields: int = 17) -> Path:
        d = self.root / "block" / name
        (d / "queue").mkdir(parents=True)
        (d / "queue" / "write_cache").write_text(cache + "\n")
        (d / "queue" / "fua").write_text("0\n")
        (d / "slaves").mkdir()
        (d / "stat").write_text(stat_line(fields=fields))
        return d

    def partition(self, disk: str, name: str) -> Path:
        p = self.root / "block" / disk / name
        p.mkdir()
        (p / "partition").write_text("1\n")
        (p / "stat").write_text(stat_line())
        return p

    def slave(self, top: str, below: Path) -> None:
        (self.root / "block" / top / "slaves" / below.name).symlink_to(below)

    def backing(self, loop: str, file: Path) -> None:
        (self.root / "block" / loop / "loop").mkdir()
        (self.root / "block" / loop / "loop" / "backing_file").write_text(f"{file}\n")

    def link(self, path: Path, to: Path) -> None:
        """/sys/dev/block/MAJ:MIN of the device holding `path` -> `to`."""
        dev = os.stat(path).st_dev
        (self.root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(to)

    def move(self, name: str, read_b: int = 0, written_b: int = 0, flushes: int = 0) -> None:
        """Set device `name`'s counters (absolute)."""
        fields = len((self.root / "block" / name / "stat").read_text().split())
        (self.root / "block" / name / "stat").write_text(
            stat_line(read_b, written_b, flushes, fields)
        )


@pytest.fixture
def sysfs(tmp_path: Path) -> Sysfs:
    return Sysfs(tmp_path / "sys")


@pytest.fixture
def target(scratch: Path) -> Path:
    t = scratch / "t0"
    t.mkdir()
    if os.major(os.stat(t).st_dev) == 0:
        pytest.skip("the scratch directory is on a file system without a block device")
    return t


def checkpoint(target: Path, n: int) -> list[str]:
    f = target / "ck" / "data.bin"
    f.parent.mkdir()
    f.write_bytes(os.urandom(n))
    return [str(f)]


def test_parse_stat_reads_sectors_as_bytes_and_flushes_where_counted() -> None:
    s = witness.parse_stat(stat_line(4096, 1 << 20, 3))
    assert (s.read_bytes, s.written_bytes, s.flushes) == (4096, 1 << 20, 3)
    assert witness.parse_stat(stat_line(0, 512, 0, fields=15)).flushes is None
    assert witness.parse_stat(stat_line(0, 512, 0, fields=11)).flushes is None
    with pytest.raises(ValueError, match="not a block device stat"):
        witness.parse_stat("1 2 3")


def test_a_disk_is_its_own_leaf_and_a_save_needs_its_bytes_and_a_flush(
    sysfs: Sysfs, target: Path
) -> None:
    sysfs.link(target, sysfs.disk("vdz"))
    j = witness.Judge([str(target)], str(sysfs.root))
    c = j._chains[0]
    assert c.top is not None and c.top.name == "vdz" and [d.name for d in c.leaves] == ["vdz"]
    files = checkpoint(target, 1 << 20)
    j.begin()
    sysfs.move("vdz", written_b=1 << 20, flushes=1)
    v = j.save(files)
    assert v.text == "yes" and (v.bytes, v.flushes) == (1 << 20, 1)
    j.begin()  # the same bytes again, without a flush: denied
    sysfs.move("vdz", written_b=2 << 20, flushes=1)
    assert j.save(files).text == "no: no cache flush reached vdz (write back)"
    j.begin()  # a flush, but half the bytes
    sysfs.move("vdz", written_b=(2 << 20) + (1 << 19), flushes=2)
    v = j.save(files)
    assert v.denied and v.text == "no: 512KiB of the checkpoint's 1MiB reached vdz"


def test_a_write_through_device_needs_no_flush(sysfs: Sysfs, target: Path) -> None:
    sysfs.link(target, sysfs.disk("vdz", cache="write through"))
    j = witness.Judge([str(target)], str(sysfs.root))
    files = checkpoint(target, 4096)
    j.begin()
    sysfs.move("vdz", written_b=8192)
    assert j.save(files).text == "yes"


def test_an_old_kernel_without_flush_counters_is_unavailable_on_a_write_back_cache(
    sysfs: Sysfs, target: Path
) -> None:
    sysfs.link(target, sysfs.disk("vdz", fields=15))
    j = witness.Judge([str(target)], str(sysfs.root))
    files = checkpoint(target, 4096)
    j.begin()
    sysfs.move("vdz", written_b=4096)
    v = j.save(files)
    assert v.text.startswith("unavailable: vdz has a write-back cache but its stat counts no")
    assert not v.denied
    j.begin()  # the bytes missing is still conclusive
    assert j.save(files).text.startswith("no: 0B of the checkpoint's 4KiB reached vdz")


def test_a_partition_is_read_as_its_disk(sysfs: Sysfs, target: Path) -> None:
    sysfs.disk("vdz")
    sysfs.link(target, sysfs.partition("vdz", "vdz1"))
    c = witness.chain(str(target), str(sysfs.root))
    assert c.top is not None and c.top.name == "vdz"
    j = witness.Judge([str(target)], str(sysfs.root))
    files = checkpoint(target, 4096)
    j.begin()
    sysfs.move("vdz", written_b=4096, flushes=1)
    assert j.save(files).text == "yes"


def test_a_dm_device_over_two_disks_asks_the_disks_for_flushes(sysfs: Sysfs, target: Path) -> None:
    dm = sysfs.disk("dm-7")
    a, b = sysfs.disk("sdx"), sysfs.disk("sdy")
    sysfs.slave("dm-7", sysfs.partition("sdx", "sdx2"))  # a slave that is a partition
    sysfs.slave("dm-7", b)
    sysfs.link(target, dm)
    c = witness.chain(str(target), str(sysfs.root))
    assert c.top is not None and c.top.name == "dm-7" and not c.top.counts_flushes
    assert [d.name for d in c.leaves] == ["sdx", "sdy"] and a.exists()
    j = witness.Judge([str(target)], str(sysfs.root))
    files = checkpoint(target, 1 << 20)
    j.begin()  # striped: each disk gets half, the dm device all of it, each disk a flush
    sysfs.move("dm-7", written_b=1 << 20)
    sysfs.move("sdx", written_b=1 << 19, flushes=1)
    sysfs.move("sdy", written_b=1 << 19, flushes=1)
    v = j.save(files)
    assert v.text == "yes" and v.flushes == 2
    j.begin()  # the dm device counted the bytes, the disks not all of them, and one no flush
    sysfs.move("dm-7", written_b=2 << 20)
    sysfs.move("sdx", written_b=(1 << 19) + (1 << 19), flushes=2)
    v = j.save(files)
    assert v.text == (
        "no: 512KiB of the checkpoint's 1MiB reached sdx+sdy (below it); "
        "no cache flush reached sdy (write back)"
    )


def test_a_loop_device_is_read_with_the_device_of_its_backing_file(
    sysfs: Sysfs, target: Path
) -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm to hold a backing file on another file system")
    loop = sysfs.disk("loop9")
    backing_disk = sysfs.disk("nvme9n1")
    with open(f"/dev/shm/ckptbench-witness-{os.getpid()}", "wb") as f:
        backing = Path(f.name)
    try:
        sysfs.backing("loop9", backing)
        sysfs.link(target, loop)
        sysfs.link(backing, backing_disk)
        c = witness.chain(str(target), str(sysfs.root))
        assert c.top is not None and c.top.name == "loop9"
        assert [d.name for d in c.leaves] == ["nvme9n1"]
        j = witness.Judge([str(target)], str(sysfs.root))
        files = checkpoint(target, 4096)
        j.begin()  # the loop device got everything; its backing file's disk never did
        sysfs.move("loop9", written_b=4096, flushes=1)
        v = j.save(files)
        assert v.text == (
            "no: 0B of the checkpoint's 4KiB reached nvme9n1 (below it); "
            "no cache flush reached nvme9n1 (write back)"
        )
    finally:
        backing.unlink()


def test_no_block_device_no_targets_and_a_missing_target_are_unavailable(
    tmp_path: Path,
) -> None:
    if os.path.isdir("/dev/shm") and os.major(os.stat("/dev/shm").st_dev) == 0:
        j = witness.Judge(["/dev/shm"])
        j.begin()
        v = j.save([])
        assert v.text == "unavailable: tmpfs at /dev/shm has no block device of its own"
        assert v.bytes is None and not v.denied
    assert witness.Judge([]).save([]).text == "unavailable: no targets"
    gone = str(tmp_path / "gone")
    assert witness.Judge([gone]).save([]).text.startswith(f"unavailable: {gone}: No such file")


def test_a_restore_that_read_less_than_its_files_from_the_device_is_flagged(
    sysfs: Sysfs, target: Path
) -> None:
    sysfs.link(target, sysfs.disk("vdz"))
    j = witness.Judge([str(target)], str(sysfs.root))
    files = checkpoint(target, 1 << 20)
    j.begin()
    sysfs.move("vdz", read_b=1 << 20)
    assert j.restore(files).text == "yes"
    j.begin()
    sysfs.move("vdz", read_b=(1 << 20) + 4096)
    assert j.restore(files).text == (
        "no: 4KiB of the checkpoint's 1MiB read from vdz (the rest came from memory)"
    )


def test_an_aggregate_row_says_the_first_denial_with_its_rank() -> None:
    rs = [result_row(rank=i, durable_witness="yes", restore_witness="yes") for i in range(3)]
    assert rows.aggregate(rs).durable_witness == "yes"
    rs[2].durable_witness = "no: no cache flush reached vda (write back)"
    rs[1].restore_witness = "unavailable: no targets"
    agg = rows.aggregate(rs)
    assert agg.durable_witness == "no: rank 2: no cache flush reached vda (write back)"
    assert agg.restore_witness == "unavailable: rank 1: no targets"


# --- a loop device of the test's own: exact counts ---------------------------------------------

EXT4 = ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]


def _loop_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "not root: a loop device needs root"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    return None


@pytest.fixture
def loop_mount(scratch: Path) -> Iterator[Path]:
    """An ext4 file system on a loop device made for this test alone, mounted, removed after.
    Made without lazy initialisation (no background writes of inode tables) and with a journal
    commit interval of 300 s, so that nothing but the test writes to it: the counts are exact."""
    why = _loop_unavailable()
    if why:
        pytest.skip(why)
    img = scratch / "disk.img"
    with open(img, "wb") as f:
        f.truncate(512 << 20)
    got = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"losetup could not make a loop device: {got.stderr.strip()}")
    dev = got.stdout.strip()
    mnt = scratch / "mnt"
    mnt.mkdir()
    try:
        subprocess.run([*EXT4, dev], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "commit=300", dev, str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    finally:
        subprocess.run(["losetup", "-d", dev], check=True)
    # A device still open elsewhere (udev probing it after the unmount) is detached when the
    # last user lets go: `losetup -d` returns before that. Gone within 10 s, or left behind.
    deadline = time.monotonic() + 10
    while str(img) in (
        left := subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    ):
        assert time.monotonic() < deadline, left
        time.sleep(0.1)


def _state(n: int = 8, each: int = 4 << 20) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(42)
    return {f"t{i}": torch.randn(each // 4, generator=g) for i in range(n)}


LOOP_TABLE: list[tuple[str, int, int, int | None, str]] = []


@pytest.mark.parametrize("engine", RUNNABLE)
def test_every_engine_is_durable_as_a_loop_device_of_its_own_saw_it(
    loop_mount: Path, engine: str
) -> None:
    """Every engine's save on the loop device: `yes`, the device's bytes within 2 % of the
    checkpoint's files (the extra: ext4's journal blocks and the folders' and records' blocks),
    and its restore read at least the files it evicted."""
    targets = [str(loop_mount / "t0"), str(loop_mount / "t1")]
    for t in targets:
        os.mkdir(t)
    eng = engines.create(engine, targets)
    state = _state()
    try:
        row = result_row(engine=engine)
        protocol.save_phase(row, eng, state, "ck", None)
        files = witness.checkpoint_files(targets, "ck")
        size = sum(os.path.getsize(f) for f in files)
        LOOP_TABLE.append((engine, size, row.device_written_bytes or 0, row.device_flushes, "yes"))
        print(
            f"{engine}: checkpoint {size:,} B, device wrote {row.device_written_bytes:,} B, "
            f"{row.device_flushes} flush(es): {row.durable_witness}"
        )
        assert row.durable_witness == "yes", row.durable_witness
        assert not row.error
        assert size <= (row.device_written_bytes or 0) <= size * 1.02 + (256 << 10)
        assert (row.device_flushes or 0) >= 1
        protocol.restore_phase(row, eng, engine, state, "ck", _host(), True)
        assert row.verified, row.error
        assert row.restore_witness == "yes", row.restore_witness
        assert (row.device_read_bytes or 0) >= sum(
            os.path.getsize(f) for f in eng.cached_files("ck")
        )
    finally:
        eng.delete("ck")
        eng.close()


def _host() -> Any:
    from bench.common import devices

    return devices.detect("host-emulated")


def _no_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted defect: every fsync and fdatasync of this process a no-op (what eatmydata
    does to any program)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)


@pytest.mark.parametrize("engine", ["cpu-single", "cpu-double", "torch-save"])
def test_a_save_whose_fsyncs_are_dropped_is_denied_and_ours_fails(
    loop_mount: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if engine not in RUNNABLE:
        pytest.skip(f"{engine} does not run here")
    target = loop_mount / "t0"
    target.mkdir()
    eng = engines.create(engine, [str(target)])
    try:
        with monkeypatch.context() as m:
            _no_sync(m)
            row = result_row(engine=engine)
            protocol.save_phase(row, eng, _state(), "ck", None)
        assert row.durable_witness.startswith("no: "), row.durable_witness
        if engines.traits_of(engine).baseline:
            assert not row.error  # a library's denied save is reported, not failed
        else:
            assert row.error.startswith("not durable as the device saw it: no: ")
    finally:
        eng.delete("ck")
        eng.close()


@pytest.mark.alone  # another test's sweep would drop the pages it restores from
def test_a_restore_from_a_page_cache_that_was_not_dropped_is_flagged(
    loop_mount: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: the eviction before the restore does nothing and mincore says cold (as a
    preload that turns posix_fadvise into a no-op would leave it): the witness flags it."""
    target = loop_mount / "t0"
    target.mkdir()
    eng = engines.create("cpu-double", [str(target)])
    state = _state()
    try:
        row = result_row(engine="cpu-double")
        protocol.save_phase(row, eng, state, "ck", None)
        assert row.durable_witness == "yes"
        for f in eng.cached_files("ck"):
            with open(f, "rb") as fh:  # in the page cache, whatever the engine left there
                fh.read()
        monkeypatch.setattr(timers, "evict_files", lambda paths: None)
        monkeypatch.setattr(timers, "resident_bytes", lambda paths: 0)
        protocol.restore_phase(row, eng, "cpu-double", state, "ck", _host(), True)
        assert row.verified and row.restore_resident_bytes == 0
        assert row.restore_witness.startswith("no: "), row.restore_witness
        assert "read from loop" in row.restore_witness
    finally:
        eng.delete("ck")
        eng.close()


def _eatmydata() -> str | None:
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        p = os.path.join(d, "libeatmydata.so")
        if os.path.exists(p):
            return p
    return None


def test_a_run_under_eatmydata_is_denied_on_every_row_and_exits_1(loop_mount: Path) -> None:
    lib = _eatmydata()
    if lib is None:
        pytest.skip("eatmydata is not installed (apt-get install eatmydata)")
    cfg = loop_mount / "eat.yaml"
    cfg.write_text(
        "name: eat\n"
        "engines: [cpu-single, cpu-double, torch-save]\n"
        "total_sizes: [16MiB]\ntensor_sizes: [4MiB]\nssd_counts: [1]\n"
        f"scratch: {loop_mount / 'bench'}\n"
        "repetitions: 1\nwarmups: 0\nceilings: {enabled: false}\n"
    )
    env = {**os.environ, "LD_PRELOAD": lib}
    out = loop_mount / "results"
    got = subprocess.run(
        [sys.executable, "-m", "bench", "run", str(cfg), "--output", str(out), "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert got.returncode == 1, got.stdout[-2000:] + got.stderr[-2000:]
    from bench.measure import results

    (run,) = list(out.iterdir())
    df = results.read_rows(str(run))
    assert len(df) == 3
    assert all(w.startswith("no: ") for w in df["durable_witness"]), df["durable_witness"]
    assert set(df.loc[df["error"] != "", "engine"]) == {"cpu-single", "cpu-double"}
    assert "row(s) failed" in got.stderr


# --- what analysis does with a denied row ------------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "runs" / "20261205T113902Z-default-3518d9"


def _denied_run(tmp_path: Path, engine: str, how_many: int) -> Path:
    """The recorded default run, with the witness columns said: every row `yes`, but the first
    `how_many` timed rows of `engine` denied (as a run under eatmydata records them)."""
    import pandas as pd

    run = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, run)
    df = pd.read_csv(run / "results.csv")
    df["durable_witness"] = "yes"
    df["restore_witness"] = "yes"
    idx = df.index[(df["engine"] == engine) & ~df["warmup"]][:how_many]
    df.loc[idx, "durable_witness"] = "no: 0B of the checkpoint's 256MiB reached vda"
    df.to_csv(run / "results.csv", index=False)
    return run


def test_a_denied_save_keeps_its_stall_but_no_time_to_durability(tmp_path: Path) -> None:
    from analysis import runs, stats

    before = runs.load(str(FIXTURE))
    run = runs.load(str(_denied_run(tmp_path, "torch-save", 2)))
    ts = run.ok[run.ok["engine"] == "torch-save"]
    denied = ts[ts["denied"]]
    assert len(denied) == 2
    assert denied["total_s"].isna().all() and denied["write_GBps"].isna().all()
    assert denied["stall_s"].notna().all()  # the stall was real
    assert runs.witness_lines(run.rows) == [
        "2 save(s) the block device denied durable (its counters saw fewer bytes or no cache "
        "flush): their total_s is no time to durability and is left out (stall kept): "
        "torch-save 2"
    ]
    # the summary's medians are over the rows left: they move where the denied ones were
    t0, t1 = (
        stats.summary_table(r).set_index(["engine", "workload", "n_targets"]) for r in (before, run)
    )
    key = ("torch-save", *ts.iloc[0][["workload", "n_targets"]])
    kept = ts[~ts["denied"] & (ts["workload"] == key[1]) & (ts["n_targets"] == key[2])]
    assert len(kept) == 1  # of its 3 repetitions, the one the device did not deny
    assert t1.loc[key, "total_s"] == pytest.approx(kept["total_s"].iloc[0])
    assert t1.loc[key, "total_s"] != t0.loc[key, "total_s"]
    assert t1.loc[key, "stall_s"] == t0.loc[key, "stall_s"]


def test_compare_leaves_denied_rows_out_and_says_so(tmp_path: Path) -> None:
    from analysis import compare

    a = _denied_run(tmp_path / "a", "dcp", 12)  # every timed dcp row of the run
    c = compare.compare([str(a), str(FIXTURE)], "durable")
    assert "dcp" not in set(c.table["engine"])  # nothing left on A's side to compare
    assert "torch-save" in set(c.table["engine"])
    assert any(w.startswith("A: 12 save(s) the block device denied") for w in c.warnings)
