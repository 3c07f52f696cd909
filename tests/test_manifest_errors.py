"""Errors a user can cause, and damage a checkpoint can suffer: each one a clear UserError.

Wrong target lists, missing or damaged manifests, flipped bytes, truncated or missing data files,
bad engine options and states that cannot be stored; the replacement of a checkpoint by a
new save of the same name; and what interrupted saves leave behind (the real kills are in
tests/test_crash.py; here their leftovers are laid out by hand, for every engine).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ENGINES, RUNNABLE, STRIPED_ENGINES, assert_same_state, bits, read_manifest

from bench import engines
from bench.common.errors import ChecksumError, UserError
from bench.storage import generations, layout

STRIPED = STRIPED_ENGINES
ALL = RUNNABLE


def random_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(60, 100, generator=g),  # 24000 bytes: several 8 KiB chunks
        "b": torch.randint(0, 1000, (77,), generator=g),
    }


def data_file(dirs: list[str], t: int, name: str = "ckpt") -> Path:
    """Target t's data file of the committed checkpoint, as its manifest names it."""
    return Path(dirs[t]) / name / read_manifest(dirs, name)["files"][str(t)]["file"]


def listing(dirs: list[str], name: str = "ckpt") -> dict[str, list[str]]:
    """What every target's `NAME/` directory holds (missing directories left out), but for the
    target-list record, which every save leaves and test_engines.check_files checks."""
    return {
        d: sorted(set(os.listdir(Path(d) / name)) - {generations.TARGETS_RECORD})
        for d in dirs
        if (Path(d) / name).is_dir()
    }


@pytest.fixture
def saved(make_engine, targets, request):
    """An engine (named by the test's `engine` parameter) with `random_state()` saved as ckpt."""
    engine = request.node.callspec.params["engine"]
    dirs = targets(3)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    eng.save(random_state(), "ckpt").wait()
    return eng, dirs


# -- target lists -----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", STRIPED)
def test_other_targets_behind_the_first_are_refused(make_engine, targets, saved, engine):
    _, dirs = saved
    for other in ([dirs[0], dirs[2], dirs[1]], [dirs[0], *targets(2)], dirs[:2]):
        eng = make_engine(engine, other, chunk_bytes="8KiB")
        with pytest.raises(UserError) as e:
            eng.load("ckpt")
        msg = str(e.value)
        assert "checkpoint 'ckpt'" in msg
        assert str(dirs) in msg and str(other) in msg
        assert "same order" in msg


@pytest.mark.parametrize("engine", STRIPED)
def test_another_first_target_finds_no_checkpoint(make_engine, saved, engine):
    _, dirs = saved
    eng = make_engine(engine, [dirs[1], dirs[0], dirs[2]], chunk_bytes="8KiB")
    with pytest.raises(UserError) as e:
        eng.load("ckpt")
    msg = str(e.value)
    assert "'ckpt'" in msg
    assert os.path.join(dirs[1], "ckpt", "manifest.json") in msg
    assert "another first target" in msg


@pytest.mark.parametrize("engine", STRIPED)
def test_an_overlapping_target_list_cannot_destroy_a_checkpoint(make_engine, targets, engine):
    """X saves `ckpt` over [A, B]; Y, over [B, C] (or [B, A], or [A]), may neither save nor delete
    `ckpt`, nor `clean` it: B's stripe is X's. Nothing of Y's is written, X still loads."""
    a, b, c = targets(3)
    x = make_engine(engine, [a, b], chunk_bytes="8KiB")
    state = random_state()
    x.save(state, "ckpt").wait()
    before = listing([a, b, c])
    records = {d: (Path(d) / "ckpt" / generations.TARGETS_RECORD).read_text() for d in (a, b)}
    for other in ([b, c], [b, a], [a], [c, b]):
        y = make_engine(engine, other, chunk_bytes="8KiB")
        with pytest.raises(UserError) as e:
            y.save(random_state(seed=1), "ckpt")
        msg = str(e.value)
        assert "already holds checkpoint 'ckpt'" in msg and str([a, b]) in msg
        assert "same order" in msg
        with pytest.raises(UserError, match="already holds checkpoint 'ckpt'"):
            y.delete("ckpt")
        assert generations.leftovers(other, "ckpt") == []  # what `ckptbench clean` would remove
        assert listing([a, b, c]) == before
        assert {d: (Path(d) / "ckpt" / generations.TARGETS_RECORD).read_text() for d in (a, b)} == (
            records
        )
        assert not (Path(c) / "ckpt").exists()  # nothing of Y's was written
    assert_same_state(x.load("ckpt"), state)
    # X's own list still saves over it, and another name is free for Y
    x.save(random_state(seed=2), "ckpt").wait()
    y = make_engine(engine, [b, c], chunk_bytes="8KiB")
    y.save(state, "other").wait()
    assert_same_state(y.load("other"), state)
    assert_same_state(x.load("ckpt"), random_state(seed=2))


