"""bench.storage.generations and bench.storage.manifest on the branches where a defect would lose data: a save
still in flight (its writer alive, here or on another host) is never taken for leftovers, by the
next save nor by `ckptbench clean`; a save over a damaged manifest leaves no data of the old
generation behind; a manifest of another format is refused by name.

Saves in flight are real: a live process named by a marker, or an engine's save held inside its
write path by an event (nothing here depends on how fast the machine is).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import STRIPED_ENGINES

from bench import cli
from bench.common.errors import UserError
from bench.storage import generations, layout, manifest
from bench.storage.checksums import checksum
from bench.storage.verify import first_difference

HANG_S = 60  # a deadline that only catches a hang


def state_of(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(60, 100, generator=g), "b": torch.randint(0, 9, (77,), generator=g)}


def lay_out_save(dirs: list[str], name: str, save_id: str, marker: dict[str, Any]) -> list[str]:
    """What a save of `name` in flight (or killed) has on the targets: its marker naming its
    writer and a part of a data file on each; returns the paths."""
    paths = []
    for t, d in enumerate(dirs):
        ckpt = Path(d) / name
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / f".saving-{save_id}").write_text(json.dumps(marker))
        (ckpt / f"data-{t}.{save_id}.bin").write_bytes(b"half a stripe")
        paths += [str(ckpt / f".saving-{save_id}"), str(ckpt / f"data-{t}.{save_id}.bin")]
    return sorted(paths)


@pytest.fixture
def live_pid() -> Any:
    """The pid of a process of ours that runs until the test ends it (`stop()`, which returns
    its exit code: 3 if any signal a liveness check could send by mistake reached it)."""
    # It blocks those signals, so that the kernel keeps each one sent as pending the moment
    # it is sent (no race with the child's handler running, and a run under nohup that ignores
    # SIGHUP does not hide it), and looks at what is pending when its stdin closes.
    code = (
        "import signal, sys\n"
        "caught = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2}\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, caught)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
        "sys.exit(3 if signal.sigpending() & caught else 0)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "ready\n"  # type: ignore[union-attr]  # signals blocked

    class Live:
        pid = proc.pid

        @staticmethod
        def running() -> bool:
            return proc.poll() is None

        @staticmethod
        def stop() -> int:
            proc.stdin.close()  # type: ignore[union-attr]
            return proc.wait(HANG_S)

    yield Live
    if proc.poll() is None:
        Live.stop()


IN_FLIGHT = "00112233445566ff"


@pytest.mark.parametrize("engine", ["cpu-double"])
def test_a_live_writers_files_are_no_leftovers_until_it_is_gone(
    make_engine, targets, live_pid, capsys, engine
):
    """A marker that names a running process on this host: neither the next save of the name
    nor `ckptbench clean` touches its files; once the process is gone both take them."""
    dirs = targets(2)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    eng.save(state_of(1), "ckpt").wait()
    mine = lay_out_save(
        dirs, "ckpt", IN_FLIGHT, {"pid": live_pid.pid, "host": socket.gethostname()}
    )
    assert generations.leftovers(dirs, "ckpt") == []
    eng.save(state_of(2), "ckpt").wait()  # its leftover scan runs before its first file
    assert all(os.path.exists(p) for p in mine)
    assert cli.main(["clean", *dirs, "--name", "ckpt"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "0 leftover file(s) of interrupted saves removed"
    ]
    assert all(os.path.exists(p) for p in mine)
    assert first_difference(eng.load("ckpt"), state_of(2)) is None

    assert live_pid.running()
    assert live_pid.stop() == 0  # asking whether it ran sent it no signal
    # the writer is gone: what it left is now a leftover
    assert sorted(generations.leftovers(dirs, "ckpt")) == mine
    assert cli.main(["clean", *dirs, "--name", "ckpt"]) == 0
    assert not any(os.path.exists(p) for p in mine)
    assert first_difference(eng.load("ckpt"), state_of(2)) is None


def test_a_marker_of_another_host_is_left_alone(make_engine, targets, capsys):
    """Whether a writer on another host still runs cannot be told from here: its files stay,
    even when the pid it names is free on this host."""
    dirs = targets(2)
    for host in ("", f"{socket.gethostname()}-b", f"~{socket.gethostname()}"):  # before, after
        lay_out_save(dirs, "ckpt", IN_FLIGHT, {"pid": 2**30, "host": host})
        assert generations.leftovers(dirs, "ckpt") == [], host
    other = {"pid": 2**30, "host": f"not-{socket.gethostname()}"}
    mine = lay_out_save(dirs, "ckpt", IN_FLIGHT, other)
    assert generations.leftovers(dirs, "ckpt") == []
    assert cli.main(["clean", *dirs]) == 0
    assert all(os.path.exists(p) for p in mine)
    eng = make_engine("cpu-double", dirs, chunk_bytes="8KiB")
    eng.save(state_of(3), "ckpt").wait()
    assert all(os.path.exists(p) for p in mine)
    # The same marker naming this host: its pid is gone, so its files are leftovers.
    for p in mine:
        if os.path.basename(p).startswith(".saving-"):
            Path(p).write_text(json.dumps({**other, "host": socket.gethostname()}))
    assert sorted(generations.leftovers(dirs, "ckpt")) == mine


@pytest.mark.parametrize("engine", STRIPED_ENGINES)
def test_a_save_in_flight_survives_another_engines_save_of_the_name(
    make_engine, targets, monkeypatch, engine
):
    """Engine A's save is held inside its first write; engine B saves the same name over the
    same targets meanwhile. B's leftover scan must leave A's files alone: A's save then commits
    and loads whole. (Saying its writer is dead, B deletes A's data file under it.)"""
    dirs = targets(2)
    a = make_engine(engine, dirs, chunk_bytes="8KiB")
    b = make_engine(engine, dirs, chunk_bytes="8KiB")
    a.save(state_of(1), "ckpt").wait()
    held, release = threading.Event(), threading.Event()
    holder: list[int] = []
    real = layout.write_piece

    def hold(fd: int, piece: layout.Piece, o_direct: bool) -> None:
        if not holder:
            holder.append(threading.get_ident())
        if holder[0] == threading.get_ident() and not release.is_set():
            held.set()
            assert release.wait(HANG_S), "never released"
        real(fd, piece, o_direct)

    monkeypatch.setattr(layout, "write_piece", hold)
    result: list[Any] = []
    # gds writes inside save(): run A in a thread of its own either way.
    t = threading.Thread(target=lambda: result.append(a.save(state_of(2), "ckpt").wait()))
    t.start()
    assert held.wait(HANG_S), "A's save never wrote"
    try:
        a_files = [
            p for p in generations.generation_files(dirs, "ckpt", _marker_id(dirs)) if "data-" in p
        ]
        assert a_files
        monkeypatch.setattr(layout, "write_piece", real)
        b.save(state_of(3), "ckpt").wait()
        assert all(os.path.exists(p) for p in a_files), "B removed A's save in flight"
    finally:
        release.set()
        t.join(HANG_S)
    assert not t.is_alive() and result
    assert manifest.committed(dirs, "ckpt").save_id == result[0].save_id
    assert first_difference(a.load("ckpt"), state_of(2)) is None
    assert generations.leftovers(dirs, "ckpt") == []


def _marker_id(dirs: list[str]) -> str:
    """The SAVEID of the one save marked running in dirs[0]/ckpt."""
    (marker,) = [f for f in os.listdir(Path(dirs[0]) / "ckpt") if f.startswith(".saving-")]
    return marker.removeprefix(".saving-")


# -- saving over a damaged manifest -----------------------------------------------------------


@pytest.mark.parametrize("engine", STRIPED_ENGINES)
def test_a_save_over_a_damaged_manifest_removes_the_old_generation(make_engine, targets, engine):
    """The damaged manifest names the old generation no more, but its data files are still the
    old generation's: once the new save is committed, they go with it, as they would have with a
    readable manifest. Before, they stayed on the disk for good."""
    dirs = targets(3)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    old = eng.save(state_of(1), "ckpt").wait()
    old_files = generations.generation_files(dirs, "ckpt", old.save_id)
    assert len(old_files) == 3
    path = Path(manifest.manifest_path(dirs, "ckpt"))
    path.write_text(path.read_text()[:-10])
    with pytest.raises(UserError, match="manifest is damaged"):
        eng.load("ckpt")
    assert generations.leftovers(dirs, "ckpt") == []  # kept for recovery until replaced
    new = eng.save(state_of(2), "ckpt").wait()
    assert first_difference(eng.load("ckpt"), state_of(2)) is None
    assert not any(os.path.exists(p) for p in old_files), "the old generation stayed"
    for t, d in enumerate(dirs):
        want = {f"data-{t}.{new.save_id}.bin", generations.TARGETS_RECORD}
        assert set(os.listdir(Path(d) / "ckpt")) == want | ({"manifest.json"} if t == 0 else set())


@pytest.mark.parametrize("engine", ["cpu-double"])
def test_a_save_over_a_damaged_manifest_spares_a_save_in_flight(
    make_engine, targets, live_pid, engine
):
    """Removing what the damaged manifest left must not take a live writer's files with it."""
    dirs = targets(2)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    eng.save(state_of(1), "ckpt").wait()
    path = Path(manifest.manifest_path(dirs, "ckpt"))
    path.write_text("")
    theirs = lay_out_save(
        dirs, "ckpt", IN_FLIGHT, {"pid": live_pid.pid, "host": socket.gethostname()}
    )
    eng.save(state_of(2), "ckpt").wait()
    assert all(os.path.exists(p) for p in theirs)
    assert first_difference(eng.load("ckpt"), state_of(2)) is None
    assert live_pid.stop() == 0  # and asking whether it ran sent it no signal


# -- the manifest's format ----------------------------------------------------------------------


def with_checksum(body: dict[str, Any]) -> str:
    """A manifest text of `body` ending in its own checksum, as bench.storage.manifest writes it."""
    text = json.dumps(body, separators=(",", ":"))
    return f'{text[:-1]},"manifest_xxh3":"{checksum(text.encode())}"}}\n'


def test_a_manifest_of_another_format_is_refused_by_name(make_engine, targets):
    dirs = targets(2)
    eng = make_engine("cpu-double", dirs, chunk_bytes="8KiB")
    eng.save(state_of(1), "ckpt").wait()
    path = Path(manifest.manifest_path(dirs, "ckpt"))
    body = json.loads(path.read_text())
    del body["manifest_xxh3"]
    assert body["format"] == "ckptbench-1"
    for fmt in ("ckptbench-2", None):
        path.write_text(with_checksum({**body, "format": fmt}))
        with pytest.raises(UserError) as e:
            eng.load("ckpt")
        assert str(e.value) == f"{path}: not a ckptbench-1 manifest (format {fmt!r})"
    path.write_text(with_checksum(body))  # the same text with its own format loads again
    assert first_difference(eng.load("ckpt"), state_of(1)) is None


# -- the pieces of the lifecycle, one by one ----------------------------------------------------

DEAD = {"pid": 2**30, "host": socket.gethostname()}


@pytest.mark.parametrize(
    ("filename", "save_id"),
    [
        ("data-0.0123abcd.bin", "0123abcd"),
        ("data-12.x.bin", "x"),
        (".saving-77aa", "77aa"),
        ("manifest.json.tmp-99", "99"),
        ("gen-abc", "abc"),
        ("current.tmp-5", "5"),
        ("data-0.a.b.bin", None),  # not one of ours: a name with another dot
        ("data-0.bin", None),
        ("data-0.a.txt", None),
        ("notes.a.bin", None),
        ("manifest.json", None),
        ("current", None),
        (".targets", None),
    ],
)
def test_which_save_a_file_belongs_to(filename: str, save_id: str | None) -> None:
    assert generations._save_id_of(filename) == save_id


def test_claim_records_the_list_in_every_target_and_release_frees_a_bare_name(targets) -> None:
    dirs = targets(3)
    record = json.dumps({"targets": [os.path.realpath(d) for d in dirs]})
    # one target already holds the record (an earlier claim): the others get theirs
    (Path(dirs[0]) / "n").mkdir()
    (Path(dirs[0]) / "n" / generations.TARGETS_RECORD).write_text(record)
    generations.claim(dirs, "n")
    assert [(Path(d) / "n" / ".targets").read_text() for d in dirs] == [record] * 3
    assert [sorted(os.listdir(Path(d) / "n")) for d in dirs] == [[".targets"]] * 3
    # a folder that holds more than the record keeps it (files sorting after the record's
    # name and before it); the bare ones are freed
    (Path(dirs[1]) / "n" / "data-1.ab.bin").write_bytes(b"x")
    (Path(dirs[2]) / "n" / ".saving-ab").write_text(json.dumps(DEAD))
    generations.release(dirs, "n")
    assert sorted(os.listdir(Path(dirs[2]) / "n")) == [".saving-ab", ".targets"]
    (Path(dirs[0]) / "n" / ".targets").write_text(record)
    shutil.rmtree(Path(dirs[2]) / "n")  # and a missing one is no error
    generations.release(dirs, "n")
    assert os.listdir(Path(dirs[0]) / "n") == []
    assert sorted(os.listdir(Path(dirs[1]) / "n")) == [".targets", "data-1.ab.bin"]
    generations.release(dirs, "n")
    assert sorted(os.listdir(Path(dirs[1]) / "n")) == [".targets", "data-1.ab.bin"]


def test_leftovers_look_in_every_target_past_missing_and_unreadable_ones(targets) -> None:
    """A first target without the name's folder, a second whose claim cannot be read (left
    alone), a third with a dead save's files: those are listed; `keep` spares a save."""
    dirs = targets(3)
    (Path(dirs[1]) / "n").mkdir()
    (Path(dirs[1]) / "n" / ".targets").write_text("{not json")
    (Path(dirs[1]) / "n" / ".saving-dead1").write_text(json.dumps(DEAD))
    mine = lay_out_save(dirs[2:], "n", "dead2", DEAD)
    assert sorted(generations.leftovers(dirs, "n")) == mine
    assert generations.leftovers(dirs, "n", keep="dead2") == []
    assert generations.status(dirs, "n") == "incomplete"


def test_a_folder_of_another_list_keeps_its_data_but_not_our_dead_saves(targets) -> None:
    """X claimed `n` over [c, b]; over [a, b], b's data and manifest files are X's, whatever the
    lists' order; a dead save's marker and a baseline's dead generation there are ours."""
    a, b, c = targets(3)
    x = [c, b]
    generations.claim(x, "n")
    (Path(b) / "n" / "data-1.xsave.bin").write_bytes(b"X's stripe")
    (Path(b) / "n" / "manifest.json.tmp-xsave").write_text("")
    (Path(b) / "n" / ".saving-dead").write_text(json.dumps(DEAD))
    (Path(b) / "n" / "gen-dead").mkdir()
    for y in ([a, b], [b, a]):
        assert sorted(generations.leftovers(y, "n")) == [
            str(Path(b) / "n" / ".saving-dead"),
            str(Path(b) / "n" / "gen-dead"),
        ]


def test_remove_files_syncs_each_directory_it_removed_from(targets, monkeypatch) -> None:
    dirs = targets(2)
    paths = []
    for d in dirs:
        (Path(d) / "n").mkdir()
        for f in ("a", "b"):
            (Path(d) / "n" / f).write_text("x")
            paths.append(str(Path(d) / "n" / f))
    (Path(dirs[0]) / "n" / "sub").mkdir()
    (Path(dirs[0]) / "n" / "sub" / "c").write_text("x")
    synced: list[str] = []
    monkeypatch.setattr(generations, "fsync_dir", synced.append)
    generations.remove_files(
        [*paths, str(Path(dirs[0]) / "n" / "sub"), str(Path(dirs[1]) / "gone")]
    )
    assert [os.listdir(Path(d) / "n") for d in dirs] == [[], []]
    assert sorted(synced) == sorted(str(Path(d) / "n") for d in dirs)


def test_status_of_a_name(targets) -> None:
    dirs = targets(2)
    assert generations.status(dirs, "n") == "absent"
    generations.claim(dirs, "n")
    assert generations.status(dirs, "n") == "absent"  # a claim alone is no checkpoint
    (Path(dirs[1]) / "n" / "stray").write_text("")  # not ours, but not nothing
    assert generations.status(dirs, "n") == "incomplete"
    os.unlink(Path(dirs[1]) / "n" / "stray")
    lay_out_save(dirs[1:], "n", "dead", DEAD)
    assert generations.status(dirs, "n") == "incomplete"


def test_a_claim_cut_short_is_no_checkpoint(targets) -> None:
    """A kill (or a power cut) between the claim's temporary record and its rename leaves
    `.targets.tmp-*`: the name is absent, as for a claim alone, and load says so; release frees
    the folder of both. Status and load once disagreed here ('incomplete' against 'no complete
    checkpoint'), which the crash test hit when the claim's fsync widened the window."""
    dirs = targets(2)
    generations.claim(dirs[:1], "n")
    for d in dirs:
        (Path(d) / "n").mkdir(exist_ok=True)
        (Path(d) / "n" / ".targets.tmp-1a2b3c4d").write_text("")
    assert generations.status(dirs, "n") == "absent"
    with pytest.raises(UserError, match="no complete checkpoint 'n'"):
        generations.read(dirs, "n")
    assert generations.leftovers(dirs, "n") == []
    (Path(dirs[1]) / "n" / "data-0.dead.bin").write_bytes(b"x")  # beside a dead save's file
    assert generations.status(dirs, "n") == "incomplete"
    generations.release(dirs, "n")
    assert os.listdir(Path(dirs[0]) / "n") == []
    assert sorted(os.listdir(Path(dirs[1]) / "n")) == [".targets.tmp-1a2b3c4d", "data-0.dead.bin"]


@pytest.mark.parametrize("engine", STRIPED_ENGINES)
def test_delete_removes_the_name_from_every_target(make_engine, targets, engine) -> None:
    dirs = targets(3)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    eng.save(state_of(1), "ckpt").wait()
    files = eng.cached_files("ckpt")
    assert len(files) == 3
    eng.delete("ckpt")
    assert not any((Path(d) / "ckpt").exists() for d in dirs)
    assert eng.status("ckpt") == "absent"
    eng.delete("never-saved")  # nothing to remove is no error


@pytest.mark.parametrize("engine", STRIPED_ENGINES)
def test_the_commit_syncs_every_directory_before_the_manifest(
    make_engine, targets, monkeypatch, engine
) -> None:
    """The new files' directory entries are durable before the manifest names them: each
    target's checkpoint folder and the target itself are synced before the commit."""
    dirs = targets(2)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    events: list[tuple[str, str]] = []
    real_sync, real_commit = manifest.fsync_dir, manifest.commit
    monkeypatch.setattr(
        manifest, "fsync_dir", lambda p: (events.append(("sync", p)), real_sync(p))[1]
    )
    monkeypatch.setattr(
        manifest, "commit", lambda *a: (events.append(("commit", "")), real_commit(*a))[1]
    )
    eng.save(state_of(1), "ckpt").wait()
    before = {p for kind, p in events[: events.index(("commit", ""))] if kind == "sync"}
    want = {str(Path(d) / "ckpt") for d in eng.targets} | set(eng.targets)
    assert want <= before


def test_generation_files_skip_a_target_without_the_name(targets) -> None:
    dirs = targets(3)
    mine = lay_out_save([dirs[1]], "n", "s1", DEAD)
    assert sorted(generations.generation_files(dirs, "n", "s1")) == mine
