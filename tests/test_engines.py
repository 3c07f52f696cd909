"""Round trips through every engine: bit-exact tensors, preserved structure, honest results.

The striped engines (cpu-single, cpu-double, gds) must give back exactly what they were given:
the same keys with the same key types, the same container types (dict vs OrderedDict, list vs
tuple), the same plain values, and tensors with the same dtype, shape and bytes. The baselines
are held to what their libraries promise (dcp turns integer keys into strings).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import STRIPED_ENGINES, bits, read_manifest

from bench.engines.base import SaveResult
from bench.engines.gds import coalesce_window
from bench.measure.detail import DcpDetail

STRIPED = STRIPED_ENGINES
SNAPSHOT = ("cpu-single", "cpu-double")
DTYPES = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.uint8,
    torch.int64,
    torch.bool,
    torch.complex64,
)
MiB = 1 << 20
NO_GDS_MODE = SaveResult(name="", bytes=0).gds_mode


# -- helpers ----------------------------------------------------------------------------------


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A tensor of random bit patterns (NaNs with payloads included), valid 0/1 for bool."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    esize = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (math.prod(shape) * esize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def inside_one_chunk(t: torch.Tensor, chunk: int) -> torch.Tensor:
    """A copy of contiguous `t` whose memory starts at a multiple of `chunk` (a view of a larger
    buffer), so that no chunk boundary of the address space cuts it."""
    nbytes = t.numel() * t.element_size()
    assert nbytes <= chunk
    buf = torch.empty(2 * chunk, dtype=torch.uint8)
    start = -buf.data_ptr() % chunk
    out = buf[start : start + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % chunk == 0
    return out


def iter_tensors(obj: Any, path: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    """(key path, tensor) for every tensor in a state tree, in order."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_tensors(v, (*path, k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from iter_tensors(v, (*path, i))


def payload(state: Any) -> int:
    return sum(t.numel() * t.element_size() for _, t in iter_tensors(state))


def assert_same_tensor(got: Any, want: torch.Tensor, where: str) -> None:
    assert isinstance(got, torch.Tensor), f"{where}: got a {type(got).__name__}, not a tensor"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.device.type == "cpu", f"{where}: loaded onto {got.device}"
    assert torch.equal(bits(got), bits(want)), f"{where}: bytes differ"


