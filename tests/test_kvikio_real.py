"""The gds engine's kvikio calls held against the real kvikio package (no GPU needed).

`make test` installs the real kvikio without its CUDA dependencies (scripts/kvikio-cpu.txt).
It imports on a machine without a GPU, its settings and file handles work, and every I/O call
reaches its C++ layer, which then fails for want of libcuda.so.1. So each call the engine makes
is made here, by the engine's own code and with its own arguments, and must get that far: an
AttributeError or TypeError here is a call the real library refuses, which no fake can show.
The device memory the engine hands kvikio is FakeCuda's (the one thing that needs hardware).
Every test here fails, never skips, when kvikio is missing, unless CKPTBENCH_ALLOW_NO_KVIKIO=1.

Calls held here, each by the test that names it:
- `import kvikio`, `kvikio.defaults`, `kvikio.cufile_driver` (their import):
  test_the_engine_imports_the_submodules_it_uses (a fresh process);
- `defaults.get` / `defaults.set` (dict, key and value, as a context manager) with the keys the
  engine uses: test_the_engines_settings_are_kvikios, test_the_engine_sets_kvikio_once;
- `defaults.is_compat_mode_preferred`, `cufile_driver.properties.{is_gds_available,
  allow_compat_mode, major_version, minor_version}`, `cufile_driver.libcufile_version`:
  test_the_environment_block_reads_kvikio;
- `CompatMode.ON` / `CompatMode.OFF`, `CuFile(path, "w")` / `CuFile(path, "r")`, `close`,
  `pwrite(buf, size, offset)` on device and host buffers, `IOFuture.get`:
  test_a_save_reaches_kvikios_cxx_layer;
- `pread(buf, size, offset)` on device buffers: test_a_restore_reaches_kvikios_cxx_layer;
- `memory_register` / `memory_deregister`: test_registration_reaches_kvikios_cxx_layer;
- the fake's whole surface: test_the_fakes_surface_is_the_real_one.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_kvikio import FakeCuda, FakeCudart, FakeKvikio

from bench import engines
from bench.engines import gds
from bench.storage import staging

try:
    import kvikio
    import kvikio.cufile_driver
    import kvikio.defaults
except Exception as e:  # noqa: BLE001 - any failure to load is the point
    if os.environ.get("CKPTBENCH_ALLOW_NO_KVIKIO") != "1":
        raise ImportError(
            f"the real kvikio does not load ({type(e).__name__}: {e}); `make test` installs "
            "it (scripts/kvikio-cpu.txt), or set CKPTBENCH_ALLOW_NO_KVIKIO=1 to skip these tests"
        ) from e
    pytest.skip(f"kvikio does not load: {e}", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
NO_DRIVER = "libcuda.so.1: cannot open shared object file"
# On a machine with a CUDA driver these calls succeed instead: the GPU check runs the real path.
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA driver is here: the `gpu` tests run kvikio for real"
)


def state_on(cuda: FakeCuda) -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {
        "w": cuda.to(torch.randn(64, 64, generator=g)),
        "b": cuda.to(torch.randn(1000, generator=g)),
        "step": torch.tensor(5.0),  # stays on the host, as an optimizer's step does
    }


def test_the_engine_imports_the_submodules_it_uses():
    """`import kvikio` alone leaves `kvikio.defaults` and `kvikio.cufile_driver` unset: in a
    fresh process only the engine's own imports can make them attributes."""
    code = """
import json, sys
import kvikio
bare = [hasattr(kvikio, m) for m in ("defaults", "cufile_driver")]
from bench.engines import gds
kv = gds.import_kvikio()
print(json.dumps({
    "bare": bare,
    "load_error": gds.kvikio_load_error(),
    "threads": kv.defaults.get("num_threads"),
    "gds_available": kv.cufile_driver.properties.is_gds_available,
    "reason": gds._global_reason(kv),
    "unavailable": gds.Gds.unavailable({"io": "kvikio"}),
}))
"""
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["bare"] == [False, False]
    assert out["load_error"] is None and out["unavailable"] is None
    assert out["threads"] >= 1 and out["gds_available"] is False
    # kvikio told us (compat mode preferred): not "cannot tell", which an AttributeError gives.
    assert out["reason"].startswith("kvikio prefers compat mode")