def test_a_garbled_claim_is_named_and_left_alone(make_engine, targets):
    a, b = targets(2)
    x = make_engine("cpu-double", [a, b], chunk_bytes="8KiB")
    x.save(random_state(), "ckpt").wait()
    record = Path(b) / "ckpt" / generations.TARGETS_RECORD
    record.write_text("{not json")
    with pytest.raises(UserError) as e:
        x.save(random_state(seed=1), "ckpt")
    assert str(record) in str(e.value) and "remove it by hand" in str(e.value)
    assert_same_state(x.load("ckpt"), random_state())


# -- manifests ----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", STRIPED)
def test_missing_manifest(saved, engine):
    eng, dirs = saved
    path = Path(dirs[0]) / "ckpt" / "manifest.json"
    path.unlink()
    with pytest.raises(UserError) as e:
        eng.load("ckpt")
    assert str(path) in str(e.value) and "'ckpt'" in str(e.value)
    with pytest.raises(UserError, match="never saved"):
        eng.load("other")


def change_a_shape_digit(text: str) -> str:
    """The manifest with one digit of a shape changed: still valid JSON, but wrong."""
    at = text.index('"shape":[') + len('"shape":[')
    assert text[at].isdigit()
    changed = text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :]
    json.loads(changed)  # the damage is invisible to a JSON parser
    return changed


def drop_the_checksum(text: str) -> str:
    d = json.loads(text)
    del d["manifest_xxh3"]
    return json.dumps(d, separators=(",", ":"))