def assert_same(got: Any, want: Any, where: str = "state") -> None:
    """Bit-exact equality of two state trees, container and key types included."""
    if isinstance(want, torch.Tensor):
        assert_same_tensor(got, want, where)
        return
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert [(type(k), k) for k in got] == [(type(k), k) for k in want], f"{where}: keys differ"
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def clone_tree(obj: Any) -> Any:
    """A deep copy whose tensors own their memory (to compare against after the source changes)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return type(obj)((k, clone_tree(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(clone_tree(v) for v in obj)
    return obj


def check_files(dirs: list[str], name: str) -> dict[str, Any]:
    """The on-disk layout matches the manifest; returns the manifest as JSON.

    Each target holds exactly this save's data file (`data-i.SAVEID.bin`, named in the manifest)
    if it holds data, the record of the target list (`.targets`), the first one also the
    manifest, and nothing else: no marker of the save, no temp file, no file of an older
    generation.
    """
    m = read_manifest(dirs, name)
    files = m["files"]
    save_id = m["save_id"]
    assert re.fullmatch(r"[0-9a-f]{16}", save_id), save_id
    for i, d in enumerate(dirs):
        expected = []
        if str(i) in files:
            assert files[str(i)]["file"] == f"data-{i}.{save_id}.bin"
            expected.append(f"data-{i}.{save_id}.bin")
            size = os.path.getsize(Path(d) / name / f"data-{i}.{save_id}.bin")
            assert size == files[str(i)]["bytes"], f"target {i}: file has {size} bytes"
        if i == 0:
            expected.append("manifest.json")
        expected.append(".targets")
        record = json.loads((Path(d) / name / ".targets").read_text())
        assert record == {"targets": [os.path.realpath(x) for x in dirs]}, f"target {i}"
        assert sorted(os.listdir(Path(d) / name)) == sorted(expected), f"target {i}"
    # Extents: inside their files, never overlapping, adding up to each tensor.
    per_file: dict[int, list[tuple[int, int]]] = {}
    for e in m["tensors"]:
        assert sum(x[2] for x in e["extents"]) == e["nbytes"], e["path"]
        for t, off, length in e["extents"]:
            assert length > 0 and off >= 0, e["path"]
            assert off + length <= files[str(t)]["bytes"], e["path"]
            per_file.setdefault(t, []).append((off, off + length))
    for t, spans in per_file.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"target {t}: overlapping extents"
    assert sorted(int(t) for t in files) == sorted(per_file)
    return m


def check_result(result: Any, eng: Any, state: Any, name: str, dirs: list[str]) -> None:
    """Fields of a SaveResult that can be checked against the state and the disk."""
    assert result.name == name
    assert result.bytes == payload(state)
    # (when the stall ends and what persists after it: test_persisting_goes_on_after_save_returns)
    m = check_files(dirs, name)
    assert m["payload_bytes"] == result.bytes
    assert m["save_id"] == result.save_id
    data_files = [
        i
        for i, d in enumerate(dirs)
        if (Path(d) / name / f"data-{i}.{result.save_id}.bin").exists()
    ]
    assert result.targets_used == len(data_files) == len(m["files"])
    assert result.checksums is eng.options.checksums
    assert (m["checksums"] == "xxh3_64") is eng.options.checksums
    assert all((e["xxh3"] is not None) is eng.options.checksums for e in m["tensors"])
    non_contiguous = sum(not t.is_contiguous() for _, t in iter_tensors(state))
    if eng.name == "gds":
        assert result.gds_mode == "emulated"
        # Tensors under coalesce_below are copied into the coalescing buffer whatever their
        # strides; of the others, a strided one needs a contiguous copy first.
        below = min(eng.options.coalesce_below, coalesce_window(eng.options) + 1)
        sizes = [(t.numel() * t.element_size(), t) for _, t in iter_tensors(state)]
        small = [t for n, t in sizes if 0 < n < below]
        assert result.copied_tensors == sum(
            not t.is_contiguous() for n, t in sizes if not 0 < n < below
        )
        assert result.detail.coalesced_tensors == len(small)
        assert result.detail.coalesced_bytes == sum(t.numel() * t.element_size() for t in small)
        del non_contiguous
    else:
        # The other engines say they have no GDS mode, with SaveResult's default.
        assert result.gds_mode == NO_GDS_MODE
        assert result.copied_tensors == 0


def roundtrip(make_engine: Any, dirs: list[str], engine: str, state: Any, **opts: Any) -> Any:
    """Save `state`, wait, check the result and files, load; returns (result, loaded)."""
    eng = make_engine(engine, dirs, **opts)
    result = eng.save(state, "ckpt").wait()
    check_result(result, eng, state, "ckpt", dirs)
    return result, eng.load("ckpt")


def training_state() -> dict[str, Any]:
    """A model's state_dict and an AdamW state_dict after one step, with plain values around."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 8)).square().sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "step": 1,
        "loss_scale": 65536.0,
        "run": OrderedDict([("name", "unit"), ("resumed", False), ("parent", None)]),
        "history": [(0, 1.5), (1, 0.75)],
        (3, "tuple-key"): [torch.arange(4), None, ("nested", torch.ones(2, dtype=torch.bool))],
    }


# -- striped engines --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("engine", STRIPED)
def test_dtypes_round_trip(make_engine, targets, engine, dtype):
    t = random_tensor((37, 53), dtype, seed=1)
    state = OrderedDict(
        [("t", t), ("scalar", random_tensor((), dtype, seed=2)), ("row", t[5].clone())]
    )
    _, loaded = roundtrip(make_engine, targets(2), engine, state, chunk_bytes="8KiB")
    assert_same(loaded, state)


@pytest.mark.parametrize("chunk", ["8KiB", "16MiB"])
@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * MiB + 1])
@pytest.mark.parametrize("engine", STRIPED)
def test_sizes_round_trip(make_engine, targets, engine, size, chunk):
    # A small tensor after the sized one checks where the next tensor starts.
    state = {"x": random_tensor((size,), torch.uint8, seed=size), "after": torch.arange(25)}
    _, loaded = roundtrip(make_engine, targets(2), engine, state, chunk_bytes=chunk)
    assert_same(loaded, state)


