"""kvikio as gds loads it (bench/engines/gds/kvikio_lib.py): a package whose submodules must be
imported, and a kvikio that is missing or whose libraries do not load, which is a reason
(in `ckptbench engines`, env.json and the sweep), never a crash.

The engine runs over FakeKvikio and FakeCuda (tests/fake_kvikio.py), which follow kvikio's
real contracts; its fixtures and sample states are in tests/conftest.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import QUICK_BASELINE_S

from bench.common.errors import UserError
from bench.engines import gds


def test_the_fake_is_a_package_whose_submodules_must_be_imported(fake_kvikio):
    """As the real kvikio: `import kvikio` alone gives neither `defaults` nor `cufile_driver`."""
    fake_kvikio()
    import kvikio

    assert not hasattr(kvikio, "defaults") and not hasattr(kvikio, "cufile_driver")
    kv = gds.import_kvikio()
    assert kv is kvikio and kv.defaults.get("num_threads") == 1
    assert kv.cufile_driver.properties.is_gds_available


def test_unavailable_on_cuda_without_kvikio(monkeypatch, no_kvikio):
    no_kvikio()
    reason = gds.Gds.unavailable({"device": "cuda"})
    assert reason and "kvikio is not installed" in reason and "io: emulated" in reason
    assert gds.Gds.unavailable({"device": "cuda", "io": "emulated"}) is None
    assert gds.Gds.unavailable({"device": "host-emulated"}) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gds.Gds.unavailable({}) == reason  # auto on a CUDA machine means kvikio


def test_kvikio_that_does_not_import(make_engine, targets, no_kvikio):
    no_kvikio()
    from bench import engines

    with pytest.raises(
        UserError, match=r"gds cannot run here: kvikio is not installed \(No module"
    ):
        engines.create("gds", targets(1), io="kvikio", device="host-emulated")


class DynamicLibNotFoundError(RuntimeError):
    """What cuda.pathfinder raises when libcufile cannot be found (a RuntimeError)."""


def test_kvikio_whose_libraries_do_not_load_is_a_reason_not_a_crash(monkeypatch, no_kvikio, capsys):
    """libkvikio loads libcufile through cuda.pathfinder, which raises a RuntimeError subclass
    when it is missing: `ckptbench engines`, the environment block and the engine give that as
    the reason why gds cannot run."""
    from bench import cli, engines

    no_kvikio(DynamicLibNotFoundError('Failure finding "libcufile.so.0"'))
    assert gds.kvikio_load_error() == (
        'kvikio does not load (DynamicLibNotFoundError: Failure finding "libcufile.so.0")'
    )
    reason = gds.Gds.unavailable({"io": "kvikio"})
    assert reason and reason.startswith("kvikio does not load (DynamicLibNotFoundError")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gds.kvikio_info() == {"available": False, "reason": gds.kvikio_load_error()}
    with pytest.raises(UserError, match="kvikio does not load"):
        engines.create("gds", ["/nonexistent"], io="kvikio")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["engines"]) == 0
    assert "gds" in capsys.readouterr().out


def test_a_sweep_skips_gds_that_cannot_run_and_says_why(scratch, no_kvikio, capsys):
    """gds on CUDA without kvikio (here: io=kvikio without kvikio) used to write error rows;
    the sweep now skips it with the reason, in the terminal summary and env.json."""
    from bench import cli
    from bench.measure import results

    no_kvikio()
    cfg = scratch / "c.yaml"
    cfg.write_text(
        "name: skip\nengines: [gds, cpu-double]\ntotal_sizes: [1MiB]\ntensor_sizes: [1MiB]\n"
        f"scratch: {scratch}/t\nrepetitions: 1\nwarmups: 0\nceilings: {{enabled: false}}\n"
        f"engine_options: {{gds: {{io: kvikio}}}}\nhost_baseline_s: {QUICK_BASELINE_S}\n"
    )
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 0
    out = capsys.readouterr().out
    assert "note: engine gds skipped: it cannot run here: kvikio is not installed" in out
    (run_dir,) = (scratch / "out").iterdir()
    rows = results.read_rows(str(run_dir))
    assert list(rows["engine"]) == ["cpu-double"] and rows["verified"].all()
    env = json.loads((run_dir / "env.json").read_text())
    assert any(n.startswith("engine gds skipped") for n in env["notes"])
    # With nothing left to run, the sweep is refused in one line.
    cfg.write_text(cfg.read_text().replace("[gds, cpu-double]", "[gds]"))
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 2
    assert (
        "no engine of the config can run here (gds: kvikio is not installed"
        in capsys.readouterr().err
    )
