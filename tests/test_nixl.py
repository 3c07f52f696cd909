"""The nixl peer held against the real NIXL library (the `nixl` extra's wheel): both POSIX
backends through real files, bit for bit, the file's layout as its index says, a restart into the
destination's own tensors, and each failure the library can be made to give here (no plugins, a
write it refuses, a backend that needs CUDA) as one line, with no checkpoint that looks complete.

The GDS and GDS_MT paths need a GPU (scripts/gpu_check.sh runs them); skipped without NIXL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO

from bench import engines
from bench.common.errors import UserError
from bench.engines import nixl_peer
from bench.storage import odirect
from bench.storage.verify import first_difference

pytestmark = pytest.mark.skipif(
    isinstance(nixl_peer.library(), str), reason=str(nixl_peer.library())
)
POSIX = ["posix-uring", "posix-aio"]
# small descriptors and a small buffer, so that a small state takes several windows (of four
# descriptors, split by `batch` into two requests), and a file tail shorter than a descriptor
SMALL = {"request_bytes": "8KiB", "buffer_bytes": "64KiB", "batch": 3}


def odd_state(seed: int = 5) -> dict[str, Any]:
    """Tensors of many dtypes and sizes, none a multiple of 4 KiB, one non-contiguous, one
    empty, one 0-d, beside plain values."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(24001, generator=g),
        "h": torch.randn(70, 33, generator=g).to(torch.bfloat16),
        "t": torch.randn(40, 50, generator=g).t(),  # non-contiguous
        "mask": torch.rand(999, generator=g) > 0.5,
        "i": torch.randint(-(2**40), 2**40, (1234,), generator=g),
        "none": torch.empty(0),
        "step": torch.tensor(17),
        "opt": {"lr": 0.5, "betas": (0.9, 0.99), "names": ["a", None]},
    }


