"""Round trips of the crash-safety core, as properties over generated inputs (hypothesis):

- bench.storage.tree: any storable state flattens to JSON and back to the same state (key types,
  container types, values, tensor order);
- bench.storage.layout: for any tensor sizes, chunk size, target count and (direct layout) addresses,
  the pieces put every byte where the extents say, the extents tile each tensor, and files
  written through `write_piece` (buffered and O_DIRECT) read back bit for bit;
- bench.storage.manifest: any manifest reads back equal from its text, and no one-character change of
  the text is accepted;
- bench.storage.checksums: wsum64 agrees with the definition computed here in plain Python.

These are the fast tests `make mutate` runs against the core's mutants (scripts/mutate.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import scratch_base
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from bench.common.errors import ChecksumError, UserError
from bench.storage import checksums, generations, layout, manifest, odirect, readback, tree

# The deadline is off: a busy machine must not fail an example for being slow. `make mutate`
# runs these tests once per mutant and only asks whether one fails: its profile (chosen by
# CKPTBENCH_HYPOTHESIS) generates fewer examples and does not shrink a failing one.
settings.register_profile(
    "ckptbench", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.register_profile(
    "mutate",
    deadline=None,
    suppress_health_check=list(HealthCheck),
    max_examples=30,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile(os.environ.get("CKPTBENCH_HYPOTHESIS", "ckptbench"))

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int64, torch.bool]


# -- strategies -----------------------------------------------------------------------------------


@st.composite
def tensors(draw: Any) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    n = math.prod(shape)
    esize = torch.empty(0, dtype=dtype).element_size()
    raw = draw(st.binary(min_size=n * esize, max_size=n * esize))
    if dtype == torch.bool:
        raw = bytes(b & 1 for b in raw)
    t = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.empty(0, dtype=torch.uint8)
    )
    return t.view(dtype).reshape(shape)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
keys = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.text(max_size=6),
    st.tuples(st.integers(0, 9), st.text(max_size=3)),
)


def states() -> st.SearchStrategy[Any]:
    def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.dictionaries(keys, children, max_size=4),
            st.dictionaries(keys, children, max_size=4).map(lambda d: OrderedDict(d.items())),
        )

    return st.recursive(st.one_of(scalars, tensors()), containers, max_leaves=12)


def same(got: Any, want: Any, where: str = "state") -> None:
    """Bit-exact equality of two state trees: key types and order, container types, values
    (NaN equals NaN), tensors' dtype, shape and bytes."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert bytes(got.contiguous().reshape(-1).view(torch.uint8).numpy()) == bytes(
            want.contiguous().reshape(-1).view(torch.uint8).numpy()
        ), where
    elif isinstance(want, dict):
        assert [(type(k), k) for k in got] == [(type(k), k) for k in want], where
        for k in want:
            same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), where
    else:
        assert got == want, where


