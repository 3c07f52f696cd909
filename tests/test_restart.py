"""A restore as a restart runs it (bench.run.restart, bench.storage.scrub): the destination
scrubbed before the timed load, so that only bytes that come back from the checkpoint pass; and
loads planted with defects (a no-op, a skipped chunk, a tensor read from another's offset),
each caught, naming the tensor."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from conftest import RUNNABLE, bits

from bench.common.devices import detect
from bench.run import protocol, restart
from bench.storage import readback, scrub, verify
from bench.workloads.synthetic import synthetic_state

KiB, MiB = 1 << 10, 1 << 20


def _row(engine: str) -> Any:
    from conftest import result_row

    return result_row(engine=engine)


def nested() -> dict[str, Any]:
    """Tensors of every shape the scrub must reach: strided, 0-d, bf16, bool, empty."""
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(64, 48, generator=g),
        "wt": torch.randn(8, 6, generator=g).t(),
        "step": torch.tensor(3.0),
        "half": torch.randn(33, generator=g).to(torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "none": torch.zeros(0),
        "zeros": torch.zeros(100),
    }


def test_the_scrub_changes_every_byte_of_every_tensor_in_its_own_memory():
    state = nested()
    before = {k: bits(t).clone() for k, t in state.items()}
    ptrs = {k: t.data_ptr() for k, t in state.items()}
    done = scrub.scrub(state)
    assert done == sum(t.numel() * t.element_size() for t in state.values())
    for k, t in state.items():
        assert t.data_ptr() == ptrs[k]  # no second copy: the same memory
        assert torch.equal(bits(t), before[k] ^ 0xFF), k  # every byte differs from the source
    scrub.scrub(state)  # the complement of the complement
    assert all(torch.equal(bits(t), before[k]) for k, t in state.items())


def _saved(make_engine, targets, engine: str, state: Any, **options: Any) -> Any:
    eng = make_engine(engine, targets(2), **options)
    eng.save(state, "ckpt").wait()
    return eng


def _restart(eng: Any, engine: str, state: Any, want: list, load: Any = None) -> Any:
    row = _row(engine)
    protocol.restore_phase(
        row, eng, engine, state, "ckpt", detect("host-emulated"), True, load=load, fingerprint=want
    )
    return row


def small_state() -> dict[str, torch.Tensor]:
    """Four 64 KiB tensors, page-aligned (as the sweep's states): each its own bytes."""
    return synthetic_state(256 * KiB, 64 * KiB, seed=3)


@pytest.mark.parametrize("engine", RUNNABLE)
def test_a_restart_restores_into_the_scrubbed_state_and_verifies(make_engine, targets, engine):
    state = small_state()
    want = verify.fingerprint(state)
    ptrs = [t.data_ptr() for t in state.values()]
    eng = _saved(make_engine, targets, engine, state)
    row = _restart(eng, engine, state, want)
    assert (row.restore_into, row.verified, row.error) == ("restart", True, "")
    assert [t.data_ptr() for t in state.values()] == ptrs
    assert verify.first_fingerprint_difference(want, verify.fingerprint(state)) is None


# -- planted defects: each must fail, naming the tensor -------------------------------------


@pytest.mark.parametrize("engine", RUNNABLE)
def test_a_no_op_load_fails_naming_the_first_tensor(make_engine, targets, engine):
    """A load that returns its destination untouched (or a right copy elsewhere) leaves the
    scrubbed bytes: the destination is what is checked."""
    state = small_state()
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, engine, state, **_no_checksums(engine))

    def no_op(name: str, device: str, checksums: bool = True, into: Any = None) -> Any:
        return into

    row = _restart(eng, engine, state, want, load=no_op)
    assert row.error == "restored state differs at ['t00000']" and not row.verified


def test_a_load_that_returns_a_right_copy_but_leaves_the_destination_fails(make_engine, targets):
    state = small_state()
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, "cpu-single", state, checksums=False)

    def elsewhere(name: str, device: str, checksums: bool = True, into: Any = None) -> Any:
        return eng.load(name, device=device, checksums=checksums)  # fresh memory, not `into`

    row = _restart(eng, "cpu-single", state, want, load=elsewhere)
    assert row.error == "restored state differs at ['t00000']"


