"""gds's coalescing of small tensors (bench/engines/gds/coalesce.py, issue 32): one device
buffer for the small tensors of a state, and each tensor from its own memory when it is off.

The engine runs over FakeKvikio and FakeCuda (tests/fake_kvikio.py), which follow kvikio's
real contracts; its fixtures and sample states are in tests/conftest.py.
"""

from __future__ import annotations

from typing import Any

import torch
from conftest import (
    assert_same_state,
    kvikio_engine,
    read_manifest,
)
from fake_kvikio import FakeCuda

from bench.storage import checksums


def many_small_state(cuda: FakeCuda, n: int = 300) -> dict[str, Any]:
    """`n` small tensors of mixed dtypes and odd sizes in fake device memory, two larger ones,
    a strided one, an empty one, and a host `step` scalar, as an optimizer state would have."""
    g = torch.Generator().manual_seed(7)
    host: dict[str, Any] = {}
    for i in range(n):
        dtype = (torch.float32, torch.bfloat16, torch.int8, torch.float64)[i % 4]
        numel = 1 + (i * 37) % 700
        host[f"p{i:03d}"] = torch.randint(-100, 100, (numel,), generator=g).to(dtype)
    host["big"] = torch.randn(40_000, generator=g)  # 160 KB: written from its own memory
    host["wide"] = torch.randn(32, 300, generator=g).t()  # strided, small: coalesced
    host["empty"] = torch.empty(0, 3)
    host["step"] = torch.tensor(12.0)
    return cuda.to_device(host, keep_on_host=("step",))


def test_coalesced_small_tensors_go_through_one_device_buffer(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """Small device tensors are copied into the coalescing buffer (device memory, registered
    with cuFile in warm()) and written from it in chunks, in windows of `coalesce_bytes`; their
    checksums are computed there all at once, and equal the per-tensor wsum64; restore reads
    them back bit for bit through the GDS read path."""
    fake = fake_kvikio()
    dirs = targets(2)
    eng = kvikio_engine(
        make_engine, dirs, coalesce_below="64KiB", coalesce_bytes="128KiB", chunk_bytes="16KiB"
    )
    state = many_small_state(fake_cuda)
    eng.warm(state)
    buf = eng._cbuf
    assert buf is not None and fake_cuda.is_device(buf) and buf.data_ptr() % 4096 == 0
    result = eng.save(state, "ckpt").wait()
    assert_same_state(eng.load("ckpt", device="cuda"), state)

    small = [k for k, t in state.items() if 0 < t.numel() * t.element_size() < 64 << 10]
    detail = result.detail
    assert detail.coalesced_tensors == len(small) == 302  # the 300, `wide` and `step`
    assert detail.coalesced_bytes == sum(state[k].numel() * state[k].element_size() for k in small)
    assert detail.coalesce_rounds >= 3  # both halves of the buffer, one of them twice
    assert result.copied_tensors == 0  # the strided one went into the buffer by a strided copy
    # Every write is a chunk of the buffer or a piece of `big`: far fewer than the tensors,
    # and all from device memory (the host `step` went into the buffer too).
    writes = [c for c in fake.calls if c.op == "pwrite"]
    assert 0 < len(writes) < 40 < len(small)
    assert {c.memory for c in writes} == {"device"}
    assert max(c.size for c in writes) <= 16 << 10
    # The buffer was registered with the state's device memory, and the writes say so.
    assert detail.registered_bytes >= buf.numel() and detail.unregistered_device_bytes == 0
    # wsum64 from the buffer, one digest per tensor, as if each were hashed alone.
    m = read_manifest(dirs)
    by_path = {e["path"]: e for e in m["tensors"]}
    for k in small + ["big"]:
        flat = state[k].detach().contiguous().reshape(-1).view(torch.uint8)
        assert by_path[f"[{k!r}]"]["wsum64"] == checksums.device_checksum(flat), k
        assert by_path[f"[{k!r}]"]["xxh3"] is None


def test_coalescing_off_writes_each_tensor_from_its_memory(
    make_engine, targets, fake_kvikio, fake_cuda
):
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(2), coalesce_below=0)
    state = many_small_state(fake_cuda, n=40)
    result = eng.save(state, "ckpt").wait()
    assert result.detail.coalesced_tensors == 0
    assert len(fake.calls) >= 40 + 1  # one write at least per tensor with bytes
    assert_same_state(eng.load("ckpt", device="cuda"), state)