def test_the_engines_settings_are_kvikios():
    """Every key the engine sets, read, set, and set as a context manager that restores."""
    d = kvikio.defaults
    eng_keys = {"num_threads", "task_size", "gds_threshold", "compat_mode"}
    before = {k: d.get(k) for k in eng_keys}
    want = {"num_threads": 3, "task_size": 1 << 20, "gds_threshold": 0}
    with d.set(want):
        assert {k: d.get(k) for k in want} == want
        with d.set("compat_mode", kvikio.CompatMode.ON):
            assert d.get("compat_mode") == kvikio.CompatMode.ON
            assert d.is_compat_mode_preferred()
        assert d.get("compat_mode") == before["compat_mode"]
    assert {k: d.get(k) for k in eng_keys} == before
    with pytest.raises(KeyError):
        d.get("no_such_setting")
    with pytest.raises(ValueError, match="positive"):
        d.set("num_threads", 0)


def test_the_engine_sets_kvikio_once(make_engine, targets, fake_cuda):
    before = kvikio.defaults.get("num_threads")
    eng = make_engine("gds", targets(2), io="kvikio", device="cuda", threads_per_target=3)
    assert kvikio.defaults.get("num_threads") == 6
    assert kvikio.defaults.get("task_size") == 16 << 20
    assert kvikio.defaults.get("gds_threshold") == 0
    eng.warm(state_on(fake_cuda))
    assert eng._register_note == "not registered: kvikio is in compat mode"
    eng.close()
    assert kvikio.defaults.get("num_threads") == before


def test_a_save_reaches_kvikios_cxx_layer(make_engine, targets, fake_cuda):
    """The engine's CuFile opens, its pwrite of device and of host buffers, and its futures:
    every one reaches kvikio's C++ layer, whose failure (no libcuda) comes back as an OSError
    naming the file, and the save leaves nothing behind."""
    dirs = targets(2)
    eng = make_engine("gds", dirs, io="kvikio", device="cuda")
    for state in (state_on(fake_cuda), {"host": torch.arange(5000, dtype=torch.int32)}):
        with pytest.raises(OSError) as e:
            eng.save(state, "ckpt")
        assert NO_DRIVER in str(e.value) and e.value.filename.startswith(dirs[0])
        assert all(os.listdir(Path(d) / "ckpt") == [] for d in dirs)
        assert eng.status("ckpt") == "absent"


def test_a_restore_reaches_kvikios_cxx_layer(make_engine, targets, fake_cuda, monkeypatch):
    """A checkpoint of device tensors written by the emulated path (same layout, device
    checksums), read back into device memory through the kvikio engine: CuFile(path, "r") and
    pread of device buffers."""
    rt = FakeCudart()
    monkeypatch.setattr(staging, "cudart", lambda: rt)  # the emulation pins its bounce buffers
    dirs = targets(1)
    writer = make_engine("gds", dirs, io="emulated", device="cuda")
    want = torch.randn(3000)
    writer.save({"a": fake_cuda.to(want)}, "ckpt").wait()
    writer.close()
    eng = make_engine("gds", dirs, io="kvikio", device="cuda")
    with pytest.raises(OSError) as e:
        eng.load("ckpt", device="cuda")
    assert NO_DRIVER in str(e.value)
    # The host read path of the same engine needs no kvikio.
    assert torch.equal(eng.load("ckpt", device="cpu")["a"], want)


def test_registration_reaches_kvikios_cxx_layer(fake_cuda):
    """memory_register and memory_deregister of what the engine hands them (device memory)."""
    mem = fake_cuda.empty(4096)
    for name in ("memory_register", "memory_deregister"):
        fn = gds._memory_fn(kvikio, name)
        with pytest.raises(RuntimeError, match=NO_DRIVER):
            fn(gds.kvikio_buffer(mem, True))