def zeroed(state: Any) -> Any:
    """A destination of the same structure, every tensor zero."""
    if isinstance(state, dict):
        return {k: zeroed(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(zeroed(v) for v in state)
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    return state


@pytest.mark.parametrize("backend", POSIX)
def test_round_trip_bit_exact_through_its_file(backend, make_engine, targets):
    (target,) = targets(1)
    eng = make_engine("nixl", [target], backend=backend, **SMALL)
    state = odd_state()
    eng.warm(state)
    res = eng.save(state, "x").wait()
    detail = res.detail
    assert detail is not None and detail.backend == {"posix-uring": "POSIX/URING"}.get(
        backend, "POSIX/AIO"
    )
    assert eng.status("x") == "complete"
    assert first_difference(state, eng.load("x")) is None
    # The data file as the index says: each tensor's bytes at its 4 KiB-aligned offset, zeros
    # between, the file's length a multiple of 4 KiB.
    gen = Path(eng.current_dir("x"))
    index = json.loads((gen / nixl_peer.INDEX).read_text())
    data = (gen / nixl_peer.FILE).read_bytes()
    assert len(data) == index["length"] and len(data) % odirect.ALIGN == 0
    tensors = [state[k] for k in ("w", "h", "t", "mask", "i", "none", "step")]
    covered = bytearray(len(data))
    for t, spec in zip(tensors, index["tensors"], strict=True):
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        off = spec["offset"]
        assert off % odirect.ALIGN == 0 and data[off : off + len(raw)] == raw
        assert spec["shape"] == list(t.shape)
        covered[off : off + len(raw)] = b"\1" * len(raw)
    assert all(b == 0 for b, c in zip(data, covered, strict=True) if not c)
    # The requests the windows make: full ones split by `batch`, the file's tail on its own
    length, half, req = len(data), 32 << 10, 8 << 10
    assert length > 2 * half and length % req  # two windows at least, and a tail
    want_req = want_desc = 0
    for start in range(0, length, half):
        n, tail = divmod(min(half, length - start), req)
        want_req += -(-n // 3) + bool(tail)
        want_desc += n + bool(tail)
    assert (detail.requests, detail.descriptors) == (want_req, want_desc)


@pytest.mark.parametrize("backend", POSIX)
def test_restart_reads_into_the_destinations_own_tensors(backend, make_engine, targets):
    (target,) = targets(1)
    eng = make_engine("nixl", [target], backend=backend, **SMALL)
    state = odd_state(7)
    eng.save(state, "x").wait()
    dest = zeroed(state)
    ptrs = {k: v.data_ptr() for k, v in dest.items() if isinstance(v, torch.Tensor) and v.numel()}
    assert eng.load("x", into=dest) is dest
    assert first_difference(state, dest) is None
    assert ptrs == {k: dest[k].data_ptr() for k in ptrs}  # in place, no new tensors
    wrong = zeroed(state)
    wrong["w"] = torch.zeros(3000)
    with pytest.raises(UserError, match=r"tensor of \(24001,\) float32 cannot be restored"):
        eng.load("x", into=wrong)


def test_a_second_save_replaces_the_first_and_the_defaults_round_trip(make_engine, targets):
    """Default knobs (16 MiB descriptors, 256 MiB buffer): a state larger than one half."""
    (target,) = targets(1)
    eng = make_engine("nixl", [target])
    g = torch.Generator().manual_seed(1)
    big = {"a": torch.randint(0, 255, (130 << 20,), dtype=torch.uint8, generator=g)}
    eng.save({"a": torch.ones(10)}, "x").wait()
    eng.save(big, "x").wait()
    assert first_difference(big, eng.load("x")) is None
    assert len(os.listdir(Path(eng.current_dir("x")).parent)) == 2  # current + one generation


@pytest.mark.parametrize("backend", POSIX)
def test_a_write_the_library_refuses_fails_the_save_and_keeps_the_old_checkpoint(
    backend, make_engine, targets, monkeypatch
):
    """The data file opened read-only (and not preallocated, which would fail first): NIXL's
    write fails (AIO when posted, io_uring when polled); the save raises one line naming the
    backend, the previous checkpoint stays the committed one, and a fresh name is absent."""
    (target,) = targets(1)
    eng = make_engine("nixl", [target], backend=backend, **SMALL)
    old = odd_state(1)
    eng.save(old, "x").wait()
    monkeypatch.setattr(nixl_peer, "OPEN_FLAGS", os.O_RDONLY | os.O_CREAT | os.O_DIRECT)
    monkeypatch.setattr(odirect, "preallocate", lambda fd, n: None)
    label = "POSIX/URING" if backend == "posix-uring" else "POSIX/AIO"
    for name in ("x", "fresh"):
        with pytest.raises(nixl_peer.NixlError, match=rf"^nixl {label}: .* failed \(") as e:
            eng.save(odd_state(2), name)
        assert "\n" not in str(e.value)
    assert eng.status("x") == "complete" and eng.status("fresh") != "complete"
    monkeypatch.undo()
    assert first_difference(old, eng.load("x")) is None
    with pytest.raises(UserError, match="'fresh' (does not exist|is incomplete)"):
        eng.load("fresh")


def test_gds_backends_need_cuda_and_say_so():
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: scripts/gpu_check.sh runs gds-mt")
    for b in ("gds", "gds-mt"):
        why = engines.unavailable("nixl", {"backend": b})
        assert why == f"backend {b} needs CUDA (no CUDA device here); use posix-uring or posix-aio"
        with pytest.raises(UserError, match=f"^engine nixl cannot run here: backend {b} needs"):
            engines.create("nixl", [str(REPO)], backend=b)
    assert engines.unavailable("nixl", {"backend": "posix-aio"}) is None


def test_no_plugins_is_the_engines_one_line_reason(tmp_path):
    """NIXL with an empty plugin directory (NIXL_PLUGIN_DIR) instantiates no backend: the
    library's reason is the engine's, in `ckptbench engines` and when a run asks for it."""
    env = {**os.environ, "NIXL_PLUGIN_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "bench", "engines"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("nixl ")]
    assert line.split(maxsplit=1)[1] == (
        "unavailable: NIXL cannot instantiate its POSIX/URING backend here (RuntimeError: No "
        "plugins available for NIXL, cannot start transfers!)"
    )
    code = (
        "from bench import engines\n"
        "from bench.common.errors import UserError\n"
        "try:\n"
        f"    engines.create('nixl', [{str(tmp_path)!r}], backend='posix-aio')\n"
        "except UserError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == (
        "engine nixl cannot run here: NIXL cannot instantiate its POSIX/AIO backend here "
        "(RuntimeError: No plugins available for NIXL, cannot start transfers!)"
    )


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"request_bytes": "5000"}, "request_bytes: must be a multiple of 4096 .O_DIRECT., got"),
        (
            {"request_bytes": "1MiB", "buffer_bytes": "3MiB"},
            "buffer_bytes: must be a multiple of 2 x request_bytes = 2097152, got 3145728",
        ),
        ({"backend": "spdk"}, "backend: Input should be 'posix-uring', 'posix-aio'"),
    ],
)
def test_bad_options_name_the_option(options, says):
    with pytest.raises(UserError, match=f"^engine nixl: {says}"):
        engines.validate_options("nixl", options)


