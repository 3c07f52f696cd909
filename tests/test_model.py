"""The analytical model: formulas against hand-computed cases, the break-even count, hardware
profiles (values quoted from shared/reference/figures.md), calibration from a run, and the
`ckptbench model` command."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from analysis import model, runs
from bench.cli import main
from bench.errors import UserError

FIX = Path(__file__).parent / "fixtures" / "runs"
DEFAULT = FIX / "20261202T160516Z-default-b10c3b"
GB = 1e9


def prof(**kw: float) -> model.Profile:
    """b = 50 GB/s, w = 5 GB/s, g = 2, C = 20 GB/s (c = 10 GB/s), S = 100 GB, unless given."""
    base = dict(
        name="t",
        description="",
        d2h_Bps=50 * GB,
        ssd_write_Bps=5 * GB,
        ssds_per_gpu=1,
        gpus_sharing_host=2,
        host_copy_Bps=20 * GB,
        size_bytes=int(100 * GB),
    )
    base.update(kw)
    return model.Profile(**base)  # type: ignore[arg-type]


def test_formulas_by_hand_two_ssds() -> None:
    p = prof()
    got = {pr.engine: pr for pr in model.predict_all(p, 2)}
    # gds: S / min(L = b = 50, 2 x 5 = 10) = 100 / 10
    assert got["gds"].stall_s == pytest.approx(10.0)
    assert got["gds"].durable_s == pytest.approx(10.0)
    assert got["gds"].host_bytes == 0
    # cpu-single: S / b = 2 s stall; + S / W(2) = 10 s persist; staging = S
    assert got["cpu-single"].stall_s == pytest.approx(2.0)
    assert got["cpu-single"].durable_s == pytest.approx(12.0)
    assert got["cpu-single"].host_bytes == pytest.approx(100 * GB)
    # cpu-double: persist S / min(c = 20 / 2 = 10, 10) = 10 s; staging + page cache = 2 S
    assert got["cpu-double"].stall_s == pytest.approx(2.0)
    assert got["cpu-double"].durable_s == pytest.approx(12.0)
    assert got["cpu-double"].host_bytes == pytest.approx(200 * GB)
    # torch-save: one SSD, synchronous: 2 + 100 / min(10, 5) = 22 s
    assert got["torch-save"].stall_s == pytest.approx(22.0)
    assert got["torch-save"].durable_s == pytest.approx(22.0)
    assert got["torch-save"].host_bytes == pytest.approx(100 * GB)
    # dcp: stall 2 s, durable 22 s (first SSD only), 2 S
    assert got["dcp"].stall_s == pytest.approx(2.0)
    assert got["dcp"].durable_s == pytest.approx(22.0)
    assert got["dcp"].host_bytes == pytest.approx(200 * GB)


def test_host_copy_bounds_cpu_double_when_slower_than_ssds() -> None:
    # C = 8 GB/s shared by 2 GPUs: c = 4 GB/s < W(4) = 20 GB/s
    p = prof(host_copy_Bps=8 * GB)
    assert model.predict(p, "cpu-double", 4).durable_s == pytest.approx(2 + 100 / 4)
    assert model.predict(p, "cpu-single", 4).durable_s == pytest.approx(2 + 100 / 20)


def test_stall_ratio_and_break_even_by_hand() -> None:
    p = prof()
    assert model.stall_ratio(p, 1) == pytest.approx(10.0)  # 50 / 5
    assert model.stall_ratio(p, 2) == pytest.approx(5.0)
    np.testing.assert_allclose(model.stall_ratio(p, [5, 10, 20]), [2.0, 1.0, 1.0])
    assert model.break_even(p) == pytest.approx(10.0)
    assert model.break_even_ssds(p) == 10
    # GDS stall equals the CPU-centric stall exactly at the break-even
    n = model.break_even_ssds(p)
    assert model.predict(p, "gds", n).stall_s == pytest.approx(
        model.predict(p, "cpu-single", n).stall_s
    )


def test_break_even_rounds_up_and_is_consistent() -> None:
    p = prof(d2h_Bps=52.77 * GB, ssd_write_Bps=3.8 * GB)
    assert model.break_even(p) == pytest.approx(52.77 / 3.8)
    assert model.break_even_ssds(p) == 14
    assert model.stall_ratio(p, 13) > 1 >= model.stall_ratio(p, 14)


def test_break_even_never_when_link_is_slower_or_device_shared() -> None:
    slow_link = prof(link_Bps=20 * GB)
    assert math.isinf(model.break_even(slow_link))
    assert model.break_even_ssds(slow_link) is None
    assert model.stall_ratio(slow_link, 100) == pytest.approx(50 / 20)
    shared = prof(shared_device=True)
    assert math.isinf(model.break_even(shared))
    assert model.stall_ratio(shared, 8) == pytest.approx(10.0)  # adding targets adds nothing
    assert model.predict(shared, "cpu-single", 4).durable_s == pytest.approx(2 + 100 / 5)
    fast_disk = prof(shared_device=True, ssd_write_Bps=60 * GB)
    assert model.break_even_ssds(fast_disk) == 1


@pytest.mark.parametrize(
    ("name", "b", "w", "n", "break_even"),
    [
        ("a100-gen4", 25, 3.8, 1, 7),
        ("dgx-h100-gen4", 52.77, 3.8, 1, 14),
        ("dgx-h100-gen5", 52.77, 6.6, 1, 8),
        ("nd-h200-v5", 52.77, 3.3, 1, 16),
    ],
)
def test_profiles_quote_the_reference_figures(
    name: str, b: float, w: float, n: int, break_even: int
) -> None:
    p = model.load_profile(name)
    assert p.d2h_Bps == pytest.approx(b * GB)
    assert p.ssd_write_Bps == pytest.approx(w * GB)
    assert p.ssds_per_gpu == n
    assert model.break_even_ssds(p) == break_even
    assert set(p.sources) >= set(model.REQUIRED_INPUTS)
    for key, (kind, source) in p.sources.items():
        assert kind in ("measured", "vendor rating", "spec", "assumed"), key
        # every figure cites the reference list, or says it is assumed
        assert "figures.md" in source or kind == "assumed", (key, source)
        if "figures.md" not in source:
            assert "assumed" in source, (key, source)


def test_load_profiles_skips_the_run_placeholder() -> None:
    names = [p.name for p in model.load_profiles()]
    assert names == ["a100-gen4", "dgx-h100-gen4", "dgx-h100-gen5", "nd-h200-v5"]
    assert "this-machine" in model.profile_names()


def test_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown hardware profile 'nope' \\(known: a100-gen4"):
        model.load_profile("nope")
    with pytest.raises(
        UserError, match="filled from a measured run: ckptbench model this-machine --from-run"
    ):
        model.load_profile("this-machine")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndescription: y\nd2h_gbps: {value: 1, kind: measured, source: s}\n")
    with pytest.raises(UserError, match="bad.yaml: d2h_gbps: unknown key"):
        model.load_profile(str(bad))
    src = (model.PROFILES_DIR / "dgx-h100-gen4.yaml").read_text()
    neg = tmp_path / "neg.yaml"
    neg.write_text(src.replace("value: 52.77", "value: -1"))
    with pytest.raises(UserError, match="d2h_GBps.value: must be positive"):
        model.load_profile(str(neg))


def test_from_run_calibrates_from_cpu_single_medians() -> None:
    run = runs.load(str(DEFAULT))
    p = model.from_run(run)
    cs = run.rows[(run.rows["engine"] == "cpu-single") & ~run.rows["warmup"]]
    snap = float(np.median(cs["total_bytes"] / cs["stall_s"]))
    one = cs[cs["n_targets"] == 1]
    persist = float(np.median(one["total_bytes"] / one["persist_s"]))
    assert len(cs) == 12
    assert p.d2h_Bps == pytest.approx(snap)
    assert p.d2h_Bps == pytest.approx(8.613e9, rel=1e-3)  # the fixture's real numbers
    assert p.ssd_write_Bps == pytest.approx(persist)
    assert p.ssd_write_Bps == pytest.approx(3.023e9, rel=1e-3)
    assert p.host_copy_Bps == pytest.approx(snap)
    assert p.shared_device is True  # env.json: all targets on vda
    assert p.size_bytes == 1 << 30
    assert "cpu-single" in p.sources["d2h_GBps"][1]
    assert math.isinf(model.break_even(p))


def test_from_run_prefers_env_ceilings() -> None:
    run = runs.load(str(DEFAULT))
    env = dict(
        run.env, ceilings={"d2h_Bps": 20e9, "copy_Bps": 15e9, "direct_write_Bps": [2e9, 2e9]}
    )
    p = model.from_run(dataclasses.replace(run, env=env))
    assert (p.d2h_Bps, p.host_copy_Bps, p.ssd_write_Bps) == (20e9, 15e9, 2e9)
    assert "ceilings" in p.sources["d2h_GBps"][1]


def test_cli_model_prints_the_feasibility_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "dgx-h100-gen4"]) == 0
    out = capsys.readouterr().out
    assert "break-even: 14 SSDs per GPU (n* = b / w = 52.77 / 3.80 = 13.89)" in out
    assert "52.77 GB/s" in out and "vendor rating" in out and "nvbandwidth" in out
    assert "ratio         13.89" in out
    lines = {
        ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith(("gds ", "cpu-"))
    }
    assert lines["gds"][1] == "21.1"  # 80 GB / 3.8 GB/s
    assert lines["cpu-single"][1] == "1.52"  # 80 GB / 52.77 GB/s
    assert main(["model", "dgx-h100-gen4", "--ssds", "2", "--size", "40GB"]) == 0
    out = capsys.readouterr().out
    assert "40 GB with 2 SSD(s) per GPU" in out
    gds = next(ln for ln in out.splitlines() if ln.startswith("gds "))
    assert gds.split()[1] == "5.26"  # 40 / 7.6


@pytest.mark.parametrize("profile", ["this-machine", "configs/hardware/this-machine.yaml"])
def test_cli_model_from_run(
    capsys: pytest.CaptureFixture[str], profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profile a run fills works by name and by path alike."""
    monkeypatch.chdir(REPO)
    assert main(["model", profile, "--from-run", str(DEFAULT)]) == 0
    out = capsys.readouterr().out
    assert "break-even: never on this storage (all targets share one device" in out
    assert "8.61 GB/s" in out
    assert main(["model", "configs/hardware/dgx-h100-gen4.yaml", "--from-run", str(DEFAULT)]) == 2
    assert "--from-run fills the this-machine profile, not " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["model", "nope"], "ckptbench: error: unknown hardware profile 'nope'"),
        (
            ["model", "dgx-h100-gen4", "--size", "12parsecs"],
            "ckptbench: error: --size: cannot read",
        ),
        (["model", "dgx-h100-gen4", "--ssds", "0"], "ckptbench: error: --ssds: must be at least 1"),
        (["model", "this-machine"], "ckptbench: error: profile 'this-machine' is filled from"),
        (["model", "a100-gen4", "--from-run", str(DEFAULT)], "ckptbench: error: --from-run fills"),
    ],
)
def test_cli_model_errors_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1
