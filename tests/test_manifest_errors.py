"""Errors a user can cause, and damage a checkpoint can suffer: each one a clear UserError.

Wrong target lists, missing or damaged manifests, flipped bytes, truncated or missing data files,
bad engine options and states that cannot be stored; and the replacement of a checkpoint by a
new save of the same name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import engines, layout
from bench.errors import ChecksumError, UserError

STRIPED = ("cpu-single", "cpu-double", "gds")
ALL = (*STRIPED, "torch-save", "dcp")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def random_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(60, 100, generator=g),  # 24000 bytes: several 8 KiB chunks
        "b": torch.randint(0, 1000, (77,), generator=g),
    }


def assert_equal_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(bits(got[k]), bits(want[k])), k


def manifest_json(dirs: list[str], name: str = "ckpt") -> dict[str, Any]:
    with open(Path(dirs[0]) / name / "manifest.json") as f:
        return json.load(f)


def data_file(dirs: list[str], t: int, name: str = "ckpt") -> Path:
    return Path(dirs[t]) / name / f"data-{t}.bin"


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


@pytest.mark.parametrize("engine", ["cpu-double"])
def test_damaged_manifest(saved, engine):
    eng, dirs = saved
    path = Path(dirs[0]) / "ckpt" / "manifest.json"
    path.write_text(path.read_text()[:-10])
    with pytest.raises(UserError) as e:
        eng.load("ckpt")
    assert str(path) in str(e.value) and "damaged" in str(e.value)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("engine", ["torch-save", "dcp"])
def test_baseline_missing_checkpoint(make_engine, targets, engine):
    eng = make_engine(engine, targets(1))
    with pytest.raises(UserError, match="no complete checkpoint 'nope'"):
        eng.load("nope")


# -- damaged data -------------------------------------------------------------------------


def flip_a_byte_of(dirs: list[str], tensor: str) -> tuple[Path, int]:
    """Flip one byte in the middle of the last extent of `tensor`; returns (file, tensor byte)."""
    m = manifest_json(dirs)
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


@pytest.mark.parametrize("engine", ["cpu-double"])
def test_missing_data_file(saved, engine):
    eng, dirs = saved
    path = data_file(dirs, 2)
    path.unlink()
    with pytest.raises(UserError) as e:
        eng.load("ckpt")
    assert "missing" in str(e.value) and str(path) in str(e.value)


# -- options, targets, names --------------------------------------------------------------


@pytest.mark.parametrize("engine", ALL)
def test_unknown_option_is_named(targets, engine):
    with pytest.raises(UserError) as e:
        engines.create(engine, targets(1), chunk_size="8KiB")
    assert "'chunk_size'" in str(e.value) and engine in str(e.value)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("chunk_bytes", "12 parsecs", "cannot read '12 parsecs' as a size"),
        ("chunk_bytes", "1000B", "multiple of 4096, got 1000"),
        ("chunk_bytes", 6000, "multiple of 4096, got 6000"),
        ("chunk_bytes", "0B", "must be positive"),
        ("threads_per_target", 0, "positive integer"),
        ("checksums", "yes", "true or false"),
        ("device", "tpu", "tpu"),
    ],
)
@pytest.mark.parametrize("engine", STRIPED)
def test_bad_option_values(targets, engine, option, value, says):
    with pytest.raises(UserError) as e:
        engines.create(engine, targets(1), **{option: value})
    assert says in str(e.value) and option in str(e.value)


def test_bad_gds_io(targets):
    with pytest.raises(UserError, match="io must be auto, kvikio or emulated, got 'fast'"):
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
    with pytest.raises(UserError) as e:
        eng.save({"w": torch.ones(3), **value}, "ckpt")
    assert f"{path}: " in str(e.value) and says in str(e.value)
    # Refused before anything was touched: the old checkpoint is still whole.
    assert_equal_state(eng.load("ckpt"), good)
    with pytest.raises(UserError):
        eng.save(value, "fresh")
    assert not any((Path(d) / "fresh").exists() for d in dirs)


# -- replacing a checkpoint ---------------------------------------------------------------


@pytest.mark.parametrize("engine", STRIPED)
def test_save_replaces_a_checkpoint_of_the_same_name(make_engine, targets, engine, monkeypatch):
    dirs = targets(3)
    eng = make_engine(engine, dirs, chunk_bytes="8KiB")
    eng.save(random_state(1), "ckpt").wait()
    old = manifest_json(dirs)

    manifest_present_during_writes = []
    write_piece = layout.write_piece

    def spy(fd: int, piece: layout.Piece, o_direct: bool) -> None:
        manifest_present_during_writes.append((Path(dirs[0]) / "ckpt" / "manifest.json").exists())
        write_piece(fd, piece, o_direct)

    monkeypatch.setattr(layout, "write_piece", spy)
    g = torch.Generator().manual_seed(2)
    new = {"x": torch.randn(3000, generator=g, dtype=torch.float64), "y": torch.arange(5)}
    eng.save(new, "ckpt").wait()

    assert manifest_present_during_writes and not any(manifest_present_during_writes)
    assert_equal_state(eng.load("ckpt"), new)
    m = manifest_json(dirs)
    assert m != old and [e["path"] for e in m["tensors"]] == ["['x']", "['y']"]
    for t, info in m["files"].items():
        assert data_file(dirs, int(t)).stat().st_size == info["bytes"]
