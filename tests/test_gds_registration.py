"""gds's cuFile buffer registrations (bench/engines/gds/registration.py): made once per CUDA
allocation in warm(), said when one fails, none in compat mode, dropped by release().

The engine runs over FakeKvikio and FakeCuda (tests/fake_kvikio.py), which follow kvikio's
real contracts; its fixtures and sample states are in tests/conftest.py.
"""

from __future__ import annotations

import torch
from conftest import (
    assert_same_state,
    kvikio_engine,
    mixed_state,
)


def test_device_memory_is_registered_once_per_allocation_and_released(
    make_engine, targets, fake_kvikio, fake_cuda
):
    """kvikio's memory_register registers the whole CUDA allocation holding a pointer and refuses
    a second registration inside it. torch packs small tensors into shared segments: the
    engine registers each segment once, for every tensor in it."""
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(2))
    state = mixed_state(fake_cuda)
    state["big"] = fake_cuda.to(torch.randn(3 << 20))  # 12 MiB: a segment of its own
    eng.warm(state)
    contiguous_device = [t for k, t in state.items() if k not in ("step", "empty", "wt")]
    segments = {fake_cuda.allocation_of(t.data_ptr()) for t in contiguous_device}
    assert len(segments) == 2  # the small tensors share one 2 MiB segment
    assert fake.registered == dict(segments)
    assert fake.register_calls == 2
    result = eng.save(state, "ckpt").wait()
    assert result.detail.registered_bytes == sum(size for _, size in segments)
    assert result.detail.unregistered_device_bytes == state["wt"].numel() * 4  # copied first
    assert result.detail.register_note is None
    eng.close()
    assert fake.registered == {}


def test_a_failed_registration_is_said_and_the_rest_still_registered(
    make_engine, targets, fake_kvikio, fake_cuda
):
    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(1))
    state = mixed_state(fake_cuda)
    state["big"] = fake_cuda.to(torch.randn(3 << 20))
    small = fake_cuda.allocation_of(state["w"].data_ptr())
    fake.registered[small[0]] = small[1]  # registered by someone else already
    eng.warm(state)
    big = fake_cuda.allocation_of(state["big"].data_ptr())
    assert fake.registered == dict([small, big])
    result = eng.save(state, "ckpt").wait()
    note = result.detail.register_note
    assert note.startswith("3 tensors not registered (['w']: RuntimeError: ")
    assert "CU_FILE_MEMORY_ALREADY_REGISTERED" in note
    assert result.detail.registered_bytes == big[1]
    unregistered = sum(state[k].numel() * state[k].element_size() for k in ("w", "wt", "half"))
    unregistered += state["offset_view"].numel() * 8
    assert result.detail.unregistered_device_bytes == unregistered
    eng.close()
    assert fake.registered == dict([small])  # only what the engine registered is released


def test_no_registration_in_compat_mode(make_engine, targets, fake_kvikio, fake_cuda):
    fake = fake_kvikio(cufile_loads=False)
    eng = kvikio_engine(make_engine, targets(1))
    state = mixed_state(fake_cuda)
    eng.warm(state)
    result = eng.save(state, "ckpt").wait()
    assert fake.register_calls == 0
    assert result.detail.registered_bytes == 0
    assert "compat mode" in result.detail.register_note


def test_release_deregisters_and_lets_the_state_go(make_engine, targets, fake_kvikio, fake_cuda):
    """The registrations keep views of the state's device memory: release() deregisters them
    and drops the views, so that a state released is not held while the next one is built;
    warm() registers the next one."""
    import gc
    import weakref

    fake = fake_kvikio()
    eng = kvikio_engine(make_engine, targets(1))
    state = mixed_state(fake_cuda)
    eng.warm(state)
    assert fake.registered and eng._registered
    views = [weakref.ref(mem) for mem, _ in eng._registered.values()]
    eng.release()
    gc.collect()
    assert fake.registered == {} and eng._registered == {} and eng._registered_ptrs == {}
    assert all(v() is None for v in views)
    eng.warm(state)  # and again, for a save
    assert fake.registered
    eng.save(state, "ckpt").wait()
    assert_same_state(eng.load("ckpt", device="cuda"), state)