@pytest.mark.parametrize("engine", STRIPED)
def test_non_contiguous_round_trip(make_engine, targets, engine):
    base = random_tensor((64, 96), torch.float32, seed=3)
    flat = random_tensor((20000,), torch.int64, seed=4)
    state = {
        "transposed": base.t(),
        "rows": base[::3],
        "cols": base[:, 1::2],
        "expanded": random_tensor((4, 1), torch.float16, seed=5).expand(4, 300),
        "channels_last": random_tensor((2, 3, 8, 8), torch.bfloat16, seed=6).to(
            memory_format=torch.channels_last
        ),
        # Contiguous but starting at an odd address: the direct path's unaligned head.
        "offset_view": flat[3:17003],
        "contiguous": base,
    }
    assert sum(not t.is_contiguous() for t in state.values()) == 5
    _, loaded = roundtrip(make_engine, targets(3), engine, state, chunk_bytes="8KiB")
    assert_same(loaded, state)
    assert all(t.is_contiguous() for t in loaded.values())


@pytest.mark.parametrize("engine", STRIPED)
def test_zero_dim_and_empty_round_trip(make_engine, targets, engine):
    state = {
        "f": torch.tensor(-0.0),
        "i": torch.tensor(-(2**62), dtype=torch.int64),
        "b": torch.tensor(True),
        "c": torch.tensor(1 - 2j, dtype=torch.complex64),
        "empty": torch.empty(0),
        "empty_3d": torch.empty(3, 0, 5, dtype=torch.float64),
        "empty_bool": torch.empty(0, dtype=torch.bool),
    }
    _, loaded = roundtrip(make_engine, targets(2), engine, state, chunk_bytes="8KiB")
    assert_same(loaded, state)


@pytest.mark.parametrize("engine", STRIPED)
def test_no_bytes_at_all(make_engine, targets, engine):
    state = {"empty": torch.empty(0, 4), "nothing": [], "n": None}
    result, loaded = roundtrip(make_engine, targets(2), engine, state)
    assert result.bytes == 0 and result.targets_used == 0
    assert_same(loaded, state)


@pytest.mark.parametrize("engine", STRIPED)
def test_training_state_round_trip(make_engine, targets, engine):
    state = training_state()
    _, loaded = roundtrip(make_engine, targets(2), engine, state, chunk_bytes="8KiB")
    assert_same(loaded, state)
    # The points most likely to go wrong, spelt out.
    assert type(loaded["model"]) is OrderedDict
    assert list(loaded["optim"]["state"]) == list(range(6))
    assert isinstance(loaded["optim"]["param_groups"][0]["betas"], tuple)
    assert loaded["optim"]["param_groups"][0]["foreach"] is None
    assert loaded["model"]["1.num_batches_tracked"].dtype == torch.int64


@pytest.mark.parametrize("engine", STRIPED)
def test_no_reference_cycle_keeps_a_restored_state_alive(make_engine, targets, engine):
    """With the cyclic collector off, a restored state is freed as soon as the caller drops
    it: save, load, check and compare leave no cycle that holds its tensors. Such a cycle (in
    flatten) was freed by a later collection, inside a later save's stall (bench/PERF.md)."""
    import gc
    import weakref

    from bench.storage import verify

    state = training_state()
    eng = make_engine(engine, targets(2), chunk_bytes="8KiB")
    eng.save(state, "ckpt").wait()
    gc.collect()
    gc.disable()
    try:
        loaded = eng.load("ckpt", checksums=False)
        eng.check("ckpt", loaded)
        assert verify.first_difference(state, loaded) is None
        refs = [weakref.ref(t) for _, t in iter_tensors(loaded)]
        assert refs
        del loaded
        assert [r for r in refs if r() is not None] == []
    finally:
        gc.enable()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("engine", STRIPED)
def test_targets_round_trip(make_engine, targets, engine, n):
    sizes = [1, 4096, 5000, 12289, 30000, 3, 8192, 20000]
    state = {f"p{i}": random_tensor((s,), torch.uint8, seed=i) for i, s in enumerate(sizes)}
    dirs = targets(n)
    result, loaded = roundtrip(make_engine, dirs, engine, state, chunk_bytes="8KiB")
    assert_same(loaded, state)
    assert result.targets_used == n
    if n > 1:
        # Chunks smaller than the tensors: some tensor really lies on several targets.
        m = read_manifest(dirs, "ckpt")
        assert max(len({x[0] for x in e["extents"]}) for e in m["tensors"]) > 1


