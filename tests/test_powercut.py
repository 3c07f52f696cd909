"""Power cuts: a save, a manifest's commit and the results files, cut after every recorded step
on a layer that forgets every write no fsync made durable (tests/powercut.py).

A killed process loses nothing in the page cache (tests/test_crash.py); a power cut loses every
write, name and removal that no fsync of the file, or of its directory, made durable. For each
engine (the striped ones and the baselines' pointer switch), a save of "X" over an existing "X",
and a first save of a fresh name, are recorded; then every distinct tree that a cut after one of
their steps leaves is written out and checked with a fresh engine, as after a reboot:
- once the save had returned (durable), the name loads as the new state, bit for bit;
- before, it loads as the old state or the new one, bit for bit (a fresh name: is refused with
  the error of an incomplete or missing checkpoint, or loads as the new state);
- `ckptbench clean` then leaves no leftovers and the same checkpoint, and the next save of the
  name completes, its files exactly the committed ones.
A failure says what the cut lost and which fsync was missing (PowerCut.explain).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import BASELINE_ENGINES, RUNNABLE, STRIPED_ENGINES, bits, result_row
from powercut import Event, PowerCut

from bench import cli, engines
from bench.common.errors import UserError
from bench.measure import results
from bench.measure.columns import names
from bench.storage import generations, manifest, odirect
from bench.workloads import synthetic_state

MiB = 1 << 20
OPTIONS = {"device": "host-emulated", "chunk_bytes": "1MiB"}
# The baselines that run here (FastPersist needs DeepSpeed), each with its own library's writer.
BASELINES = tuple(e for e in BASELINE_ENGINES if e in RUNNABLE)
DONE = "the save returned"


# gds through kvikio's CuFile, faked (tests/fake_kvikio.py: real files, os.pwrite, no fsync of
# its own, as cuFile): its files are fsync'd by the writer's `finish`, not by `drain`.
KVIKIO = "gds-kvikio-fake"
KVIKIO_OPTIONS = {"io": "kvikio", "device": "cuda", "chunk_bytes": "1MiB", "coalesce_below": 0}


def kind(engine: str) -> str:
    """The registry's name of an engine of these tests."""
    return "gds" if engine == KVIKIO else engine


def options(engine: str) -> dict[str, Any]:
    """The striped engines' options; the baselines take their libraries' defaults."""
    if engine == KVIKIO:
        return KVIKIO_OPTIONS
    return OPTIONS if engines.traits_of(kind(engine)).stripes else {}


