"""Crash consistency: a save SIGKILLed at any moment never costs a committed checkpoint.

For each striped engine, over 2 targets: the parent commits checkpoint "X" (a 32 MiB state of
seed 1, sixteen 1 MiB pieces a target) and "Y" (a small one). A child process
(tests/crash_child.py) builds the state of the other seed, says READY, starts saving "X" on GO
and says DONE once durable. The parent measures two uninterrupted saves, then kills children
with SIGKILL at delays spread from 0 to 1.1 times the faster one's duration after GO (the
snapshot, writes on either target, the manifest's commit, the removal of the old generation)
and a few after DONE. After each kill a reader must find:
- "X" complete, loading without error, bit-exact the old state or, only where the kill may have
  come after the commit, the new one (always the new one once DONE was said);
- "Y" untouched;
- every file in X's directories either of the committed generation or a leftover that
  `bench.storage.generations.leftovers` lists, all of one interrupted save;
- after the next save of "X", no leftovers and exactly the committed files.
Children saving a fresh name "Zi" are killed midway too: the name must be reported incomplete
(status and load), and a next save of it completes it and leaves no leftovers.

Children are forks of a fork server that has torch and bench imported (multiprocessing
`forkserver`), so a trial costs a fork and not an interpreter start; they are real processes
and the kills real SIGKILLs.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import crash_child  # tests/ is on sys.path (pytest's rootdir insertion), the fork server's too
import pytest
import torch
from conftest import STRIPED_ENGINES

from bench.common.errors import UserError
from bench.storage import generations, manifest

MiB = 1 << 20
# As small as the checks need: each target gets 16 pieces, so that a kill can land between the
# pieces of either target, and the kill points that matter are staged (crash_child.stop_at)
# whatever the save's duration. Every trial builds, saves, loads and compares this state.
TOTAL = 32 * MiB
TENSOR = 1 * MiB
OPTIONS = {"device": "host-emulated", "chunk_bytes": "1MiB"}
KILLS = 20  # kills after GO, spread over 0..1.1 x an uninterrupted save's duration
AFTER_DONE = (0.0, 0.05)  # more kills, seconds after the child said DONE (durable)
FRESH = (0.1, 0.4, 0.7)  # kills of a fresh name's save, in fractions of the duration
STRIPED = STRIPED_ENGINES
SAVE_ID = r"[0-9a-f]{16}"
# The files one save puts in a checkpoint directory, with its SAVEID (bench.storage.manifest's format).
OWN_FILE = re.compile(
    rf"data-\d+\.({SAVE_ID})\.bin|\.saving-({SAVE_ID})|manifest\.json\.tmp-({SAVE_ID})"
)


def save_id_of(path: str) -> str:
    match = OWN_FILE.fullmatch(os.path.basename(path))
    assert match, f"{path} is not a file a save makes"
    return next(g for g in match.groups() if g)


def same_bits(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return list(got) == list(want) and all(
        got[k].dtype == want[k].dtype
        and got[k].shape == want[k].shape
        and torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))
        for k in want
    )


@pytest.fixture(scope="module")
def fork_server() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    # Modules the server imports once for all children. Not crash_child itself: the server does
    # not get the tests' sys.path on Python 3.11 (each child does, and imports it, cheaply).
    ctx.set_forkserver_preload(["torch", "bench.engines", "bench.workloads"])
    return ctx


@pytest.fixture(scope="module")
def states() -> dict[int, dict[str, torch.Tensor]]:
    return {s: crash_child.state_of(s, TOTAL, TENSOR) for s in (1, 2)}


class Child:
    """One saving child, started on construction; `go()` waits until it is READY."""

    def __init__(
        self, ctx: Any, engine: str, dirs: list[str], seed: int, name: str, where: str | None
    ) -> None:
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(
            target=crash_child.run,
            args=(theirs, engine, dirs, OPTIONS, seed, name, TOTAL, TENSOR, where),
            daemon=True,
        )
        self.proc.start()
        theirs.close()
        self.t0 = 0.0

    def go(self) -> None:
        assert self.conn.poll(120), "the child did not get ready"
        assert self.conn.recv() == "READY"
        self.conn.send("GO")
        self.t0 = time.perf_counter()

    def wait_done(self) -> float:
        """Seconds from GO until the child said DONE (the save is durable)."""
        assert self.conn.poll(120), "the child's save did not finish"
        msg = self.conn.recv()
        assert msg[0] == "DONE", msg
        return time.perf_counter() - self.t0

    def wait_at(self, where: str) -> None:
        """Wait until the child's save stopped at `where` (crash_child.stop_at)."""
        assert self.conn.poll(120), f"the child's save never got to its {where}"
        assert self.conn.recv() == ("AT", where)

    def kill_at(self, t: float) -> None:
        """SIGKILL the child at perf_counter time `t`; returns once it is gone (reaped, so that
        its pid no longer looks alive to the leftover check)."""
        left = t - time.perf_counter()
        if left > 0:
            time.sleep(left)
        self.kill()
        assert self.proc.exitcode == -signal.SIGKILL, self.proc.exitcode

    def kill(self) -> None:
        if self.proc.exitcode is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)

    def said_done(self) -> bool:
        """Whether DONE reached the pipe before the kill."""
        return _drain(self.conn)