@pytest.mark.parametrize("engine", STRIPED)
def test_small_state_uses_one_of_four_targets(make_engine, targets, engine):
    # gds cuts tensors at addresses that are multiples of the chunk: keep this one inside one.
    state = {"w": inside_one_chunk(random_tensor((100,), torch.float32, seed=7), 8192)}
    dirs = targets(4)
    result, loaded = roundtrip(make_engine, dirs, engine, state, chunk_bytes="8KiB")
    assert_same(loaded, state)
    assert result.targets_used == 1
    assert list(read_manifest(dirs, "ckpt")["files"]) == ["0"]
    assert (Path(dirs[0]) / "ckpt" / f"data-0.{result.save_id}.bin").exists()


@pytest.mark.parametrize("engine", STRIPED)
def test_checksums_off(make_engine, targets, engine):
    state = {"w": random_tensor((3000,), torch.float64, seed=8)}
    result, loaded = roundtrip(make_engine, targets(2), engine, state, checksums=False)
    assert result.checksums is False
    assert_same(loaded, state)


def test_copy_tasks_split_large_and_batch_small_pairs():
    import numpy as np

    from bench.storage.staging import copy_tasks

    sizes = [10, 3, 25, 0, 4, 4]
    pairs = [(np.zeros(n, np.uint8), np.full(n, i + 1, np.uint8)) for i, n in enumerate(sizes)]
    tasks = copy_tasks(pairs, 8)
    # every task but the last holds at least a piece; no slice is longer than a piece
    assert all(sum(s.nbytes for _, s in t) >= 8 for t in tasks[:-1])
    assert all(s.nbytes <= 8 for t in tasks for _, s in t)
    # the slices cover every pair exactly once, in order
    flat = np.concatenate([s for t in tasks for _, s in t])
    assert flat.tolist() == np.concatenate([s for _, s in pairs]).tolist()
    for t in tasks:
        for d, s in t:
            np.copyto(d, s)
    assert all((d == s).all() for d, s in pairs)


@pytest.mark.parametrize("copy_threads", [1, 3])
@pytest.mark.parametrize("engine", SNAPSHOT)
def test_parallel_snapshot_is_complete_when_save_returns(
    make_engine, targets, engine, copy_threads
):
    """Several 8 MiB copy pieces over a thread pool: every byte is in staging when save()
    returns, so zeroing the tensors right after cannot reach the checkpoint."""
    state = {f"big{i}": random_tensor((7 * MiB + 13 * i,), torch.uint8, seed=i) for i in range(4)}
    state["small"] = [random_tensor((1000 + i,), torch.float32, seed=50 + i) for i in range(200)]
    want = clone_tree(state)
    eng = make_engine(engine, targets(2), copy_threads=copy_threads)
    pending = eng.save(state, "ckpt")
    for t in [*(state[f"big{i}"] for i in range(4)), *state["small"]]:
        t.zero_()
    pending.wait()
    assert_same(eng.load("ckpt"), want)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("engine", SNAPSHOT)
def test_overlapped_and_serial_snapshots_round_trip(make_engine, targets, engine, overlap):
    """Both ways to persist a snapshot, whichever `auto` picks on this host: chunks written
    as they land in staging (overlap), or after the whole copy; strided, empty and chunk-
    straddling tensors over 3 targets, zeroed as soon as save() returns."""
    base = random_tensor((64, 96), torch.float32, seed=3)
    state = {
        "big": random_tensor((3 * MiB + 4097,), torch.uint8, seed=1),
        "transposed": base.t(),
        "empty": torch.empty(0),
        "small": [random_tensor((1000 + i,), torch.float32, seed=50 + i) for i in range(40)],
        "tail": random_tensor((8191,), torch.int16, seed=2),
    }
    want = clone_tree(state)
    eng = make_engine(engine, targets(3), overlap=overlap, chunk_bytes="64KiB", copy_threads=2)
    assert eng.overlap is overlap
    pending = eng.save(state, "ckpt")
    for t in [state["big"], base, *state["small"], state["tail"]]:
        t.zero_()
    result = pending.wait()
    assert result.detail.overlap is overlap
    assert_same(eng.load("ckpt"), want)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", SNAPSHOT)