def state_of(seed: int) -> dict[str, torch.Tensor]:
    """4 MiB in 512 KiB tensors: four 1 MiB chunks on each of two targets."""
    return synthetic_state(4 * MiB, MiB // 2, seed=seed)


def same(got: Any, want: dict[str, torch.Tensor]) -> bool:
    return list(got) == list(want) and all(
        got[k].dtype == want[k].dtype
        and got[k].shape == want[k].shape
        and torch.equal(bits(got[k]), bits(want[k]))
        for k in want
    )


def engine_targets(engine: str, root: Path) -> list[str]:
    """Two targets for a striped engine, one for a baseline (it writes to its first only)."""
    n = 2 if engines.traits_of(kind(engine)).stripes else 1
    out = [str(root / f"t{i}") for i in range(n)]
    for d in out:
        os.makedirs(d)
    if engines.traits_of(kind(engine)).o_direct and odirect.probe(out[0]):
        pytest.skip(f"{engine}: {odirect.probe(out[0])}")
    if engines.unavailable(kind(engine), options(engine)):
        pytest.skip(f"{engine}: {engines.unavailable(kind(engine), options(engine))}")
    return out


def committed_files(engine: str, dirs: list[str], name: str) -> dict[str, set[str]]:
    """What each target's NAME directory holds once a save completed and nothing is left over."""
    d = [os.path.join(t, name) for t in dirs]
    if not engines.traits_of(kind(engine)).stripes:
        sid = Path(d[0], "current").read_text().strip()
        return {d[0]: {"current", f"gen-{sid}"}}
    m = manifest.committed(dirs, name)
    assert m is not None
    return {
        p: ({m.files[t]["file"]} if t in m.files else set())
        | {generations.TARGETS_RECORD}
        | ({manifest.MANIFEST} if t == 0 else set())
        for t, p in enumerate(d)
    }


def load(engine: str, dirs: list[str], name: str) -> tuple[Any, str]:
    """(the state loaded by a fresh engine, '') or (None, the refusal's message): a UserError's
    line, or for any other error (a library's, never a clear refusal) its type and text."""
    eng = engines.create(kind(engine), dirs, **options(engine))
    try:
        return eng.load(name), ""
    except UserError as e:
        return None, str(e)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        return None, f"not a clear refusal: {type(e).__name__}: {str(e)[-300:]}"
    finally:
        eng.close()


def record_save(engine: str, root: Path, dirs: list[str], name: str, state: Any) -> PowerCut:
    eng = engines.create(kind(engine), dirs, **options(engine))
    try:
        eng.warm(state)
        with PowerCut(root) as pc:
            eng.save(state, name).wait()
            pc.mark(DONE)
    finally:
        eng.close()
    return pc


def check_cut(
    engine: str,
    pc: PowerCut,
    cut: Event,
    dirs: list[str],
    name: str,
    old: dict[str, torch.Tensor] | None,
    new: dict[str, torch.Tensor],
    then: dict[str, torch.Tensor],
) -> str:
    """Write out the tree the cut leaves, check what `name` loads as, clean, save `then`;
    returns which checkpoint the cut kept ('old', 'new' or 'refused')."""
    pc.materialise(cut)
    where = f"{engine}: a power cut after {cut}"
    got, refused = load(engine, dirs, name)
    if pc.after(DONE, cut):
        kept = "new" if got is not None and same(got, new) else ""
        assert kept, (
            f"{where}, after the save returned: {name} does not load as the new checkpoint "
            f"({refused or 'other bytes'})\n{pc.explain(cut)}"
        )
    elif got is None:
        kept = "refused"
        if old is not None:
            raise AssertionError(
                f"{where}: {name} is refused ({refused}), the old checkpoint is lost\n"
                f"{pc.explain(cut)}"
            )
        clear = (f"checkpoint {name!r} is incomplete", "no complete checkpoint", "does not exist")
        assert not refused.startswith("not a clear") and any(c in refused for c in clear), (
            f"{where}: {name} is refused with an unclear error: {refused}\n{pc.explain(cut)}"
        )
    else:
        kept = "old" if old is not None and same(got, old) else "new" if same(got, new) else ""
        assert kept, (
            f"{where}: {name} loads as neither the old checkpoint nor the new one\n"
            f"{pc.explain(cut)}"
        )
    # Recovery: `ckptbench clean` leaves the same checkpoint and no leftovers, and the next
    # save completes.
    assert cli.main(["clean", *dirs, "--name", name]) == 0
    assert generations.leftovers(dirs, name) == [], f"{where}: leftovers after ckptbench clean"
    again, _ = load(engine, dirs, name)
    assert (again is None) == (got is None) and (got is None or same(again, got)), (
        f"{where}: ckptbench clean changed what {name} loads as"
    )
    eng = engines.create(kind(engine), dirs, **options(engine))
    try:
        try:
            eng.save(then, name).wait()
        except UserError as e:
            raise AssertionError(
                f"{where}: the next save of {name} is refused: {e}\n{pc.explain(cut)}"
            ) from None
        assert same(eng.load(name), then), f"{where}: the next save does not load back"
    finally:
        eng.close()
    assert generations.leftovers(dirs, name) == []
    for d, files in committed_files(engine, dirs, name).items():
        assert set(os.listdir(d)) == files, f"{where}: after the next save, {d} holds other files"
    return kept


def cut_a_save_over(engine: str, root: Path, states: list[Any]) -> None:
    """Save states[0] as X, record a save of states[1] over it, check every cut (check_cut,
    with states[2] as the next save)."""
    old, new, then = states
    dirs = engine_targets(engine, root)
    eng = engines.create(kind(engine), dirs, **options(engine))
    try:
        eng.save(old, "X").wait()
    finally:
        eng.close()
    pc = record_save(engine, root, dirs, "X", new)
    fsyncs = [e for e in pc.events if e.what == "fsync"]
    assert len(fsyncs) >= 3, f"{engine}: a save with {len(fsyncs)} fsyncs: {pc.events}"
    kept = [check_cut(engine, pc, c, dirs, "X", old, new, then) for c in pc.versions()]
    # Both sides of the commit were cut.
    assert kept[0] == "old" and kept[-1] == "new", kept
    print(
        f"\npower cuts engine={engine} steps={len(pc.events)} fsyncs={len(fsyncs)} "
        f"trees={len(kept)} old={kept.count('old')} new={kept.count('new')}"
    )


@pytest.mark.parametrize("engine", STRIPED_ENGINES + BASELINES)
def test_a_power_cut_at_any_step_of_a_save_keeps_the_old_checkpoint_or_the_new(
    scratch: Path, engine: str
) -> None:
    cut_a_save_over(engine, scratch / "disk", [state_of(1), state_of(2), state_of(3)])


def test_a_power_cut_of_gds_through_kvikio_keeps_the_old_checkpoint_or_the_new(
    scratch: Path, monkeypatch: pytest.MonkeyPatch, fake_cuda: Any
) -> None:
    """gds's kvikio path, on the fake kvikio and fake device memory: the files cuFile wrote
    are made durable by the writer's own fsync (`finish`)."""
    from fake_kvikio import FakeKvikio

    from bench.engines import gds

    stats = str(scratch / "nvidia-fs-stats")
    fake = FakeKvikio(allocation_of=fake_cuda.allocation_of, nvfs_stats=stats).install(monkeypatch)
    monkeypatch.setattr(gds.labels, "NVFS_STATS", stats)
    try:
        states = [fake_cuda.to_device(state_of(s)) for s in (6, 7, 8)]
        cut_a_save_over(KVIKIO, scratch / "disk", states)
    finally:
        fake.uninstall()


@pytest.mark.parametrize("engine", STRIPED_ENGINES + BASELINES)
def test_a_power_cut_in_the_first_save_of_a_name_leaves_it_refused_or_whole(
    scratch: Path, engine: str
) -> None:
    root = scratch / "disk"
    dirs = engine_targets(engine, root)
    new, then = state_of(4), state_of(5)
    pc = record_save(engine, root, dirs, "Z", new)
    kept = [check_cut(engine, pc, c, dirs, "Z", None, new, then) for c in pc.versions()]
    assert kept[0] == "refused" and kept[-1] == "new", kept
    print(
        f"\npower cuts of a first save engine={engine} steps={len(pc.events)} "
        f"trees={len(kept)} refused={kept.count('refused')} new={kept.count('new')}"
    )


def test_a_committed_manifest_survives_a_power_cut(scratch: Path) -> None:
    """manifest.commit's promise on its own: durable once it returns (a save's later steps,
    such as the removal of the old generation, fsync the same directory and would hide a
    commit that does not)."""
    root = scratch / "disk"
    dirs = [str(root / "t0")]
    os.makedirs(manifest.checkpoint_dir(dirs[0], "X"))

    def manifest_of(save_id: str) -> manifest.Manifest:
        return manifest.Manifest(
            name="X",
            engine="cpu-single",
            targets=dirs,
            files={},
            tensors=[],
            tree={"k": 1},
            checksums=True,
            payload_bytes=0,
            save_id=save_id,
        )

    manifest.commit(dirs, manifest_of("1" * 16))
    with PowerCut(root) as pc:
        manifest.commit(dirs, manifest_of("2" * 16))
        pc.mark(DONE)
    for cut in pc.versions():
        pc.materialise(cut)
        m = manifest.committed(dirs, "X")
        sid = m.save_id if m is not None else "none"
        want = {"2" * 16} if pc.after(DONE, cut) else {"1" * 16, "2" * 16}
        assert sid in want, (
            f"a power cut after {cut}: the manifest holds save {sid}, not {' or '.join(want)}"
            f"{' (commit() had returned)' if pc.after(DONE, cut) else ''}\n{pc.explain(cut)}"
        )


def test_a_power_cut_loses_no_reported_row_and_leaves_no_half_written_file(scratch: Path) -> None:
    """A run's results: its folder made, env.json replaced twice, rows appended to results.csv;
    a cut after any step keeps every row whose write had returned and the env.json last
    replaced, each file whole."""
    root = scratch / "disk"
    root.mkdir()
    rows = [result_row(rep=i, stall_s=0.1 * (i + 1)) for i in range(4)]
    with PowerCut(root) as pc:
        _, run_dir = results.new_run_dir(str(root / "results"), "cfg")
        env = os.path.join(run_dir, "env.json")
        results.write_json(env, {"env": 1})
        pc.mark("env 1")
        w = results.RowWriter(os.path.join(run_dir, "results.csv"))
        for i, r in enumerate(rows):
            w.write(r)
            pc.mark(f"row {i}")
        results.write_json(env, {"env": 2})
        pc.mark("env 2")
        w.close()
    header = names(results.Row)
    for cut in pc.versions():
        pc.materialise(cut)
        where = f"a power cut after {cut}"
        reported = sum(pc.after(f"row {i}", cut) for i in range(len(rows)))
        env_want = 2 if pc.after("env 2", cut) else 1 if pc.after("env 1", cut) else None
        found = sorted((root / "results").glob("*/env.json")) if (root / "results").exists() else []
        if env_want is None and not found:
            continue
        assert len(found) == 1, f"{where}: env.json lost\n{pc.explain(cut)}"
        try:
            got = json.loads(found[0].read_text())["env"]
        except (ValueError, KeyError) as e:
            raise AssertionError(f"{where}: env.json half-written ({e})\n{pc.explain(cut)}") from e
        assert env_want is None or got >= env_want, (
            f"{where}: env.json is version {got}, not {env_want}\n{pc.explain(cut)}"
        )
        path = found[0].parent / "results.csv"
        if not reported and not path.exists():
            continue
        assert path.exists(), f"{where}: results.csv lost, {reported} rows reported\n" + (
            pc.explain(cut)
        )
        with open(path, newline="") as f:
            table = list(csv.reader(f))
        assert table and table[0] == header, (
            f"{where}: results.csv's header is lost or torn\n{pc.explain(cut)}"
        )
        assert all(len(r) == len(header) for r in table[1:]), (
            f"{where}: a row is torn\n{pc.explain(cut)}"
        )
        reps = [int(r[header.index("rep")]) for r in table[1:]]
        assert reps[:reported] == list(range(reported)), (
            f"{where}: results.csv holds rows {reps}, {reported} were reported\n{pc.explain(cut)}"
        )


# -- the layer itself --------------------------------------------------------------------------


def test_the_layer_forgets_every_write_no_fsync_made_durable(scratch: Path) -> None:
    root = scratch / "disk"
    (root / "d").mkdir(parents=True)
    (root / "kept").write_bytes(b"old")
    (root / "gone").write_bytes(b"was here")

    def fsync_dir(p: Path) -> None:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)

    with PowerCut(root) as pc:
        (root / "unsynced").write_bytes(b"a")  # neither file nor directory fsync'd
        with open(root / "d" / "synced", "wb") as f:  # both
            f.write(b"b")
            f.flush()
            os.fsync(f.fileno())
        with open(root / "d" / "named", "wb") as f:  # only its name
            f.write(b"c")
        fsync_dir(root / "d")
        (root / "d" / "named").write_bytes(b"cc")  # content changed after: not durable
        os.unlink(root / "gone")  # removal never made durable
        with open(root / "kept.tmp", "wb") as f:  # replaced without an fsync of the directory
            f.write(b"new")
            f.flush()
            os.fsync(f.fileno())
        os.replace(root / "kept.tmp", root / "kept")
        pc.mark("end")
    last = pc.cuts()[-1]
    pc.materialise(last)
    assert sorted(os.listdir(root)) == ["d", "gone", "kept"]
    assert (root / "kept").read_bytes() == b"old" and (root / "gone").read_bytes() == b"was here"
    assert (root / "d" / "synced").read_bytes() == b"b"
    assert (root / "d" / "named").read_bytes() == b""
    why = pc.explain(last)
    assert "unsynced: lost, its name in . was never made durable" in why
    assert "kept: the cut keeps an earlier file of that name: the rename onto it at #" in why
    assert "d/named: 0 of its 2 bytes survive the cut" in why
    assert "d/synced" not in why
    # A cut before the first step keeps the tree as it was.
    pc.materialise(pc.cuts()[0])
    assert sorted(os.listdir(root)) == ["d", "gone", "kept"] and not os.listdir(root / "d")
    # start, the fsyncs of two files and of one directory, the mark
    assert [c.what for c in pc.versions()] == ["start", "fsync", "fsync", "fsync", "mark"]