def test_without_the_scrub_a_no_op_load_would_pass(make_engine, targets, monkeypatch):
    """What the scrub is for: the state still holds the saved bytes, so a load that reads
    nothing passes the fingerprint check unless the destination was scrubbed."""
    state = small_state()
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, "cpu-single", state, checksums=False)
    monkeypatch.setattr(scrub, "scrub", lambda s: 0)
    row = _restart(eng, "cpu-single", state, want, load=lambda n, device, checksums, into: into)
    assert row.verified and not row.error


def _no_checksums(engine: str) -> dict[str, Any]:
    """The striped engines' own checksums off: the harness's check must catch it alone."""
    from bench.engines import traits_of

    return {"checksums": False} if traits_of(engine).stripes else {}


def test_a_load_that_skips_the_last_chunk_fails_naming_the_last_tensor(
    make_engine, targets, monkeypatch
):
    state = small_state()
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, "cpu-single", state, checksums=False, chunk_bytes="64KiB")
    real = readback._Files.read

    def skip_last(self: Any, j: int, dst: np.ndarray) -> None:
        if j < self.p.chunks - 1:
            real(self, j, dst)

    monkeypatch.setattr(readback._Files, "read", skip_last)
    row = _restart(eng, "cpu-single", state, want)
    assert row.error == "restored state differs at ['t00003']"


def test_a_load_that_reads_a_tensor_from_anothers_offset_fails_naming_it(
    make_engine, targets, monkeypatch
):
    state = small_state()
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, "cpu-single", state, checksums=False)
    real = readback.packing

    def shifted(m: Any) -> Any:
        p = real(m)
        offsets = list(p.offsets)
        offsets[2] = offsets[1]  # t00002 read from where t00001 lies
        return readback.Packed(offsets, p.used, p.chunk, p.n_targets)

    monkeypatch.setattr(readback, "packing", shifted)
    row = _restart(eng, "cpu-single", state, want)
    assert row.error == "restored state differs at ['t00002']"


def test_a_fresh_restore_leaves_the_source_as_it_was(make_engine, targets):
    state = small_state()
    before = {k: bits(t).clone() for k, t in state.items()}
    eng = _saved(make_engine, targets, "cpu-single", state)
    row = _row("cpu-single")
    protocol.restore_phase(row, eng, "cpu-single", state, "ckpt", detect("host-emulated"), True)
    assert (row.restore_into, row.verified) == (restart.FRESH, True)
    assert all(torch.equal(bits(t), before[k]) for k, t in state.items())


def test_without_forgetting_its_staging_cpu_single_would_hide_a_skipped_chunk(
    make_engine, targets, monkeypatch
):
    """cpu-single's restore through a ring reuses its staging, which still holds the last
    snapshot: a skipped chunk's slot would hand the right bytes on. The restart has the engine
    forget them first (SnapshotEngine.forget); without that, this defect passes."""
    from bench.engines.snapshot import SnapshotEngine

    state = small_state()
    want = verify.fingerprint(state)
    eng = _saved(
        make_engine,
        targets,
        "cpu-single",
        state,
        checksums=False,
        chunk_bytes="64KiB",
        restore_direct=False,  # through the ring: a direct read would land in the scrubbed state
    )
    real = readback._Files.read
    monkeypatch.setattr(
        readback._Files, "read", lambda self, j, dst: real(self, j, dst) if j < 3 else None
    )
    monkeypatch.setattr(SnapshotEngine, "forget", lambda self: None)
    row = _restart(
        eng,
        "cpu-single",
        state,
        want,
    )
    assert row.verified and not row.error


# -- cpu-single's single copy: O_DIRECT straight into the destination where aligned -----------