def test_overlap_waits_for_a_strided_device_copy(make_engine, targets, engine):
    """On CUDA a strided tensor goes into staging by one asynchronous copy before the chunks:
    a chunk that holds only its bytes must not be written before that copy has landed."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    base = random_tensor((4096, 4096), torch.float32, seed=21).to("cuda")  # 64 MiB
    state = {"transposed": base.t(), "tail": random_tensor((4097,), torch.uint8, seed=22)}
    want = {k: v.cpu().clone() for k, v in state.items()}
    eng = make_engine(engine, targets(2), device="cuda", overlap=True, chunk_bytes="1MiB")
    for k in range(2):  # the second save into staging that holds the first one's bytes
        result = eng.save(state, f"ckpt{k}").wait()
        assert result.detail.overlap is True
        assert_same(eng.load(f"ckpt{k}"), want)
        base.add_(1)
        want["transposed"] = base.t().cpu().clone()


@pytest.mark.parametrize("engine", SNAPSHOT)
def test_overlap_auto_leaves_the_copy_its_cores(make_engine, targets, engine, monkeypatch):
    """auto: overlapped only when the copy threads leave a CPU for the writes (host copies)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert make_engine(engine, targets(1), overlap="auto", copy_threads=4).overlap is False
    assert make_engine(engine, targets(1), overlap="auto", copy_threads=3).overlap is True
    assert make_engine(engine, targets(1), overlap="auto", copy_threads=0).overlap is False
    # the defaults: cpu-single decides by the cores, cpu-double keeps its buffered writes apart
    assert make_engine(engine, targets(1), copy_threads=1).overlap is (engine == "cpu-single")


HANG_S = 60  # a deadline that only catches a hang