def leaves(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from leaves(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from leaves(v)


# -- bench.storage.tree -----------------------------------------------------------------------------------


@given(states())
def test_tree_round_trips_through_json(state: Any) -> None:
    node, found = tree.flatten(state)
    # What the manifest stores is the JSON text of the node.
    again = tree.unflatten(json.loads(json.dumps(node)), [t for _, t in found])
    same(again, state)
    # The tensors come out in the order a depth-first walk meets them, each path once.
    assert [id(t) for _, t in found] == [id(t) for t in leaves(state)]
    assert len({p for p, _ in found}) == len(found)


def test_tree_paths_name_where_each_tensor_is() -> None:
    t1, t2, t3 = torch.ones(1), torch.zeros(2), torch.arange(3)
    state = {"a": [t1, {(1, "x"): t2}], 5: (None, t3)}
    _, found = tree.flatten(state)
    assert [p for p, _ in found] == ["['a'][0]", "['a'][1][(1, 'x')]", "[5][1]"]


def test_tree_refuses_tensors_that_are_not_strided() -> None:
    """Sparse COO (is_sparse) and CSR (not is_sparse, another layout) tensors alike."""
    for t in (torch.eye(3).to_sparse(), torch.eye(3).to_sparse_csr()):
        with pytest.raises(UserError) as e:
            tree.flatten({"x": [t]})
        assert str(e.value) == "state['x'][0]: only dense (strided) tensors can be stored"


@pytest.mark.parametrize(
    ("node", "says"),
    [({"set": [1]}, "manifest: unknown node ['set']"), ({}, "manifest: unknown node []")],
)
def test_tree_refuses_an_unknown_node(node: dict, says: str) -> None:
    with pytest.raises(UserError) as e:
        tree.unflatten(node, [])
    assert str(e.value) == says


def test_tree_dtype_names_round_trip_and_refuse_strangers() -> None:
    for dt in DTYPES + [torch.complex64, torch.float16, torch.uint8]:
        assert tree.dtype_from_name(tree.dtype_name(dt)) is dt
    for bad in ("Tensor", "nope", "float33"):
        with pytest.raises(UserError, match=f"manifest: unknown dtype '{bad}'"):
            tree.dtype_from_name(bad)


# -- bench.storage.layout ---------------------------------------------------------------------------------

sizes = st.lists(st.integers(0, 3 * 8192 + 100), min_size=1, max_size=6)
chunks = st.sampled_from([4096, 8192, 16384])
target_counts = st.integers(1, 4)


def entries_of(nbytes: list[int]) -> list[manifest.TensorEntry]:
    return [manifest.TensorEntry(f"[{i}]", "uint8", [n], n) for i, n in enumerate(nbytes)]


def manifest_of(
    targets: list[str],
    file_bytes: dict[int, int],
    entries: list[manifest.TensorEntry],
    extra: dict | None = None,
) -> manifest.Manifest:
    """The manifest of checkpoint "ckpt" (save id zeros) whose files hold `file_bytes` and whose
    tensors are `entries`, with their checksums."""
    return manifest.Manifest(
        name="ckpt",
        engine="test",
        targets=targets,
        files={
            t: {"file": manifest.data_file_name(t, "0" * 16), "bytes": b}
            for t, b in file_bytes.items()
        },
        tensors=entries,
        tree=None,
        checksums=True,
        payload_bytes=sum(e.nbytes for e in entries),
        save_id="0" * 16,
        **({"extra": extra} if extra else {}),
    )


def write_in_memory(pieces: list[layout.Piece], file_bytes: dict[int, int]) -> dict[int, bytearray]:
    """The target files the pieces make (in memory); no two pieces may overlap."""
    files = {t: bytearray(n) for t, n in file_bytes.items()}
    taken: dict[int, list[tuple[int, int]]] = {t: [] for t in file_bytes}
    for p in pieces:
        assert 0 < p.length and p.file_offset + p.length <= file_bytes[p.target]
        src = p.mem[p.start : p.start + p.length]
        files[p.target][p.file_offset : p.file_offset + p.length] = bytes(np.asarray(src))
        taken[p.target].append((p.file_offset, p.file_offset + p.length))
    for spans in taken.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    return files


def read_extents(files: dict[int, bytearray], e: manifest.TensorEntry) -> bytes:
    return b"".join(bytes(files[t][off : off + n]) for t, off, n in e.extents)


@given(sizes, chunks, target_counts, st.randoms(use_true_random=False))
# Always tried: a last chunk shorter than the others (9000 bytes in chunks of 4096 over 2
# targets), whatever the draw finds.
@example([5000, 4000], 4096, 2, random.Random(1))
def test_packed_layout_puts_every_byte_where_its_extents_say(
    nbytes: list[int], chunk: int, n: int, rnd: Any
) -> None:
    entries = entries_of(nbytes)
    offsets, used = layout.pack_offsets(entries)
    # Each tensor at the next 64-byte boundary after the one before, worked out here.
    pos = 0
    for off, b in zip(offsets, nbytes, strict=True):
        assert off == -(-pos // 64) * 64
        pos = off + b
    assert used == pos
    staging = np.frombuffer(rnd.randbytes(max(used, 1)), dtype=np.uint8).copy()
    pieces, file_bytes = layout.packed(staging, used, entries, offsets, n, chunk)
    # Chunks dealt round-robin: chunk j to target j % n, at (j // n) x chunk in its file.
    assert [(p.target, p.file_offset, p.start, p.length) for p in pieces] == [
        (j % n, j // n * chunk, j * chunk, min(chunk, used - j * chunk))
        for j in range(-(-used // chunk))
    ]
    files = write_in_memory(pieces, file_bytes)
    for e, off in zip(entries, offsets, strict=True):
        assert sum(x[2] for x in e.extents) == e.nbytes
        assert all(x[2] > 0 for x in e.extents)
        assert read_extents(files, e) == bytes(staging[off : off + e.nbytes])
    # Every target file is as long as its furthest byte, no longer.
    for t, size in file_bytes.items():
        assert size == max(p.file_offset + p.length for p in pieces if p.target == t)


@given(sizes, st.lists(st.integers(0, 3 * 4096), min_size=6, max_size=6), chunks, target_counts)
def test_direct_layout_keeps_each_piece_congruent_and_round_trips(
    nbytes: list[int], at: list[int], chunk: int, n: int
) -> None:
    """Tensors at arbitrary addresses (offsets into an aligned buffer): each piece starts in
    its file at an offset congruent to its address modulo 4096, never crosses a chunk boundary
    of the address space, and the files read back to every tensor's bytes."""
    buf = odirect.HostBuffer(sum(nbytes) + sum(at) + 4 * 4096, prefault=False)
    try:
        rng = np.random.default_rng(sum(nbytes) + chunk + n)
        mems, pos = [], 0
        for b, a in zip(nbytes, at, strict=False):
            pos += a
            mems.append(buf.array[pos : pos + b])
            pos += b
        buf.array[:] = rng.integers(0, 256, buf.array.size, dtype=np.uint8)
        entries = entries_of(nbytes)
        pieces, file_bytes = layout.direct(mems, entries, n, chunk)
        # dealt round-robin, the first piece to the first target
        assert [p.target for p in pieces] == [k % n for k in range(len(pieces))]
        for p in pieces:
            assert p.file_offset % odirect.ALIGN == p.address % odirect.ALIGN
            assert p.address // chunk == (p.address + p.length - 1) // chunk
        assert all(v % odirect.ALIGN == 0 for v in file_bytes.values())
        files = write_in_memory(pieces, file_bytes)
        for e, mem in zip(entries, mems, strict=True):
            assert sum(x[2] for x in e.extents) == e.nbytes
            assert read_extents(files, e) == bytes(mem)
    finally:
        del mems
        buf.close()


@pytest.fixture(scope="module")
def disk() -> Iterator[Path]:
    """A directory on the scratch disk (O_DIRECT needs one), shared by the examples."""
    d = scratch_base() / f"test_properties-{os.getpid()}"
    d.mkdir(exist_ok=True)
    if odirect.probe(str(d)):
        pytest.skip(f"scratch refuses O_DIRECT: {odirect.probe(str(d))}")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@settings(max_examples=25)
@given(
    sizes,
    chunks,
    target_counts,
    st.booleans(),
    st.booleans(),
    st.lists(st.integers(0, 4095), min_size=6, max_size=6),
)
def test_pieces_written_to_files_read_back(
    disk: Path, nbytes: list[int], chunk: int, n: int, direct: bool, o_direct: bool, at: list[int]
) -> None:
    """Through real files: the pieces written by `write_piece` (buffered or O_DIRECT, where
    unaligned heads and tails go through a bounce buffer) and read back by `read_tensors`,
    whose checksums must match."""
    targets = []
    for t in range(n):
        d = disk / f"t{t}"
        shutil.rmtree(d, ignore_errors=True)
        (d / "ckpt").mkdir(parents=True)
        targets.append(str(d))
    entries = entries_of(nbytes)
    rng = np.random.default_rng(len(nbytes) * 7 + chunk + n)
    buf = odirect.HostBuffer(sum(nbytes) + sum(at) + 2 * 4096 + 64 * len(nbytes), prefault=False)
    try:
        buf.array[:] = rng.integers(0, 256, buf.array.size, dtype=np.uint8)
        if direct:
            mems, pos = [], 0
            for b, a in zip(nbytes, at, strict=False):
                pos += a
                mems.append(buf.array[pos : pos + b])
                pos += b
            pieces, file_bytes = layout.direct(mems, entries, n, chunk)
        else:
            offsets, used = layout.pack_offsets(entries)
            pieces, file_bytes = layout.packed(buf.array, used, entries, offsets, n, chunk)
            mems = [buf.array[o : o + b] for o, b in zip(offsets, nbytes, strict=True)]
        flags = os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if o_direct else 0)
        fds = {
            t: os.open(layout.data_file(targets, "ckpt", t, "0" * 16), flags, 0o644)
            for t in file_bytes
        }
        try:
            for p in pieces:
                layout.write_piece(fds[p.target], p, o_direct)
            for t, fd in fds.items():
                os.ftruncate(fd, file_bytes[t])
        finally:
            for fd in fds.values():
                os.close(fd)
        for e, mem in zip(entries, mems, strict=True):
            e.xxh3 = checksums.checksum(mem)
        m = manifest_of(targets, file_bytes, entries)
        got = layout.read_tensors(targets, m)
        for g, mem in zip(got, mems, strict=True):
            assert bytes(g.numpy()) == bytes(mem)
        # The same files read with O_DIRECT whatever their layout (gds's restore), through
        # bounce chunks smaller than the layout's, so that extents straddle them: new memory,
        # a subset in its order, and in place.
        read = chunk // 2 if chunk > 4096 else chunk
        got = readback.read_extents(targets, m, threads=3, chunk=read)
        assert [bytes(g.numpy()) for g in got] == [bytes(mem) for mem in mems]
        some = list(range(len(nbytes)))[::-2]
        got = readback.read_extents(targets, m, threads=2, chunk=read, only=some)
        assert [bytes(g.numpy()) for g in got] == [bytes(mems[i]) for i in some]
        into = [torch.zeros(b, dtype=torch.uint8) for b in nbytes]
        readback.read_extents(targets, m, threads=2, chunk=read, into=into)
        assert [bytes(t.numpy()) for t in into] == [bytes(mem) for mem in mems]
        # One flipped byte of a tensor's data is found by its checksum, named.
        k = next((i for i, b in enumerate(nbytes) if b), None)
        if k is not None:
            t, off, _ = entries[k].extents[0]
            path = layout.data_path(targets, m, t)
            with open(path, "r+b") as f:
                f.seek(off)
                byte = f.read(1)[0]
                f.seek(off)
                f.write(bytes([byte ^ 0x40]))
            with pytest.raises(ChecksumError, match=rf"tensor state\[{k}\] does not match"):
                layout.read_tensors(targets, m)
            with pytest.raises(ChecksumError, match=rf"tensor state\[{k}\] does not match"):
                readback.read_extents(targets, m, threads=2, chunk=read)
            # without the check, the bytes as they are on the disk
            got = layout.read_tensors(targets, m, check=False)
            assert bytes(got[k].numpy())[1:] == bytes(mems[k])[1:]
            assert got[k].numpy()[0] == mems[k][0] ^ 0x40
        assert not [f for f in _open_files() if "/ckpt/data-" in f]  # every file closed
    finally:
        del mems
        buf.close()


def packed_checkpoint(
    d: Path, nbytes: list[int], chunk: int, n: int, seed: int
) -> tuple[list[str], manifest.Manifest, list[bytes]]:
    """A packed checkpoint written as the snapshot engines write it (O_DIRECT pieces, each file
    then truncated to its length), with xxh3 checksums; its targets, manifest and tensor bytes."""
    targets = []
    for t in range(n):
        td = d / f"t{t}"
        shutil.rmtree(td, ignore_errors=True)
        (td / "ckpt").mkdir(parents=True)
        targets.append(str(td))
    entries = entries_of(nbytes)
    offsets, used = layout.pack_offsets(entries)
    buf = odirect.HostBuffer(used, prefault=False)
    try:
        buf.array[:] = np.random.default_rng(seed).integers(0, 256, buf.array.size, dtype=np.uint8)
        pieces, file_bytes = layout.packed(buf.array, used, entries, offsets, n, chunk)
        for t, size in file_bytes.items():
            fd = os.open(
                layout.data_file(targets, "ckpt", t, "0" * 16),
                os.O_WRONLY | os.O_CREAT | os.O_DIRECT,
                0o644,
            )
            try:
                for p in pieces:
                    if p.target == t:
                        layout.write_piece(fd, p, True)
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
        data = [bytes(buf.array[o : o + b]) for o, b in zip(offsets, nbytes, strict=True)]
        for e, b in zip(entries, data, strict=True):
            e.xxh3 = checksums.checksum(b)
    finally:
        buf.close()
    m = manifest_of(targets, file_bytes, entries, {"chunk_bytes": chunk, "o_direct": True})
    return targets, m, data


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 5 * 8192 + 100), min_size=1, max_size=8),
    chunks,
    st.integers(1, 3),
    st.integers(1, 4),
    st.sampled_from(["uint8", "int16", "float32", "bfloat16", "float64"]),
)
def test_o_direct_readback_round_trips_the_packed_layout(
    disk: Path, nbytes: list[int], chunk: int, n: int, slots: int, dtype: str
) -> None:
    """bench.storage.readback over real files: the packed layout (tensors crossing chunk and
    target boundaries, empty ones, odd sizes, a short last chunk) read with O_DIRECT into new
    memory and in place (through a ring of 1 to 4 chunks), bit for bit; the bytes as the
    tensors' dtype."""
    size = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    nbytes = [b // size * size for b in nbytes]
    targets, m, data = packed_checkpoint(disk, nbytes, chunk, n, sum(nbytes) + chunk + n)
    for e, b in zip(m.tensors, nbytes, strict=True):
        e.dtype, e.shape = dtype, [b // size]
    p = readback.packing(m)
    assert p is not None and p.used == layout.pack_offsets(m.tensors)[1]
    got = readback.read_packed(targets, m, p, threads=3)
    for g, want in zip(got, data, strict=True):
        assert g.dtype == getattr(torch, dtype)
        assert bytes(g.contiguous().view(torch.uint8).numpy()) == want
    # in place, through a ring (a checkpoint of one chunk needs only that chunk)
    ring = odirect.HostBuffer(slots * chunk)
    into = [torch.zeros(b // size, dtype=getattr(torch, dtype)) for b in nbytes]
    try:
        readback.read_packed(targets, m, p, threads=2, ring=ring.array, into=into)
    finally:
        ring.close()
    for g, want in zip(into, data, strict=True):
        assert bytes(g.view(torch.uint8).numpy()) == want
    assert not [f for f in _open_files() if "/ckpt/data-" in f]  # every file closed


def test_o_direct_readback_checks_what_it_read(disk: Path) -> None:
    """A flipped byte is caught fresh and in place, naming the tensor and its file; without the
    check the bytes come back as they are on the disk; a truncated or missing file is the same
    UserError as `check_files` gives; another layout is not read as packed."""
    nbytes = [5000, 3 * 4096 + 7, 0, 9000]
    targets, m, data = packed_checkpoint(disk / "flip", nbytes, 4096, 2, 3)
    p = readback.packing(m)
    assert p is not None
    t, off, _ = m.tensors[1].extents[1]
    path = layout.data_path(targets, m, t)
    with open(path, "r+b") as f:
        f.seek(off)
        byte = f.read(1)[0]
        f.seek(off)
        f.write(bytes([byte ^ 0x10]))
    files = ", ".join(sorted({layout.data_path(targets, m, x[0]) for x in m.tensors[1].extents}))
    says = rf"tensor state\[1\] does not match its checksum \(file {re.escape(files)}\)"
    with pytest.raises(ChecksumError, match=says):
        readback.read_packed(targets, m, p, threads=2)
    ring = odirect.HostBuffer(2 * 4096)
    into = [torch.zeros(b, dtype=torch.uint8) for b in nbytes]
    try:
        with pytest.raises(ChecksumError, match=says):
            readback.read_packed(targets, m, p, threads=2, ring=ring.array, into=into)
        got = readback.read_packed(targets, m, p, threads=2, check=False)
        flipped = bytearray(data[1])
        flipped[4096 - 5056 % 4096] ^= 0x10  # its second extent starts at the next chunk
        assert bytes(got[1].numpy()) == bytes(flipped)
        # truncated, then missing: the messages of check_files
        size = os.path.getsize(path)
        os.truncate(path, size - 1)
        with pytest.raises(UserError, match=rf"is truncated \({size - 1} of {size} bytes\)"):
            readback.read_packed(targets, m, p, threads=2, ring=ring.array, into=into)
        os.unlink(path)
        with pytest.raises(UserError, match=f"data file {re.escape(path)} is missing"):
            readback.read_packed(targets, m, p, threads=2)
    finally:
        ring.close()
    # extents not where the packed layout puts them (gds's direct layout): not packed
    m.tensors[3].extents[0][1] += 1
    assert readback.packing(m) is None
    m.extra = {}
    assert readback.packing(m) is None


def _open_files() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_o_direct_pieces_bounce_only_their_unaligned_head_and_tail(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece 1000 bytes past a 4 KiB boundary, 3 blocks and 500 bytes long, written with
    O_DIRECT: its head (up to the next boundary) and its tail go through the bounce buffer,
    less than a block each, the middle straight from memory; the file reads back whole. A data
    file longer than the manifest says (an appended byte) still loads; a shorter one not."""
    buf = odirect.HostBuffer(5 * 4096)
    buf.array[:] = np.random.default_rng(5).integers(0, 256, buf.array.size, dtype=np.uint8)
    bounced: list[int] = []
    real = layout._bounce

    def bounce(fd: int, data: memoryview, block_offset: int, at: int) -> None:
        bounced.append(len(data))
        real(fd, data, block_offset, at)

    monkeypatch.setattr(layout, "_bounce", bounce)
    length = 3 * 4096 + 500
    piece = layout.Piece(0, 1000, buf.array, 1000, length)
    path = disk / "bounce.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        layout.write_piece(fd, piece, True)
    finally:
        os.close(fd)
    assert bounced == [4096 - 1000, (length - (4096 - 1000)) % 4096]
    with open(path, "rb") as f:
        f.seek(1000)
        assert f.read(length) == bytes(buf.array[1000 : 1000 + length])
    # A piece whose end is a block boundary has no tail: nothing is bounced after its middle,
    # and the block behind it (another piece's) is left as it was.
    bounced.clear()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        layout.write_piece(fd, layout.Piece(0, 2 * 4096, buf.array, 2 * 4096, 4096), True)
        layout.write_piece(fd, layout.Piece(0, 1000, buf.array, 1000, 2 * 4096 - 1000), True)
    finally:
        os.close(fd)
    assert bounced == [4096 - 1000]
    with open(path, "rb") as f:
        f.seek(1000)
        assert f.read(3 * 4096 - 1000) == bytes(buf.array[1000 : 3 * 4096])
    # A piece placed at an offset not congruent to its address is a bug of the layout.
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        with pytest.raises(AssertionError, match="not congruent"):
            layout.write_piece(fd, layout.Piece(0, 1001, buf.array, 1000, 100), True)
        with pytest.raises(AssertionError, match="not congruent"):
            layout.write_piece(fd, layout.Piece(0, 999, buf.array, 1000, 100), True)
    finally:
        os.close(fd)
    buf.close()


def test_one_byte_tensors_read_back(disk: Path) -> None:
    """Six 1-byte tensors and an empty one, through a file and read_tensors."""
    d = disk / "ones"
    shutil.rmtree(d, ignore_errors=True)
    (d / "ckpt").mkdir(parents=True)
    data = bytes([7, 200, 13, 255, 1, 99])
    path = d / "ckpt" / manifest.data_file_name(0, "2" * 16)
    path.write_bytes(data)
    entries = [
        manifest.TensorEntry(f"[{i}]", "uint8", [1], 1, [[0, i, 1]]) for i in range(len(data))
    ]
    entries.append(manifest.TensorEntry("[6]", "float32", [2, 0], 0, []))
    m = manifest.Manifest(
        "ckpt", "t", [str(d)], {0: {"file": path.name, "bytes": 6}}, entries, None, False, 6
    )
    got = layout.read_tensors([str(d)], m)
    assert [int(t[0]) for t in got[:6]] == list(data)
    assert got[6].dtype == torch.float32 and tuple(got[6].shape) == (2, 0)


def test_a_data_file_longer_than_recorded_loads(disk: Path) -> None:
    d = disk / "long"
    shutil.rmtree(d, ignore_errors=True)
    (d / "ckpt").mkdir(parents=True)
    data = bytes(range(256)) * 10
    path = d / "ckpt" / manifest.data_file_name(0, "1" * 16)
    path.write_bytes(data)
    e = manifest.TensorEntry("[0]", "uint8", [len(data)], len(data), [[0, 0, len(data)]])
    e.xxh3 = checksums.checksum(data)
    m = manifest.Manifest(
        "ckpt", "t", [str(d)], {0: {"file": path.name, "bytes": len(data)}}, [e], None, True, 2560
    )
    with open(path, "ab") as f:
        f.write(b"x")
    assert bytes(layout.read_tensors([str(d)], m)[0].numpy()) == data
    os.truncate(path, len(data) - 1)
    with pytest.raises(UserError, match=f"is truncated \\({len(data) - 1} of {len(data)} bytes\\)"):
        layout.read_tensors([str(d)], m)


# -- bench.storage.manifest -------------------------------------------------------------------------------

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@st.composite
def manifests(draw: Any) -> manifest.Manifest:
    n = draw(st.integers(1, 4))
    tensors_ = [
        manifest.TensorEntry(
            path=draw(names),
            dtype=draw(st.sampled_from(["float32", "bfloat16", "int64", "bool"])),
            shape=draw(st.lists(st.integers(0, 2**31), max_size=3)),
            nbytes=draw(st.integers(0, 2**40)),
            extents=draw(
                st.lists(
                    st.tuples(
                        st.integers(0, n - 1), st.integers(0, 2**40), st.integers(1, 2**30)
                    ).map(list),
                    max_size=3,
                )
            ),
            xxh3=draw(st.none() | st.text("0123456789abcdef", min_size=16, max_size=16)),
            wsum64=draw(st.none() | st.text("0123456789abcdef-", min_size=1, max_size=40)),
        )
        for _ in range(draw(st.integers(0, 4)))
    ]
    node, _ = tree.flatten(
        draw(st.recursive(scalars, lambda c: st.lists(c, max_size=3), max_leaves=6))
    )
    return manifest.Manifest(
        name=draw(names),
        engine=draw(names),
        targets=draw(st.lists(names, min_size=n, max_size=n)),
        files={
            t: {"file": f"data-{t}.x.bin", "bytes": draw(st.integers(0, 2**40))}
            for t in draw(st.sets(st.integers(0, n - 1)))
        },
        tensors=tensors_,
        tree=node,
        checksums=draw(st.booleans()),
        payload_bytes=draw(st.integers(0, 2**50)),
        save_id=draw(st.text("0123456789abcdef", min_size=16, max_size=16)),
        extra=draw(st.dictionaries(names, st.integers() | st.booleans() | st.none(), max_size=3)),
    )


def equal_manifests(a: manifest.Manifest, b: manifest.Manifest) -> None:
    # the tree's floats may be NaN: compare its JSON text (NaN written as NaN both times)
    assert json.dumps(a.tree) == json.dumps(b.tree)
    assert {**a.__dict__, "tree": None} == {**b.__dict__, "tree": None}


@given(manifests())
def test_manifest_reads_back_what_was_written(m: manifest.Manifest) -> None:
    text = m.to_json()
    assert text.endswith('"}\n') and text.count("\n") == 1
    equal_manifests(manifest.Manifest.from_json(text, "here"), m)


@given(manifests(), st.data())
def test_manifest_refuses_any_changed_character(m: manifest.Manifest, data: Any) -> None:
    text = m.to_json().rstrip("\n")
    at = data.draw(st.integers(0, len(text) - 1))
    other = data.draw(st.characters(blacklist_categories=("Cs",)).filter(lambda c: c != text[at]))
    with pytest.raises(UserError) as e:
        manifest.Manifest.from_json(text[:at] + other + text[at + 1 :], "here")
    assert str(e.value).startswith("here: ")


@given(manifests(), st.integers(0, 10))
def test_manifest_refuses_any_truncation(m: manifest.Manifest, cut: int) -> None:
    text = m.to_json()
    with pytest.raises(UserError, match="^here: manifest is damaged"):
        manifest.Manifest.from_json(text[: len(text) - 2 - cut], "here")


def test_manifest_commit_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    """commit writes the whole text under the final name, through a temp file it renames;
    uncommit removes it (and is fine when there is none)."""
    (tmp_path / "ckpt").mkdir()
    m = manifest.Manifest("ckpt", "e", [str(tmp_path)], {}, [], None, False, 0, save_id="ab" * 8)
    manifest.commit([str(tmp_path)], m)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["manifest.json"]
    assert (tmp_path / "ckpt" / "manifest.json").read_text() == m.to_json()
    equal_manifests(generations.read([str(tmp_path)], "ckpt"), m)
    manifest.uncommit([str(tmp_path)], "ckpt")
    assert os.listdir(tmp_path / "ckpt") == []
    manifest.uncommit([str(tmp_path)], "ckpt")
    assert manifest.committed([str(tmp_path)], "ckpt") is None


def test_commit_writes_its_temp_under_the_save_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temp manifest is named by its save's id, so that the leftover scan knows whose it
    is (a live save's temp is left alone, a dead one's removed)."""
    (tmp_path / "ckpt").mkdir()
    m = manifest.Manifest("ckpt", "e", [str(tmp_path)], {}, [], None, False, 0, save_id="cd" * 8)
    renamed: list[tuple[str, str]] = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append((a, b)), real(a, b))[1])
    manifest.commit([str(tmp_path)], m)
    final = str(tmp_path / "ckpt" / "manifest.json")
    assert renamed == [(f"{final}.tmp-{'cd' * 8}", final)]


def test_save_ids_are_16_hex_digits_and_new_each_time() -> None:
    ids = [manifest.new_save_id() for _ in range(200)]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 200


def test_fsync_dir_takes_only_a_directory(tmp_path: Path) -> None:
    manifest.fsync_dir(str(tmp_path))
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        manifest.fsync_dir(str(tmp_path / "f"))


# -- bench.storage.checksums ------------------------------------------------------------------------------


def wsum64_by_definition(data: bytes) -> str:
    """wsum64 as its docstring defines it, in plain Python integers."""
    padded = data + b"\0" * (-len(data) % 4)
    words = [int.from_bytes(padded[i : i + 4], "little") for i in range(0, len(padded), 4)]
    s1 = sum(words) % 2**64
    s2 = sum(i * w for i, w in enumerate(words, start=1)) % 2**64
    return f"{s1:016x}{s2:016x}-{len(data):x}"


@given(st.binary(max_size=300), st.integers(0, 7))
# Empty slices and whole words at offsets that are not multiples of 4: only the storage-offset
# test clones them (an empty slice's address says nothing), and a 32-bit view of them fails.
@example(data=b"", misalign=3)
@example(data=b"", misalign=5)
@example(data=b"\x01\x02\x03\x04", misalign=6)
def test_wsum64_is_its_definition(data: bytes, misalign: int) -> None:
    raw = torch.frombuffer(bytearray(b"\0" * misalign + data + b"\0"), dtype=torch.uint8)
    mem = raw[misalign : misalign + len(data)]
    assert checksums.device_checksum(mem) == wsum64_by_definition(data)


def test_wsum64_across_pieces_and_wrapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Words of all ones (the sums wrap modulo 2^64), summed in pieces of 3 words."""
    monkeypatch.setattr(checksums, "WSUM_PIECE", 3)
    data = b"\xff" * 4 * 10 + b"\x01\x02"
    mem = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    assert checksums.device_checksum(mem) == wsum64_by_definition(data)


def test_wsum64_of_sums_past_two_to_the_63() -> None:
    """70000 words of all ones: S2 passes 2^63, so the int64 sums wrap negative and only the
    mask brings the digest back to the definition's (modulo 2^64, 16 hex digits each)."""
    data = b"\xff" * 4 * 70000
    mem = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    want = wsum64_by_definition(data)
    assert sum(range(70001)) * (2**32 - 1) >= 2**63  # the case this test is for
    assert checksums.device_checksum(mem) == want


@given(st.binary(min_size=1, max_size=200), st.data())
def test_entry_matches_only_its_own_bytes(data: bytes, draw: Any) -> None:
    arr = np.frombuffer(data, dtype=np.uint8)
    by_xxh3 = manifest.TensorEntry(
        "p", "uint8", [len(data)], len(data), xxh3=checksums.checksum(arr)
    )
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    by_wsum = manifest.TensorEntry(
        "p", "uint8", [len(data)], len(data), wsum64=checksums.device_checksum(t)
    )
    assert checksums.entry_matches(by_xxh3, arr) and checksums.entry_matches(by_xxh3, t)
    assert checksums.entry_matches(by_wsum, arr) and checksums.entry_matches(by_wsum, t)
    at = draw.draw(st.integers(0, len(data) - 1))
    changed = bytearray(data)
    changed[at] ^= 1 << draw.draw(st.integers(0, 7))
    bad = np.frombuffer(bytes(changed), dtype=np.uint8)
    assert not checksums.entry_matches(by_xxh3, bad)
    assert not checksums.entry_matches(by_wsum, bad)
    none = manifest.TensorEntry("p", "uint8", [len(data)], len(data))
    assert checksums.entry_matches(none, bad)  # nothing recorded: nothing to check


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=70)), max_size=12),
    st.integers(1, 40),
    st.binary(min_size=4, max_size=4),
)
def test_segment_sums_are_each_segments_wsum64(
    segs: list[tuple[int, bytes]], words: int, filler: bytes
) -> None:
    """Segments packed in one buffer (gaps of 4-byte words between them filled with other
    bytes, partial last words followed by other bytes too), summed all at once in runs of at
    most `words` words: each digest is that segment's wsum64 by definition."""
    buf, starts = bytearray(), []
    for gap, data in segs:
        buf += filler[: -len(buf) % 4]  # other bytes after a partial last word
        buf += filler * gap
        starts.append(len(buf))
        buf += data
    buf += filler[: -len(buf) % 4]
    mem = torch.frombuffer(bytearray(buf + b"\0"), dtype=torch.uint8)[: len(buf)]
    old = checksums.SEGMENT_WORDS
    checksums.SEGMENT_WORDS = words
    try:
        sums = checksums.segment_sums(mem, starts, [len(d) for _, d in segs]).tolist()
    finally:
        checksums.SEGMENT_WORDS = old
    for (s1, s2), (_, data) in zip(sums, segs, strict=True):
        assert checksums.wsum64_digest(s1, s2, len(data)) == wsum64_by_definition(data)


def test_segment_sums_refuse_a_start_off_a_word() -> None:
    mem = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="4-byte boundaries"):
        checksums.segment_sums(mem, [2], [4])