def test_the_environment_block_names_the_wheel_and_its_plugins():
    info = nixl_peer.nixl_info()
    assert info["available"] is True and info["version"]
    assert {"POSIX", "GDS", "GDS_MT"} <= set(info["plugins"])


def test_the_in_place_path_gds_takes_moves_each_tensor_at_its_offset(make_engine, targets):
    """The transfers gds and gds-mt make from registered device tensors, driven here through
    the real POSIX backend with host tensors on 4 KiB-aligned memory standing in for device
    memory (the one thing that needs a GPU): every tensor, cut into `request_bytes`
    descriptors, lands at its offset in the file, and reads back into zeroed tensors bit for
    bit; an empty tensor takes no descriptor."""
    (target,) = targets(1)
    eng = make_engine("nixl", [target], backend="posix-uring", request_bytes="8KiB", batch=2)
    inner = eng.engine  # behind the clock (bench.measure.clock.Clocked)
    inner.warm({"x": torch.zeros(1)})
    # lengths in 4 KiB units: O_DIRECT from host memory needs them (cuFile takes any length)
    sizes = [20480, 0, 4096, 12288]
    buf = odirect.HostBuffer(sum(odirect.align_up(max(n, 1)) for n in sizes) * 2)
    g = torch.Generator().manual_seed(4)
    mem = torch.frombuffer(buf.mapping, dtype=torch.uint8)
    tensors, at = [], 0
    for n in sizes:
        t = mem[at : at + n]
        t.copy_(torch.randint(0, 255, (n,), dtype=torch.uint8, generator=g))
        tensors.append(t)
        at += odirect.align_up(max(n, 1))
    layout, length = nixl_peer._layout(tensors)
    want = [t.clone() for t in tensors]
    path = os.path.join(target, "direct.bin")
    fd = os.open(path, nixl_peer.OPEN_FLAGS, 0o644)
    detail = inner._detail(True)
    try:
        odirect.preallocate(fd, length)
        inner._device_io("WRITE", fd, layout, tensors, length, detail, mem="DRAM")
        os.fsync(fd)
    finally:
        os.close(fd)
    data = Path(path).read_bytes()
    for w, (off, n) in zip(want, layout, strict=True):
        assert data[off : off + n] == w.numpy().tobytes()
    # 20 KiB: 3 descriptors (8 + 8 + 4 KiB); 4 KiB: 1; 12 KiB: 2; the empty tensor none; 2 a
    # request
    assert (detail.descriptors, detail.requests) == (6, 3)
    for t in tensors:
        t.zero_()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        inner._device_io("READ", fd, layout, tensors, length, inner._detail(True), mem="DRAM")
    finally:
        os.close(fd)
    assert all(torch.equal(t, w) for t, w in zip(tensors, want, strict=True))
    del mem, tensors