class WriteGate:
    """Holds every write of the striped engines (bench.storage.layout.write_piece) until `open()`:
    what an engine does while no byte can reach the disk is then a matter of order, not of
    speed. `held` is set when the first write waits at the gate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from bench.storage import layout

        self.held, self._open = threading.Event(), threading.Event()
        self.opened_at = 0.0
        real = layout.write_piece

        def write_piece(fd: int, piece: Any, o_direct: bool) -> None:
            if not self._open.is_set():
                self.held.set()
                assert self._open.wait(HANG_S), "the gate was never opened"
            real(fd, piece, o_direct)

        monkeypatch.setattr(layout, "write_piece", write_piece)

    def open(self) -> None:
        self.opened_at = time.perf_counter()
        self._open.set()


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
@pytest.mark.parametrize("engine", SNAPSHOT)
def test_persisting_goes_on_after_save_returns(make_engine, targets, monkeypatch, engine, overlap):
    """The snapshot engines' save() returns while no write has reached the disk: the bytes are
    persisted afterwards, from staging (the tensors, zeroed by then, are not read again); the
    checkpoint is committed only once they are written; persist_s holds that wait."""
    state = {"w": random_tensor((256, 1024), torch.float32, seed=9), "b": torch.arange(999)}
    want = clone_tree(state)
    dirs = targets(2)
    eng = make_engine(engine, dirs, chunk_bytes="64KiB", overlap=overlap, copy_threads=2)
    gate = WriteGate(monkeypatch)
    t_call = time.perf_counter()
    pending = eng.save(state, "ckpt")
    t_return = time.perf_counter()
    for t in state.values():  # training goes on: the checkpoint must not see these changes
        t.zero_()
    assert gate.held.wait(HANG_S), "nothing was written after save() returned"
    assert not pending.done()
    assert not (Path(dirs[0]) / "ckpt" / "manifest.json").exists()
    assert eng.status("ckpt") == "incomplete"  # its files are there, uncommitted
    gate.open()
    result = pending.wait()
    assert_same(eng.load("ckpt"), want)
    assert result.stall_s <= t_return - t_call
    assert result.total_s >= gate.opened_at - t_call
    assert result.persist_s >= gate.opened_at - t_return


def _file_mappings(paths: list[str]) -> list[tuple[int, int]]:
    """Address ranges of this process that map any of `paths` (/proc/self/maps)."""
    real = {os.path.realpath(p) for p in paths}
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and os.path.realpath(parts[5]) in real:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


@pytest.mark.parametrize("engine", ["torch-save", "safetensors", "dcp", "dlio-style"])
def test_a_fresh_baseline_restore_owns_its_memory(make_engine, targets, engine):
    """A fresh restore of a baseline has read every byte when load() returns: its tensors live
    in the process's own memory, none in a mapping of the checkpoint's files (a lazily mapped
    tensor would leave the reading to its first touch, after the timed restore)."""
    state = {f"w{i}": random_tensor((MiB,), torch.float32, seed=30 + i) for i in range(3)}
    want = clone_tree(state)
    eng = make_engine(engine, targets(1))
    eng.save(state, "ckpt").wait()
    files = eng.cached_files("ckpt")
    loaded = eng.load("ckpt")
    maps = _file_mappings(files)
    for k, t in loaded.items():
        p = t.untyped_storage().data_ptr()
        assert not any(lo <= p < hi for lo, hi in maps), f"{engine}: {k} is a file mapping"
    assert_same(loaded, want)


@pytest.mark.parametrize("engine", ["gds", "torch-save", "safetensors"])
def test_a_durable_stall_returns_with_the_checkpoint_committed(make_engine, targets, engine):
    """The engines whose stall is the durable write: when save() returns, nothing is left in
    flight and the checkpoint loads."""
    state = {"w": random_tensor((5000,), torch.float32, seed=10)}
    want = clone_tree(state)
    eng = make_engine(engine, targets(2))
    pending = eng.save(state, "ckpt")
    assert pending.done()
    for t in state.values():
        t.zero_()
    assert eng.status("ckpt") == "complete"
    assert_same(eng.load("ckpt"), want)
    result = pending.wait()
    assert result.persist_s == 0.0 and result.total_s == result.stall_s > 0


@pytest.mark.parametrize("grows", [False, True], ids=["same-size", "grows"])
@pytest.mark.parametrize("engine", SNAPSHOT)
def test_back_to_back_saves_share_staging_safely(make_engine, targets, monkeypatch, engine, grows):
    first = {"a": random_tensor((4 * MiB,), torch.uint8, seed=11)}
    second = {"a": random_tensor((4 * MiB,), torch.uint8, seed=12)}
    if grows:
        second["b"] = random_tensor((MiB,), torch.uint8, seed=13)
    eng = make_engine(engine, targets(2), chunk_bytes="64KiB")
    gate = WriteGate(monkeypatch)
    p1 = eng.save(first, "first")
    assert gate.held.wait(HANG_S)
    # The staging buffer holds `first` until it is durable: the next save must wait for it,
    # however long that takes. (A save that did not wait returns at once; the grace only
    # gives it the time to show that, a correct one waits for the gate whatever the grace.)
    returned = threading.Event()
    got: list[Any] = []

    def second_save() -> None:
        t_call = time.perf_counter()
        got.append((eng.save(second, "second"), t_call, time.perf_counter()))
        returned.set()

    thread = threading.Thread(target=second_save)
    thread.start()
    returned.wait(0.5)
    gate.open()
    thread.join(HANG_S)
    p2, t_call, t_return = got[0]
    assert t_return >= gate.opened_at, "the second save did not wait for the first"
    r1, r2 = p1.wait(), p2.wait()
    assert r1.staging_grew and r2.staging_grew is grows
    assert r2.wait_prev_s >= gate.opened_at - t_call
    assert r2.stall_s >= r2.wait_prev_s
    assert_same(eng.load("first"), first)
    assert_same(eng.load("second"), second)


@pytest.mark.parametrize("engine", SNAPSHOT)
def test_warm_allocates_staging_before_the_save(make_engine, targets, engine):
    state = {"w": random_tensor((100000,), torch.uint8, seed=13)}
    cold = make_engine(engine, targets(1))
    assert cold.save(state, "a").wait().staging_grew
    again = cold.save(state, "b").wait()
    assert not again.staging_grew
    assert again.pinned_bytes >= 100000
    warmed = make_engine(engine, targets(1))
    warmed.warm(state)
    assert not warmed.save(state, "a").wait().staging_grew


CHILD = """
import hashlib, json, sys
import torch
from bench.engines import create