def test_the_environment_block_reads_kvikio(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    info = gds.kvikio_info()
    assert info["available"] is True and info["version"] == kvikio.__version__
    assert info["mode"] == "compat" and info["compat_mode"] == "AUTO"
    assert info["nvidia_fs_available"] is False and info["cufile_allow_compat_mode"] is True
    assert isinstance(info["libcufile_version"], tuple)
    assert info["nvidia_fs_version"] == "0.0"
    unknown = {k: v for k, v in info.items() if isinstance(v, str) and v.startswith("unknown")}
    assert unknown == {}


def _params(fn: Any) -> list[tuple[str, Any, bool]] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a C function without a signature
        return None
    return [
        (p.name, p.kind, p.default is inspect.Parameter.empty)
        for p in sig.parameters.values()
        if p.name != "self"
    ]


def test_the_fakes_surface_is_the_real_one():
    """Every name the fake offers exists in the real package, with the same Python-level
    parameters (names, kinds, and which are required) where both have a signature."""
    fake = FakeKvikio()
    try:
        checked = 0
        for modname, module in fake.modules.items():
            real = sys.modules[modname]
            for name in [n for n in vars(module) if not n.startswith("_")]:
                assert hasattr(real, name), f"{modname}.{name} is not in the real kvikio"
                mine, theirs = getattr(module, name), getattr(real, name)
                if callable(mine) and not isinstance(mine, type):
                    want = _params(theirs)
                    if want is not None:
                        assert _params(mine) == want, f"{modname}.{name}"
                        checked += 1
        real_file, fake_file = kvikio.CuFile, fake.modules["kvikio"].CuFile
        for name in ("__init__", "pwrite", "pread", "close", "__enter__", "__exit__"):
            assert _params(getattr(fake_file, name)) == _params(getattr(real_file, name)), name
            checked += 1
        assert isinstance(inspect.getattr_static(real_file, "closed"), property)
        for name in ("get", "done"):
            assert hasattr(kvikio.cufile.IOFuture, name)
        props = type(kvikio.cufile_driver.properties)
        for name in vars(type(fake.modules["kvikio.cufile_driver"].properties)):
            if not name.startswith("_"):
                assert hasattr(props, name), f"properties.{name}"
        assert [m.name for m in fake.modules["kvikio"].CompatMode] == [
            m.name for m in kvikio.CompatMode
        ]
        assert [int(m) for m in fake.modules["kvikio"].CompatMode] == [
            int(m) for m in kvikio.CompatMode
        ]
        assert checked >= 10
    finally:
        fake.uninstall()


def test_kvikio_is_known_to_the_registry():
    """With the real package here, gds on a CUDA machine would take kvikio, not a skip."""
    assert engines.unavailable("gds", {"io": "kvikio"}) is None


def test_the_compat_reasons_agree_with_kvikios_own_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine names why kvikio prefers compat mode by making kvikio's checks again (its
    AUTO mode: libcufile loads, /run/udev is a directory, not WSL); held against the real
    package, the checks find a reason exactly when kvikio prefers compat mode, and turning
    compat mode ON by kvikio's own variable is named as such."""
    preferred = kvikio.defaults.is_compat_mode_preferred()
    assert bool(gds.compat_reasons(kvikio)) == preferred, gds.compat_reasons(kvikio)
    with kvikio.defaults.set("compat_mode", kvikio.CompatMode.ON):
        assert kvikio.defaults.is_compat_mode_preferred()
        assert gds.compat_reasons(kvikio) == [
            "compat mode is asked for (KVIKIO_COMPAT_MODE=ON or set in kvikio.defaults)"
        ]
    if preferred:  # as on this machine (no /run/udev, no libcufile, or both)
        why = "; ".join(gds.compat_reasons(kvikio))
        assert gds._global_reason(kvikio) == f"kvikio prefers compat mode: {why}"