def _drain(conn: Connection) -> bool:
    done = False
    try:
        while conn.poll():
            msg = conn.recv()
            done = done or msg[0] == "DONE"
    except (EOFError, ConnectionResetError):
        pass  # the child died with our GO unread, or after its last message
    conn.close()
    return done


def committed_files(m: manifest.Manifest, t: int) -> set[str]:
    """What target t holds for the committed checkpoint: its data file (if it has data), the
    record of the target list, and on the first target the manifest."""
    out = {m.files[t]["file"]} if t in m.files else set()
    return out | {generations.TARGETS_RECORD} | ({"manifest.json"} if t == 0 else set())


def check_directories(dirs: list[str], name: str, leftovers: list[str]) -> manifest.Manifest:
    """Every file in NAME's directories is of the committed generation or a listed leftover."""
    m = manifest.committed(dirs, name)
    assert m is not None
    for t, d in enumerate(dirs):
        files = set(os.listdir(Path(d) / name))
        listed = {
            os.path.basename(p) for p in leftovers if os.path.dirname(p) == str(Path(d) / name)
        }
        # The committed save's own marker may outlive it (killed between commit and cleanup).
        stray = files - committed_files(m, t) - listed - {f".saving-{m.save_id}"}
        assert not stray, f"target {t}: files neither committed nor listed as leftovers: {stray}"
        assert committed_files(m, t) <= files, f"target {t}: committed files are missing"
    return m


def check_exact(dirs: list[str], name: str) -> manifest.Manifest:
    """NAME holds exactly its committed generation: no leftovers, no marker."""
    assert generations.leftovers(dirs, name) == []
    m = manifest.committed(dirs, name)
    assert m is not None
    for t, d in enumerate(dirs):
        assert set(os.listdir(Path(d) / name)) == committed_files(m, t), f"target {t}"
    return m


@dataclass
class Counts:
    kills: int = 0
    old: int = 0
    new: int = 0
    lost: int = 0
    with_leftovers: int = 0
    new_with_old_files: int = 0  # killed after the commit, before the old generation was gone
    fresh: int = 0
    fresh_incomplete: int = 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", STRIPED)