eng = create(sys.argv[1], json.loads(sys.argv[2]), **json.loads(sys.argv[3]))
state = eng.load(sys.argv[4])
eng.close()
digest = {
    k: [str(v.dtype), list(v.shape),
        hashlib.sha256(v.contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()]
    for k, v in state.items()
}
print(json.dumps(digest))
"""


def test_another_process_loads_the_checkpoint(make_engine, targets, scratch):
    state = {
        "w": random_tensor((300, 70), torch.float32, seed=14).t(),
        "h": random_tensor((4097,), torch.bfloat16, seed=15),
        "n": torch.tensor(42),
    }
    dirs = targets(3)
    opts = {"chunk_bytes": "8KiB"}
    eng = make_engine("cpu-single", dirs, **opts)
    eng.save(state, "shared").wait()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "cpu-single", json.dumps(dirs), json.dumps(opts), "shared"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=scratch,
    )
    assert out.returncode == 0, out.stderr
    want = {
        k: [str(v.dtype), list(v.shape), hashlib.sha256(bits(v).numpy()).hexdigest()]
        for k, v in state.items()
    }
    assert json.loads(out.stdout) == want


# -- baselines --------------------------------------------------------------------------------


def baseline_state() -> dict[str, Any]:
    state = training_state()
    del state[(3, "tuple-key")]  # dcp keys must be strings or ints
    state["extra"] = {
        "transposed": random_tensor((30, 20), torch.float32, seed=16).t(),
        "half": random_tensor((4097,), torch.float16, seed=17),
        "scalar": torch.tensor(7, dtype=torch.int64),
    }
    return state


def check_baseline_result(result: Any, state: Any, name: str) -> None:
    assert result.name == name
    assert result.bytes == payload(state)
    assert result.targets_used == 1


def check_baseline_files(dirs: list[str], name: str, result: Any) -> list[str]:
    """`NAME/` holds the pointer `current` naming this save and its generation directory only;
    returns the generation's file names."""
    d = Path(dirs[0]) / name
    assert re.fullmatch(r"[0-9a-f]{16}", result.save_id), result.save_id
    assert sorted(os.listdir(d)) == ["current", f"gen-{result.save_id}"]
    assert (d / "current").read_text() == result.save_id
    for other in dirs[1:]:
        assert not os.path.exists(Path(other) / name)
    return sorted(os.listdir(d / f"gen-{result.save_id}"))


def test_torch_save_round_trip(make_engine, targets):
    state = baseline_state()
    dirs = targets(2)
    eng = make_engine("torch-save", dirs)
    result = eng.save(state, "ckpt").wait()
    check_baseline_result(result, state, "ckpt")
    assert check_baseline_files(dirs, "ckpt", result) == ["state.pt"]
    assert_same(eng.load("ckpt"), state)


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
def test_dcp_round_trip_tensor_values(make_engine, targets):
    state = baseline_state()
    dirs = targets(1)
    eng = make_engine("dcp", dirs)
    result = eng.save(state, "ckpt").wait()
    check_baseline_result(result, state, "ckpt")
    files = check_baseline_files(dirs, "ckpt", result)
    assert ".metadata" in files and len(files) == 1 + eng.options.thread_count
    assert_same_tensors_dcp(eng.load("ckpt"), state)


def assert_same_tensors_dcp(loaded: Any, state: Any) -> None:
    """Every tensor of `state` in `loaded`, bit for bit, under its key path (dcp loads integer
    dict keys as strings; list indices stay indices)."""
    seen = 0
    for path, want in iter_tensors(state):
        got: Any = loaded
        for k in path:
            got = got[k] if isinstance(got, list | tuple) or k in got else got[str(k)]
        assert_same_tensor(got, want, f"state{list(path)}")
        seen += 1
    assert seen == len(list(iter_tensors(state))) > 20


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
@pytest.mark.parametrize(
    "options",
    [
        {"staging": "plain"},
        {"checkpointer": "process"},
        {"staging": "plain", "checkpointer": "process"},
    ],
    ids=["plain", "process", "plain-process"],
)
def test_dcp_options_round_trip(make_engine, targets, options):
    """async_save's own staging (`plain`: nothing kept, nothing pinned) and its process
    checkpointer (a process group of this one process, so that loading goes through
    `_load_alone`, DCP's private load without collectives): each round-trips bit for bit, and
    the training may change the tensors as soon as save() returns."""
    from bench.engines import dcp as dcp_mod

    state = baseline_state()
    want = clone_tree(state)
    dirs = targets(1)
    eng = make_engine("dcp", dirs, **options)
    eng.warm(state)
    alone: list[str] = []
    real = dcp_mod._load_alone

    def spy(d: str) -> Any:
        alone.append(d)
        return real(d)

    dcp_mod._load_alone = spy
    try:
        pending = eng.save(state, "ckpt")
        for _, t in iter_tensors(state):
            t.zero_()
        result = pending.wait()
        check_baseline_result(result, want, "ckpt")
        assert result.detail == DcpDetail(
            staging=options.get("staging", "cached"),
            checkpointer=options.get("checkpointer", "thread"),
        )
        # plain staging keeps no copy of the state; cached keeps one of every tensor byte
        assert eng.pinned_bytes == (0 if options.get("staging") == "plain" else payload(want))
        check_baseline_files(dirs, "ckpt", result)
        assert_same_tensors_dcp(eng.load("ckpt"), want)
    finally:
        dcp_mod._load_alone = real
    process = options.get("checkpointer") == "process"
    assert alone == ([eng.current_dir("ckpt")] if process else [])
    if process:  # DCP's checkpoint process (kept by DCP for later saves) wrote the files
        import psutil

        kids = [" ".join(c.cmdline()) for c in psutil.Process().children(recursive=True)]
        assert any("spawn_main" in k for k in kids), kids


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
@pytest.mark.parametrize("engine", ["torch-save", "dcp", "dlio-style"])
def test_baseline_save_replaces_by_switching_the_pointer(make_engine, targets, engine):
    dirs = targets(1)
    eng = make_engine(engine, dirs)
    first = {"w": random_tensor((1000,), torch.float32, seed=20)}
    second = {"w": random_tensor((1000,), torch.float32, seed=21)}
    r1 = eng.save(first, "ckpt").wait()
    assert_same(eng.load("ckpt"), first)
    r2 = eng.save(second, "ckpt").wait()
    assert r1.save_id != r2.save_id
    check_baseline_files(dirs, "ckpt", r2)  # the first generation is gone
    assert_same(eng.load("ckpt"), second)


# -- status -----------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:torch.distributed is (disabled|unavailable)")
@pytest.mark.parametrize("engine", [*STRIPED, "torch-save", "dcp", "dlio-style"])
def test_status_of_saved_and_unknown_names(make_engine, targets, engine):
    eng = make_engine(engine, targets(2))
    assert eng.status("ckpt") == "absent"
    eng.save({"w": random_tensor((5000,), torch.float32, seed=22)}, "ckpt").wait()
    assert eng.status("ckpt") == "complete"
    assert eng.status("other") == "absent"


def _smaps_field(address: int, field: str) -> str | None:
    """`field` of the mapping of this process that contains `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return None


def test_staging_buffers_ask_for_huge_pages():
    """Staging and ceiling buffers of 2 MiB and more are advised to use transparent huge pages
    (granted unless the system's THP mode is `never`); smaller ones are left alone."""
    from bench.measure import env
    from bench.storage import odirect

    mode = env.thp_mode()
    if mode is None or not os.path.exists("/proc/self/smaps"):
        pytest.skip("no transparent huge page support to check here")
    big, small = odirect.HostBuffer(8 * MiB), odirect.HostBuffer(64 * 1024)
    try:
        eligible = _smaps_field(big.address, "THPeligible")
        if eligible is None:
            pytest.skip("this kernel's smaps has no THPeligible field")
        assert eligible == ("0" if mode == "never" else "1")
        if mode == "madvise":  # only the advised mapping may get huge pages
            assert _smaps_field(small.address, "THPeligible") == "0"
    finally:
        big.close()
        small.close()


def test_env_records_the_running_damon_schemes(tmp_path: Path) -> None:
    """env.json's vm.damon: the actions of the schemes of every kdamond that is on (read from a
    sysfs tree laid out as the kernel's); None where there is no DAMON."""
    from bench.measure import env

    def kdamond(i: int, state: str, actions: list[str]) -> None:
        d = tmp_path / str(i)
        d.mkdir()
        (d / "state").write_text(state + "\n")
        for j, a in enumerate(actions):
            s = d / "contexts" / "0" / "schemes" / str(j)
            s.mkdir(parents=True)
            (s / "action").write_text(a + "\n")

    kdamond(0, "on", ["pageout", "hugepage"])
    kdamond(1, "off", ["migrate_cold"])
    assert env.damon_actions(str(tmp_path)) == ["pageout", "hugepage"]
    assert env.damon_actions(str(tmp_path / "absent")) is None