def _unaligned(count: int, nbytes: int) -> dict[str, torch.Tensor]:
    """`count` float32 tensors of `nbytes` each, none starting on a page: views one or two
    elements into a buffer of their own (torch's allocator alone may hand out an aligned one)."""
    g = torch.Generator().manual_seed(5)
    out = {}
    for i in range(count):
        buf = torch.randn(nbytes // 4 + 2, generator=g)
        skip = 1 if (buf.data_ptr() + 4) % 4096 else 2
        out[f"t{i:05d}"] = buf[skip : skip + nbytes // 4]
    return out


@pytest.mark.parametrize(
    ("aligned", "tensor", "direct"),
    [
        (True, 64 * KiB, 4),  # every chunk one tensor's, page-aligned in its memory
        # 200 KiB tensors, 13 chunks: the 3 that straddle two tensors go through the ring (the
        # last, 32 KiB, whole blocks of one tensor, is read straight)
        (True, 200 * KiB, 10),
        (False, 64 * KiB, 0),  # no tensor starts on a page: all through the ring
    ],
)
def test_cpu_single_restarts_aligned_chunks_straight_into_the_tensors(
    make_engine, targets, monkeypatch, aligned, tensor, direct
):
    state = synthetic_state(4 * tensor, tensor, seed=5) if aligned else _unaligned(4, tensor)
    if not aligned:
        assert all(t.data_ptr() % 4096 for t in state.values()), "checked, not assumed"
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, "cpu-single", state, chunk_bytes="64KiB")
    real, seen = readback.direct_chunks, []

    def spy(*a: Any) -> Any:
        out = real(*a)
        seen.append(len(out))
        return out

    monkeypatch.setattr(readback, "direct_chunks", spy)
    row = _restart(eng, "cpu-single", state, want)
    assert (row.verified, row.error, seen) == (True, "", [direct])
    assert row.restore_cached_bytes == 0  # O_DIRECT: nothing left in the page cache
    eng.check("ckpt", state)  # its own checksums, hashed whole for the tensors read straight


def test_the_engine_table_says_how_each_engine_restarts():
    """docs/engines.md's engine table, column `a restart`, from each engine's `restore_in_place`
    trait; every registered engine has its line."""
    from conftest import REPO

    from bench.engines import ENGINES, traits_of

    text = (REPO / "docs" / "engines.md").read_text()
    table = text[text.index("| engine | data path |") :].split("\n\n")[0].splitlines()
    said = {ln.split("`")[1]: ln.rstrip(" |").rsplit("| ", 1)[1] for ln in table[2:]}
    assert sorted(said) == sorted(ENGINES), "one line per registered engine"
    for name, how in said.items():
        want = "reads into the model" if traits_of(name).restore_in_place else "loads, then copies"
        assert how == want, name


@pytest.mark.parametrize("shape", ["aligned", "unaligned", "odd"])
def test_gds_emulation_restarts_whole_blocks_straight_into_the_tensors(
    make_engine, targets, monkeypatch, shape
):
    """gds's emulation reads a restart as kvikio's pread would, into the destination: every
    whole block whose file offset and memory address agree, the heads and tails through its
    bounce buffers; bit for bit whichever way each byte came, nothing left in the page cache."""
    if shape == "aligned":
        state: dict[str, torch.Tensor] = synthetic_state(800 * KiB, 200 * KiB, seed=6)
    elif shape == "unaligned":
        state = _unaligned(4, 200 * KiB)
        assert all(t.data_ptr() % 4096 for t in state.values())
    else:  # sizes that end inside a block, small ones among them
        g = torch.Generator().manual_seed(1)
        state = {f"t{i:05d}": torch.randn(n, generator=g) for i, n in enumerate([25001, 3, 70001])}
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, "gds", state, io="emulated", chunk_bytes="64KiB")
    real, straight = readback._direct_pieces, []

    def spy(*a: Any) -> Any:
        out = real(*a)
        straight[:] = a[5]
        return out

    monkeypatch.setattr(readback, "_direct_pieces", spy)
    row = _restart(eng, "gds", state, want)
    assert (row.verified, row.error, row.restore_cached_bytes) == (True, "", 0)
    if shape == "aligned":
        assert sum(len(mem) for _, _, mem in straight) == 800 * KiB  # every byte straight
    elif shape == "unaligned":
        assert straight == []
    eng.check("ckpt", state)


def test_a_restart_read_straight_into_the_tensors_does_not_grow_a_bounded_staging(
    make_engine, targets
):
    """The ring is made only where a chunk goes through it: a bounded staging (one chunk) is
    not grown to the ring inside the timed load when every chunk lands in the tensors."""
    state = small_state()
    want = verify.fingerprint(state)
    eng = _saved(make_engine, targets, "cpu-single", state, chunk_bytes="64KiB", staging_chunks=1)
    held = eng.staging.capacity
    row = _restart(eng, "cpu-single", state, want)
    assert (row.verified, eng.staging.capacity) == (True, held)
    ring = _unaligned(4, 64 * KiB)  # no tensor on a page: the ring
    eng.save(ring, "ckpt").wait()
    row = _restart(eng, "cpu-single", ring, verify.fingerprint(ring))
    assert row.verified and eng.staging.capacity > held