def test_sigkill_at_any_moment_keeps_the_committed_checkpoint(
    fork_server, states, make_engine, targets, engine
):
    dirs = targets(2)
    eng = make_engine(engine, dirs, **OPTIONS)
    y_state = crash_child.state_of(3, 8 * MiB, 1 * MiB)
    eng.save(y_state, "Y").wait()
    eng.save(states[1], "X").wait()
    seed = 1  # the state X holds
    counts = Counts()
    live: list[Child] = []

    def start(name: str, seed: int, where: str | None = None) -> Child:
        child = Child(fork_server, engine, dirs, seed, name, where)
        live.append(child)
        return child

    def kill(child: Child, delay: float, after_done: bool, where: str | None) -> bool:
        """GO, then SIGKILL `delay` s after GO (or after DONE), or once the save stopped at
        `where`; whether DONE came first."""
        child.go()
        if where:
            child.wait_at(where)
            child.kill()
        else:
            if after_done:
                child.wait_done()
            child.kill_at(time.perf_counter() + delay if after_done else child.t0 + delay)
        live.remove(child)
        return child.said_done() or after_done

    def check_x(old_id: str, old_seed: int, new_seed: int, done: bool) -> None:
        """After a kill of a save of X: X whole (old or new), Y untouched, leftovers listed."""
        assert eng.status("X") == "complete"
        m = manifest.committed(dirs, "X")
        which = "old" if m.save_id == old_id else "new"
        want = states[old_seed if which == "old" else new_seed]
        try:
            ok = same_bits(eng.load("X"), want)
        except Exception:
            counts.lost += 1
            raise
        if not ok:
            counts.lost += 1
            raise AssertionError(f"X ({which} generation) does not hold the state of its seed")
        setattr(counts, which, getattr(counts, which) + 1)
        assert not (done and which == "old"), "the save said DONE, but X is the old state"
        leftovers = generations.leftovers(dirs, "X")
        ids = {save_id_of(p) for p in leftovers}
        check_directories(dirs, "X", leftovers)
        if which == "old":
            assert len(ids) <= 1 and old_id not in ids, leftovers  # the killed save's files
        else:
            assert ids <= {old_id}, leftovers  # the old generation, its removal cut short
            counts.new_with_old_files += bool(ids)
        assert same_bits(eng.load("Y"), y_state)
        check_exact(dirs, "Y")
        if leftovers:
            counts.with_leftovers += 1
            # The next save of X removes them (and replaces X, by the same state here).
            eng.save(want, "X").wait()
            check_exact(dirs, "X")
            assert not any(os.path.exists(p) for p in leftovers)

    def check_fresh(name: str, state: dict[str, torch.Tensor]) -> None:
        """After a kill of the first save of `name`: reported incomplete, unless the kill came
        before its first file (absent) or after its commit (complete, and whole)."""
        counts.fresh += 1
        status = eng.status(name)
        if status == "complete":
            assert same_bits(eng.load(name), state)
            return
        with pytest.raises(UserError) as e:
            eng.load(name)
        if status == "absent":
            assert "no complete checkpoint" in str(e.value)
            assert generations.leftovers(dirs, name) == []
            return
        assert status == "incomplete"
        counts.fresh_incomplete += 1
        assert f"checkpoint {name!r} is incomplete" in str(e.value)
        leftovers = generations.leftovers(dirs, name)
        assert leftovers and len({save_id_of(p) for p in leftovers}) == 1
        small = {"w": torch.arange(1000)}
        eng.save(small, name).wait()
        check_exact(dirs, name)
        assert eng.status(name) == "complete"
        assert same_bits(eng.load(name), small)

    t_start = time.perf_counter()
    duration = float("nan")
    try:
        # Uninterrupted saves of X give the time scale (and are checked like the others): the
        # faster of two, as other work on the machine can slow one down.
        os.sync()  # no earlier test's writeback in this measurement
        durations = []
        for _ in range(2):
            old_id = manifest.committed(dirs, "X").save_id
            child = start("X", 3 - seed)
            child.go()
            durations.append(child.wait_done())
            child.kill()
            live.remove(child)
            counts.kills += 1
            check_x(old_id, seed, 3 - seed, True)
            seed = 3 - seed
        duration = min(durations)
        # Kills at points of the save, whatever the machine's speed (the child stops there and
        # says so): after its first data piece (the old checkpoint stays, the new one's files
        # are leftovers), after its commit (the new one, the old generation's files left), and
        # a fresh name's first save cut short (incomplete). Then kills spread over the
        # duration of an uninterrupted save, wherever they land.
        plan: list[tuple[str, float, bool, str | None]] = [
            ("X", 0.0, False, "write"),
            ("X", 0.0, False, "commit"),
            (f"Z{len(FRESH)}", 0.0, False, "write"),
        ]
        plan += [("X", k / (KILLS - 1) * 1.1 * duration, False, None) for k in range(KILLS)]
        plan += [("X", d, True, None) for d in AFTER_DONE]
        plan += [(f"Z{i}", f * duration, False, None) for i, f in enumerate(FRESH)]
        staged = {(n, w): False for n, _, _, w in plan if w}

        def next_child(i: int) -> Child:
            name, _, _, where = plan[i]
            return start(name, 3 - seed if name == "X" else 2, where)

        # The next child is started (and builds its state) while this trial is checked.
        child = next_child(0)
        for i, (name, delay, after_done, where) in enumerate(plan):
            old_id = manifest.committed(dirs, "X").save_id
            old_seed, child_seed = seed, 3 - seed if name == "X" else 2
            done = kill(child, delay, after_done, where)
            counts.kills += name == "X"
            if name == "X" and manifest.committed(dirs, "X").save_id != old_id:
                seed = child_seed
            if i + 1 < len(plan):
                child = next_child(i + 1)
            if name == "X":
                leftovers = generations.leftovers(dirs, "X")
                check_x(old_id, old_seed, child_seed, done)
                if where == "write":  # cut short: the old checkpoint, the new one's files left
                    assert seed == old_seed and leftovers
                    assert {save_id_of(p) for p in leftovers} != {old_id}
                elif where == "commit":  # committed: the new one, the old generation left
                    assert seed == child_seed
                    assert {save_id_of(p) for p in leftovers} == {old_id}
            else:
                incomplete = eng.status(name) == "incomplete"
                check_fresh(name, states[2])
                if where:
                    assert incomplete
            if where:
                staged[(name, where)] = True
        assert all(staged.values()), staged
    finally:
        for child in live:
            child.kill()
        print(
            f"\ncrash trials engine={engine} kills={counts.kills} old={counts.old} "
            f"new={counts.new} lost={counts.lost} with_leftovers={counts.with_leftovers} "
            f"new_with_old_files={counts.new_with_old_files} "
            f"fresh_kills={counts.fresh} fresh_incomplete={counts.fresh_incomplete} "
            f"save_s={duration:.3f} wall_s={time.perf_counter() - t_start:.1f}"
        )
    assert counts.old + counts.new == counts.kills >= KILLS + 2
    assert counts.fresh == len(FRESH) + 1
    assert counts.lost == 0
    # Both sides of the commit and saves cut short were hit by the staged kills, whatever the
    # spread of the others did on this machine.
    assert counts.old > 0 and counts.new > 0 and counts.with_leftovers > 0
    assert counts.new_with_old_files > 0 and counts.fresh_incomplete > 0