DAMAGE = {
    "truncated": lambda text: text[:-10],
    "half": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "shape-digit": change_a_shape_digit,
    "no-checksum": drop_the_checksum,
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("engine", STRIPED)
def test_damaged_manifest(saved, engine, damage):
    eng, dirs = saved
    path = Path(dirs[0]) / "ckpt" / "manifest.json"
    text = path.read_text()
    path.write_text(DAMAGE[damage](text))
    with pytest.raises(UserError) as e:
        eng.load("ckpt")
    assert str(path) in str(e.value) and "manifest is damaged" in str(e.value)


@pytest.mark.parametrize("engine", ["cpu-double"])
def test_manifest_checksum_covers_every_byte(saved, engine):
    eng, dirs = saved
    path = Path(dirs[0]) / "ckpt" / "manifest.json"
    text = path.read_text()
    body = text[: text.index(',"manifest_xxh3"')]
    # Flip a character at a spread of places in the body (one at a time): never accepted.
    for at in range(1, len(body), max(1, len(body) // 25)):
        ch = body[at]
        other = "1" if ch != "1" else "2"
        path.write_text(text[:at] + other + text[at + 1 :])
        with pytest.raises(UserError, match="manifest is damaged"):
            eng.load("ckpt")
    path.write_text(text)
    assert_same_state(eng.load("ckpt"), random_state())


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
@pytest.mark.parametrize("engine", ["torch-save", "dcp"])
def test_baseline_missing_checkpoint(make_engine, targets, engine):
    eng = make_engine(engine, targets(1))
    with pytest.raises(UserError, match="checkpoint 'nope' does not exist"):
        eng.load("nope")
    assert eng.status("nope") == "absent"


# -- damaged data -------------------------------------------------------------------------


def flip_a_byte_of(dirs: list[str], tensor: str) -> tuple[Path, int]:
    """Flip one byte in the middle of the last extent of `tensor`; returns (file, tensor byte)."""
    m = read_manifest(dirs)
    entry = next(e for e in m["tensors"] if e["path"] == f"[{tensor!r}]")
    t, off, length = entry["extents"][-1]
    before = sum(x[2] for x in entry["extents"][:-1])
    path = data_file(dirs, t)
    with open(path, "r+b") as f:
        f.seek(off + length // 2)
        byte = f.read(1)[0]
        f.seek(off + length // 2)
        f.write(bytes([byte ^ 0xFF]))
    return path, before + length // 2


@pytest.mark.parametrize("engine", STRIPED)
def test_flipped_byte_is_a_checksum_error(saved, engine):
    eng, dirs = saved
    path, _ = flip_a_byte_of(dirs, "w")
    with pytest.raises(ChecksumError) as e:
        eng.load("ckpt")
    msg = str(e.value)
    assert "checkpoint 'ckpt'" in msg
    assert "state['w']" in msg and "state['b']" not in msg
    assert str(path) in msg


@pytest.mark.parametrize("engine", STRIPED)
def test_flipped_byte_without_checksums_lands_where_the_extents_say(make_engine, targets, engine):
    dirs = targets(3)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB", checksums=False)
    state = random_state()
    eng.save(state, "ckpt").wait()
    _, at = flip_a_byte_of(dirs, "w")
    got = bits(eng.load("ckpt")["w"])
    want = bits(state["w"])
    assert (got != want).nonzero().flatten().tolist() == [at]
    assert int(got[at]) == int(want[at]) ^ 0xFF


@pytest.mark.parametrize("engine", STRIPED)
def test_truncated_data_file(saved, engine):
    eng, dirs = saved
    path = data_file(dirs, 1)
    size = path.stat().st_size
    os.truncate(path, size - 1)
    with pytest.raises(UserError) as e:
        eng.load("ckpt")
    msg = str(e.value)
    assert "truncated" in msg and str(path) in msg and f"{size - 1} of {size} bytes" in msg


@pytest.mark.parametrize("t", [0, 2])
@pytest.mark.parametrize("engine", STRIPED)
def test_missing_data_file(saved, engine, t):
    eng, dirs = saved
    path = data_file(dirs, t)
    path.unlink()
    with pytest.raises(UserError) as e:
        eng.load("ckpt")
    msg = str(e.value)
    assert "checkpoint 'ckpt'" in msg and f"data file {path} is missing" in msg


# -- options, targets, names --------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_unknown_option_is_named(targets, engine):
    with pytest.raises(UserError) as e:
        engines.create(engine, targets(1), chunk_size="8KiB")
    assert str(e.value).startswith(f"engine {engine}: chunk_size: unknown key (known: ")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("chunk_bytes", "12 parsecs", "cannot read '12 parsecs' as a size"),
        ("chunk_bytes", "1000B", "multiple of 4096, got 1000"),
        ("chunk_bytes", 6000, "multiple of 4096, got 6000"),
        ("chunk_bytes", "0B", "must be positive"),
        ("threads_per_target", 0, "Input should be greater than 0, got 0"),
        ("checksums", "yes", "Input should be a valid boolean, got 'yes'"),
        ("device", "tpu", "Input should be 'auto', 'cuda' or 'host-emulated', got 'tpu'"),
    ],
)
@pytest.mark.parametrize("engine", STRIPED)
def test_bad_option_values(targets, engine, option, value, says):
    with pytest.raises(UserError) as e:
        engines.create(engine, targets(1), **{option: value})
    assert str(e.value).startswith(f"engine {engine}: {option}: ") and says in str(e.value)


def test_bad_gds_io(targets):
    with pytest.raises(
        UserError,
        match=r"^engine gds: io: Input should be 'auto', 'kvikio' or 'emulated', got 'fast'$",
    ):
        engines.create("gds", targets(1), io="fast")


def test_unknown_engine(targets):
    with pytest.raises(UserError) as e:
        engines.create("nvme-magic", targets(1))
    assert "'nvme-magic'" in str(e.value) and "cpu-single" in str(e.value)


def test_bad_targets(targets, scratch):
    a_file = scratch / "a-file"
    a_file.write_text("")
    missing = str(scratch / "missing")
    with pytest.raises(UserError, match="does not exist"):
        engines.create("cpu-double", [missing])
    with pytest.raises(UserError, match="is not a directory"):
        engines.create("cpu-double", [str(a_file)])
    dirs = targets(1)
    with pytest.raises(UserError, match="listed twice"):
        engines.create("cpu-double", [dirs[0], dirs[0]])
    with pytest.raises(UserError, match="at least one target"):
        engines.create("cpu-double", [])


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_bad_checkpoint_names(make_engine, targets, name):
    eng = make_engine("cpu-double", targets(1))
    with pytest.raises(UserError, match="checkpoint name"):
        eng.save(random_state(), name)


# -- what a state may hold ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path", "says"),
    [
        ({"opts": {"tags": {1, 2}}}, "state['opts']['tags']", "type set"),
        ({"opts": [1, object()]}, "state['opts'][1]", "type object"),
        ({"opts": {frozenset([1]): 2}}, "state['opts']", "key of type frozenset"),
        ({"sparse": torch.eye(3).to_sparse()}, "state['sparse']", "dense"),
    ],
    ids=["set", "object", "frozenset-key", "sparse"],
)
@pytest.mark.parametrize("engine", STRIPED)
def test_non_storable_value_is_named(make_engine, targets, engine, value, path, says):
    dirs = targets(2)
    eng = make_engine(engine, dirs)
    good = random_state()
    eng.save(good, "ckpt").wait()
    before = listing(dirs)
    with pytest.raises(UserError) as e:
        eng.save({"w": torch.ones(3), **value}, "ckpt")
    assert f"{path}: " in str(e.value) and says in str(e.value)
    # Refused before anything was touched: the old checkpoint is still whole, nothing added.
    assert listing(dirs) == before
    assert_same_state(eng.load("ckpt"), good)
    with pytest.raises(UserError):
        eng.save(value, "fresh")
    assert not any((Path(d) / "fresh").exists() for d in dirs)


# -- replacing a checkpoint ---------------------------------------------------------------


@pytest.mark.parametrize("engine", STRIPED)
def test_save_replaces_a_checkpoint_of_the_same_name(make_engine, targets, engine, monkeypatch):
    dirs = targets(3)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    reader = make_engine(engine, dirs, chunk_bytes="8KiB")  # another reader of the same targets
    old_state = random_state(1)
    eng.save(old_state, "ckpt").wait()
    old = read_manifest(dirs)
    old_files = [data_file(dirs, int(t)) for t in old["files"]]
    assert len(old_files) == 3

    # In the middle of the new save's writes, a reader still finds the old checkpoint, whole.
    during: list[tuple[Any, dict[str, Any], list[str]]] = []
    write_piece = layout.write_piece

    def spy(fd: int, piece: layout.Piece, o_direct: bool) -> None:
        write_piece(fd, piece, o_direct)
        try:
            loaded: Any = reader.load("ckpt")
        except Exception as e:  # recorded, asserted below
            loaded = e
        during.append((loaded, read_manifest(dirs), sorted(os.listdir(Path(dirs[0]) / "ckpt"))))

    monkeypatch.setattr(layout, "write_piece", spy)
    g = torch.Generator().manual_seed(2)
    new = {"x": torch.randn(3000, generator=g, dtype=torch.float64), "y": torch.arange(5)}
    result = eng.save(new, "ckpt").wait()

    assert len(during) >= 3  # the new save wrote a piece to every target
    for loaded, m, files in during:
        assert not isinstance(loaded, Exception), loaded
        assert_same_state(loaded, old_state)
        assert m == old
        # The new generation is written beside the old one, its marker with it.
        assert f"data-0.{result.save_id}.bin" in files
        assert f".saving-{result.save_id}" in files
        assert "manifest.json" in files and old["files"]["0"]["file"] in files

    assert_same_state(eng.load("ckpt"), new)
    assert_same_state(reader.load("ckpt"), new)
    m = read_manifest(dirs)
    assert m["save_id"] == result.save_id != old["save_id"]
    assert [e["path"] for e in m["tensors"]] == ["['x']", "['y']"]
    # The old generation is gone; each target holds the new data file (and the manifest) only.
    assert not any(p.exists() for p in old_files)
    want = {
        d: sorted(
            ([m["files"][str(t)]["file"]] if str(t) in m["files"] else [])
            + (["manifest.json"] if t == 0 else [])
        )
        for t, d in enumerate(dirs)
    }
    assert listing(dirs) == want
    for t, info in m["files"].items():
        assert data_file(dirs, int(t)).stat().st_size == info["bytes"]
    assert eng.status("ckpt") == "complete"


# -- what interrupted saves leave ---------------------------------------------------------

# A marker of a save whose process is gone (no pid is this large).
DEAD = json.dumps({"pid": 2**30, "host": socket.gethostname()})
KILLED = "0123456789abcdef"  # the SAVEID of a save killed midway


def leave_interrupted_save(engine: str, dirs: list[str], name: str, save_id: str) -> list[str]:
    """Lay out what a save of `name` killed before its commit leaves; returns the paths."""
    paths = []
    used = dirs if engine in STRIPED else dirs[:1]
    for t, d in enumerate(used):
        ckpt = Path(d) / name
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / f".saving-{save_id}").write_text(DEAD)
        if engine in STRIPED:
            (ckpt / f"data-{t}.{save_id}.bin").write_bytes(b"half a stripe")
            paths += [str(ckpt / f".saving-{save_id}"), str(ckpt / f"data-{t}.{save_id}.bin")]
        else:
            (ckpt / f"gen-{save_id}").mkdir()
            (ckpt / f"gen-{save_id}" / "partial").write_bytes(b"half a file")
            paths += [str(ckpt / f".saving-{save_id}"), str(ckpt / f"gen-{save_id}")]
    return sorted(paths)


def names_in(dirs: list[str], name: str) -> dict[str, list[str]]:
    return listing(dirs, name)


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
@pytest.mark.parametrize("engine", ALL)
def test_interrupted_save_keeps_the_old_checkpoint_and_is_cleaned(make_engine, targets, engine):
    dirs = targets(2)
    eng = make_engine(engine, dirs, **({"chunk_bytes": "8KiB"} if engine in STRIPED else {}))
    old = random_state(1)
    eng.save(old, "ckpt").wait()
    committed = names_in(dirs, "ckpt")
    left = leave_interrupted_save(engine, dirs, "ckpt", KILLED)
    assert eng.status("ckpt") == "complete"
    assert sorted(generations.leftovers(dirs, "ckpt")) == left
    assert_same_state(eng.load("ckpt"), old)
    # The next save of the name removes them; afterwards only its own generation is there.
    new = random_state(2)
    eng.save(new, "ckpt").wait()
    assert generations.leftovers(dirs, "ckpt") == []
    assert not any(os.path.exists(p) for p in left)
    assert_same_state(eng.load("ckpt"), new)
    assert {d: len(files) for d, files in names_in(dirs, "ckpt").items()} == {
        d: len(files) for d, files in committed.items()
    }


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
@pytest.mark.parametrize("engine", ALL)
def test_interrupted_first_save_is_incomplete(make_engine, targets, engine):
    dirs = targets(2)
    eng = make_engine(engine, dirs)
    left = leave_interrupted_save(engine, dirs, "fresh", KILLED)
    assert eng.status("fresh") == "incomplete"
    with pytest.raises(UserError, match="checkpoint 'fresh' is incomplete: a save was interrupted"):
        eng.load("fresh")
    state = random_state(3)
    eng.save(state, "fresh").wait()
    assert eng.status("fresh") == "complete"
    assert generations.leftovers(dirs, "fresh") == []
    assert not any(os.path.exists(p) for p in left)
    assert_same_state(eng.load("fresh"), state)


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
@pytest.mark.parametrize("engine", ALL)
def test_marker_of_a_committed_save_goes_with_its_generation(make_engine, targets, engine):
    """A kill after the commit but before the save removed its marker leaves a marker of the
    committed generation: not a leftover while that generation is committed, and removed with
    it by the next save (not one save later)."""
    dirs = targets(2)
    eng = make_engine(engine, dirs)
    first = eng.save(random_state(1), "ckpt").wait()
    committed = names_in(dirs, "ckpt")
    used = dirs if engine in STRIPED else dirs[:1]
    for d in used:
        (Path(d) / "ckpt" / f".saving-{first.save_id}").write_text(DEAD)
    assert generations.leftovers(dirs, "ckpt") == []
    assert eng.status("ckpt") == "complete"
    second = eng.save(random_state(2), "ckpt").wait()
    assert generations.leftovers(dirs, "ckpt") == []
    after = names_in(dirs, "ckpt")
    assert not any(first.save_id in f for files in after.values() for f in files), after
    assert {d: len(files) for d, files in after.items()} == {
        d: len(files) for d, files in committed.items()
    }
    assert all(second.save_id in "".join(files) for d, files in after.items() if files)


@pytest.mark.parametrize("engine", ["cpu-single", "cpu-double"])
def test_the_leftover_scan_and_the_marker_wait_until_the_stall_is_over(
    make_engine, targets, monkeypatch, engine
):
    """The stall is the snapshot: cleaning what interrupted saves left and marking this save
    running happen in the background, before the first data file, not while training waits.
    The scan is held until save() has returned; the old layout (scan inside save()) fails the
    hold's wait."""
    dirs = targets(2)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB", overlap=False)
    eng.save(random_state(1), "ckpt").wait()
    left = leave_interrupted_save(engine, dirs, "ckpt", KILLED)
    returned, scanning = threading.Event(), threading.Event()
    real = generations.leftovers

    def held(*args: Any, **kwargs: Any) -> list[str]:
        scanning.set()
        assert returned.wait(30), "the leftover scan ran inside save()"
        return real(*args, **kwargs)

    monkeypatch.setattr(generations, "leftovers", held)
    new = random_state(2)
    pending = eng.save(new, "ckpt")
    returned.set()
    assert scanning.wait(30)
    result = pending.wait()
    monkeypatch.setattr(generations, "leftovers", real)
    assert not any(os.path.exists(p) for p in left)
    assert generations.leftovers(dirs, "ckpt") == []
    assert read_manifest(dirs)["save_id"] == result.save_id
    assert_same_state(eng.load("ckpt"), new)
