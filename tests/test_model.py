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

from analysis import runs
from analysis.model.calibrate import from_run, near
from analysis.model.host import host_need
from analysis.model.planning import plan
from analysis.model.predict import (
    ENGINES,
    break_even,
    break_even_ssds,
    predict,
    predict_all,
    restore_break_even,
    restore_gain,
    stall_ratio,
    traits_of,
)
from analysis.model.profiles import (
    PROFILES_DIR,
    REQUIRED_INPUTS,
    Profile,
    load_profile,
    load_profiles,
    profile_names,
    reference_cpu_cost,
)
from analysis.model.render import describe_break_even, input_rows
from bench.cli import main
from bench.common.errors import UserError
from bench.common.traits import BUILTIN

FIX = Path(__file__).parent / "fixtures" / "runs"
DEFAULT = FIX / "20261202T160516Z-default-b10c3b"
GB = 1e9
HOST_KEYS = ("host_cores", "dram_GBps")


def prof(**kw: float) -> Profile:
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
    return Profile(**base)  # type: ignore[arg-type]


def test_formulas_by_hand_two_ssds_two_gpus() -> None:
    """g = 2 GPUs at once (the profile's), 2 SSDs each: m = 4 SSDs, W_g = 20 / 2 = 10,
    d = min(b = 50, C / g = 10) = 10 GB/s."""
    p = prof()
    got = {pr.engine: pr for pr in predict_all(p, 2)}
    # gds: S / min(L = 50, W_g = 10)
    assert got["gds"].stall_s == pytest.approx(10.0)
    assert got["gds"].durable_s == pytest.approx(10.0)
    assert got["gds"].host_bytes == 0
    # cpu-single: S / d = 10 s stall; + S / W_g = 10 s persist; staging = S
    assert got["cpu-single"].stall_s == pytest.approx(10.0)
    assert got["cpu-single"].durable_s == pytest.approx(20.0)
    assert got["cpu-single"].host_bytes == pytest.approx(100 * GB)
    # cpu-double: persist S / min(P(4) / g = 10, C / g = 10); staging + page cache = 2 S
    assert got["cpu-double"].stall_s == pytest.approx(10.0)
    assert got["cpu-double"].durable_s == pytest.approx(20.0)
    assert got["cpu-double"].host_bytes == pytest.approx(200 * GB)
    # torch-save: the first SSD shared by both GPUs (5 / 2), synchronous: 10 + 100 / 2.5
    assert got["torch-save"].stall_s == pytest.approx(50.0)
    assert got["torch-save"].durable_s == pytest.approx(50.0)
    assert got["torch-save"].host_bytes == pytest.approx(100 * GB)
    # dcp: stall 10 s, durable 50 s, 2 S
    assert got["dcp"].stall_s == pytest.approx(10.0)
    assert got["dcp"].durable_s == pytest.approx(50.0)
    assert got["dcp"].host_bytes == pytest.approx(200 * GB)


def test_restore_by_hand_two_ssds_two_gpus() -> None:
    """r = 8 GB/s a SSD, h = 30 GB/s, g = 2 GPUs with 2 SSDs each: R(4) = 32, R_g = 16; the
    host's share of its memory into each link h_g = min(30, C / g = 10) = 10 GB/s."""
    p = prof(ssd_read_Bps=8 * GB, h2d_Bps=30 * GB)
    got = {pr.engine: pr.restore_s for pr in predict_all(p, 2)}
    assert got["gds"] == pytest.approx(100 / 16)  # S / min(R_g, h): its own link
    assert got["cpu-single"] == pytest.approx(100 / 10)  # S / min(R_g, h_g)
    assert got["cpu-double"] == pytest.approx(100 / 10)  # S / min(Q/g = 16, C/g = 10, h_g)
    assert got["torch-save"] == pytest.approx(100 / 4)  # first SSD shared: R(1) / g = 4
    assert got["dcp"] == pytest.approx(100 / 4)
    # CPU-centric over GDS: 10 / 6.25 with 2 SSDs a GPU; equal with 1 (R_g = 8 < h_g)
    assert restore_gain(p, [1, 2]) == pytest.approx([1.0, 1.6])
    assert restore_break_even(p) == pytest.approx(10 / 8)
    # no link (a host-emulated run: restores land in host memory): the read alone
    emu = prof(ssd_read_Bps=8 * GB, h2d_Bps=None)
    assert predict(emu, "cpu-single", 4).restore_s == pytest.approx(100 / 16)
    assert restore_break_even(emu) == math.inf
    # a measured read replaces the per-SSD figure; the buffered read of all the targets is
    # what cpu-double gets, that of the first what the loaders of one file get (one reader or
    # several: readahead keeps one as fast)
    meas = prof(
        ssd_read_Bps=8 * GB,
        direct_read_by_n=((1, 3 * GB), (4, 12 * GB)),
        buffered_read_by_n=((1, 2 * GB), (4, 6 * GB)),
    )
    assert predict(meas, "cpu-single", 4).restore_s == pytest.approx(100 / 6)  # 12 / g
    assert predict(meas, "cpu-double", 4).restore_s == pytest.approx(100 / 3)  # 6 / g
    assert predict(meas, "torch-save", 4).restore_s == pytest.approx(100 / 1)  # Q(1) / g
    assert predict(meas, "dcp", 4).restore_s == pytest.approx(100 / 1)  # Q(1) / g
    # without any read figure the restore is unknown, not a guess
    assert math.isnan(predict(prof(), "cpu-single").restore_s)


def test_bounce_terms_by_hand_copy_beside_or_after_the_io() -> None:
    """The bounce path's copy and its I/O: one after the other (DeepNVMe's one-process ds_io)
    or side by side (a double buffer, several threads). g = 2, 2 SSDs each: d = 10, W_g = 10;
    r = 8 a SSD, R_g = 16, h = 30, h_g = min(30, C / g = 10) = 10 GB/s."""
    p = prof(ssd_read_Bps=8 * GB, h2d_Bps=30 * GB)
    single = BUILTIN["cpu-single"]
    # the default: the write after the copy (S/d + S/W_g), the read beside the copy
    assert predict(p, "x", 4, traits=single).durable_s == pytest.approx(10 + 10)
    assert predict(p, "x", 4, traits=single).restore_s == pytest.approx(100 / 10)
    # write_overlaps_copy: the slower of the two, S / min(d, W_g)
    beside = dataclasses.replace(single, stall="durable", write_overlaps_copy=True)
    assert predict(p, "x", 4, traits=beside).durable_s == pytest.approx(100 / 10)
    assert predict(p, "x", 4, traits=beside).stall_s == pytest.approx(100 / 10)
    assert predict(p, "x", 8, traits=beside).durable_s == pytest.approx(100 / 10)  # d bounds
    # read_overlaps_copy False: the whole read, then the copy: S/R_g + S/h_g
    after = dataclasses.replace(single, read_overlaps_copy=False)
    assert predict(p, "x", 4, traits=after).restore_s == pytest.approx(100 / 16 + 100 / 10)
    # GDS has no copy: the trait does not touch it
    gds_after = dataclasses.replace(BUILTIN["gds"], read_overlaps_copy=False)
    assert predict(p, "x", 4, traits=gds_after).restore_s == pytest.approx(100 / 16)


def test_one_gpu_alone_gets_the_whole_host() -> None:
    p = prof()
    # g = 1 over 2 SSDs: d = min(50, 20) = 20, W = 10
    assert predict(p, "cpu-single", 2, g=1).stall_s == pytest.approx(5.0)
    assert predict(p, "cpu-single", 2, g=1).durable_s == pytest.approx(15.0)
    assert predict(p, "gds", 2, g=1).stall_s == pytest.approx(10.0)
    # the page-cache path: min(P(1) = 5, C = 20); dedicated targets give the first SSD alone
    assert predict(p, "torch-save", 2, g=1).stall_s == pytest.approx(5 + 20)
    assert predict(p, "dcp", 4, g=2, mapping="dedicated").durable_s == pytest.approx(10 + 20)


def test_measured_storage_and_serialisation_replace_the_per_ssd_figures() -> None:
    p = prof(
        gpus_sharing_host=1,
        direct_by_n=((1, 2 * GB), (4, 3 * GB)),
        buffered_by_n=((1, 1 * GB), (4, 1.5 * GB)),
        serialize_Bps=0.5 * GB,
    )
    assert predict(p, "cpu-single", 4).durable_s == pytest.approx(100 / 20 + 100 / 3)
    assert predict(p, "cpu-double", 4).durable_s == pytest.approx(100 / 20 + 100 / 1.5)
    assert predict(p, "gds", 1).stall_s == pytest.approx(100 / 2)
    # torch.save: serialises (z = 0.5), then writes into the page cache (P(1) = 1), one after
    # the other
    assert predict(p, "torch-save", 1).stall_s == pytest.approx(100 / 20 + 100 / 1 + 100 / 0.5)


def test_host_copy_bounds_cpu_double_when_slower_than_ssds() -> None:
    # C = 8 GB/s shared by 2 GPUs: c = 4 GB/s < W_g = W(4) / 2 = 10 GB/s; d = 4 GB/s too
    p = prof(host_copy_Bps=8 * GB)
    assert predict(p, "cpu-double", 4).durable_s == pytest.approx(100 / 4 + 100 / 4)
    assert predict(p, "cpu-single", 4).durable_s == pytest.approx(100 / 4 + 100 / 10)


def test_stall_ratio_and_break_even_by_hand() -> None:
    p = prof()  # d = min(50, 20 / 2) = 10, w = 5
    assert stall_ratio(p, 1) == pytest.approx(2.0)
    assert stall_ratio(p, 2) == pytest.approx(1.0)
    np.testing.assert_allclose(stall_ratio(p, [1, 4, 20]), [2.0, 0.5, 0.2])  # L = 50 caps
    assert break_even(p) == pytest.approx(2.0)
    assert break_even_ssds(p) == 2
    # one GPU alone has the host's whole intake: d = 20
    assert stall_ratio(p, 1, g=1) == pytest.approx(4.0)
    assert break_even(p, g=1) == pytest.approx(4.0)
    # GDS stall equals the CPU-centric stall exactly at the break-even
    n = break_even_ssds(p)
    g = p.gpus_sharing_host
    assert predict(p, "gds", n * g).stall_s == pytest.approx(
        predict(p, "cpu-single", n * g).stall_s
    )


def test_break_even_rounds_up_and_is_consistent() -> None:
    p = prof(d2h_Bps=52.77 * GB, ssd_write_Bps=3.8 * GB, gpus_sharing_host=1, host_copy_Bps=1e12)
    assert break_even(p) == pytest.approx(52.77 / 3.8)
    assert break_even_ssds(p) == 14
    assert stall_ratio(p, 13) > 1 >= stall_ratio(p, 14)


def test_break_even_never_when_link_is_slower_or_device_shared() -> None:
    slow_link = prof(link_Bps=5 * GB)  # L = 5 < d = 10
    assert math.isinf(break_even(slow_link))
    assert break_even_ssds(slow_link) is None
    assert stall_ratio(slow_link, 100) == pytest.approx(10 / 5)
    shared = prof(shared_device=True)
    assert math.isinf(break_even(shared))
    assert stall_ratio(shared, 8) == pytest.approx(10 / 2.5)  # adding targets adds nothing
    assert predict(shared, "cpu-single", 4).durable_s == pytest.approx(10 + 100 / 2.5)
    fast_disk = prof(shared_device=True, ssd_write_Bps=60 * GB)
    assert break_even_ssds(fast_disk) == 1


def test_break_even_from_measured_target_counts_on_separate_devices() -> None:
    """A run's profile (W(n) measured per target count, distinct devices): the break-even is
    the fewest measured count where GDS stalls no longer, not "never, one shared device"."""
    measured = ((1, 3 * GB), (2, 6 * GB), (4, 12 * GB))  # d = min(b, C/g) = 10 GB/s
    p = prof(gpus_sharing_host=1, d2h_Bps=10 * GB, direct_by_n=measured)
    assert stall_ratio(p, 2) > 1 >= stall_ratio(p, 4)
    assert break_even(p) == 4.0 and break_even_ssds(p) == 4
    said = describe_break_even(p)
    assert said.startswith("break-even: 4 SSDs per GPU (the fewest measured target count")
    short = prof(gpus_sharing_host=1, d2h_Bps=10 * GB, direct_by_n=measured[:2])
    assert math.isinf(break_even(short))
    assert "not within the measured target counts (W(2) = 6.00 GB/s < d = 10.00 GB/s)" in (
        describe_break_even(short)
    )
    shared = prof(gpus_sharing_host=1, d2h_Bps=10 * GB, direct_by_n=measured, shared_device=True)
    assert math.isinf(break_even(shared))
    assert "all targets share one device" in describe_break_even(shared)


def test_checkpoint_plan_is_young_daly_held_back_to_the_persist_time() -> None:
    p = prof(gpus_sharing_host=1)
    m = 10 * 3600
    plans = {pl.engine: pl for pl in plan(p, m)}
    gds = plans["gds"]  # delta = 10 s (S / W(1) = 100 / 5 / ... with g = 1: min(L, 5))
    delta = predict(p, "gds").stall_s
    x = delta / (2 * m)
    tau = math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta
    assert gds.interval_s == pytest.approx(tau)
    assert gds.lost_fraction == pytest.approx(delta / (tau + delta) + tau / 2 / m)
    cs = plans["cpu-single"]
    pr = predict(p, "cpu-single")
    lag = pr.durable_s - pr.stall_s
    assert cs.stall_s == pytest.approx(pr.stall_s) and cs.interval_s >= lag
    assert cs.lost_fraction == pytest.approx(
        pr.stall_s / (cs.interval_s + pr.stall_s) + (cs.interval_s / 2 + lag) / m
    )
    # a path whose persist outlasts the optimum is held back to it
    slow = {pl.engine: pl for pl in plan(prof(gpus_sharing_host=1, ssd_write_Bps=0.01 * GB), 3600)}
    assert slow["cpu-single"].limited_by_persist
    assert slow["cpu-single"].interval_s == pytest.approx(
        predict(prof(gpus_sharing_host=1, ssd_write_Bps=0.01 * GB), "cpu-single").durable_s
        - predict(prof(gpus_sharing_host=1, ssd_write_Bps=0.01 * GB), "cpu-single").stall_s
    )
    with pytest.raises(UserError, match="--mtbf must be positive"):
        plan(p, 0)


def test_a_restart_reads_the_checkpoint_back_measured_else_modelled() -> None:
    """The restart cost of each path: `restart_s` plus its restore, as measured where given,
    else as the model predicts it (S / min(R(1), h_g) = 100 / min(8, 20) for cpu-single)."""
    p = prof(gpus_sharing_host=1, ssd_read_Bps=8 * GB, h2d_Bps=30 * GB)
    m = 10 * 3600
    plans = {pl.engine: pl for pl in plan(p, m, restart_s=60, restores={"gds": 40.0})}
    gds, cs = plans["gds"], plans["cpu-single"]
    assert (gds.restore_s, gds.restore_from) == (40.0, "measured")
    assert (cs.restore_s, cs.restore_from) == (pytest.approx(12.5), "model")
    lag = cs.durable_s - cs.stall_s
    assert cs.lost_fraction == pytest.approx(
        cs.stall_s / (cs.interval_s + cs.stall_s) + (cs.interval_s / 2 + lag + 60 + 12.5) / m
    )
    assert gds.lost_fraction == pytest.approx(
        gds.stall_s / (gds.interval_s + gds.stall_s) + (gds.interval_s / 2 + 60 + 40) / m
    )
    # no read figure and nothing measured: said, and counted as nothing
    unknown = {pl.engine: pl for pl in plan(prof(gpus_sharing_host=1), m)}["cpu-single"]
    assert (unknown.restore_s, unknown.restore_from) == (0.0, "unknown")


@pytest.mark.parametrize(
    ("name", "b", "w", "n", "break_even"),
    # all 8 GPUs checkpoint at once: d = min(b, C / 8 = 100 / 8 = 12.5 GB/s); n* = d / w
    [
        ("a100-gen4", 25, 3.8, 1, 4),  # 12.5 / 3.8 = 3.3
        ("dgx-h100-gen4", 52.77, 3.8, 1, 4),
        ("dgx-h100-gen5", 52.77, 6.6, 1, 2),  # 12.5 / 6.6 = 1.9
        ("nd-h200-v5", 52.77, 3.3, 1, 4),  # 12.5 / 3.3 = 3.8
    ],
)
def test_profiles_quote_the_reference_figures(
    name: str, b: float, w: float, n: int, break_even: int
) -> None:
    p = load_profile(name)
    assert p.d2h_Bps == pytest.approx(b * GB)
    assert p.ssd_write_Bps == pytest.approx(w * GB)
    assert p.ssds_per_gpu == n
    assert break_even_ssds(p) == break_even
    # the restore's inputs: one SSD's sequential read and the host-to-device link
    assert (p.ssd_read_Bps, p.h2d_Bps) == pytest.approx(
        {"a100-gen4": (6.4 * GB, 25 * GB), "nd-h200-v5": (6.0 * GB, 35 * GB)}.get(
            name, ((6.4 if "gen4" in name else 13) * GB, 35 * GB)
        )
    )
    assert set(p.sources) >= set(REQUIRED_INPUTS)
    for key, (kind, source) in p.sources.items():
        if key in HOST_KEYS:  # public figures of their own: test_host_figures_cite_their_source
            continue
        assert kind in ("measured", "vendor rating", "spec", "assumed"), key
        # every figure cites the reference list, or says it is assumed
        assert "figures.md" in source or kind == "assumed", (key, source)
        if "figures.md" not in source:
            assert "assumed" in source, (key, source)


def test_load_profiles_skips_the_run_placeholder() -> None:
    names = [p.name for p in load_profiles()]
    assert names == ["a100-gen4", "dgx-h100-gen4", "dgx-h100-gen5", "nd-h200-v5"]
    assert "this-machine" in profile_names()


def test_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown hardware profile 'nope' \\(known: a100-gen4"):
        load_profile("nope")
    with pytest.raises(
        UserError, match="filled from a measured run: ckptbench model this-machine --from-run"
    ):
        load_profile("this-machine")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndescription: y\nd2h_gbps: {value: 1, kind: measured, source: s}\n")
    with pytest.raises(UserError, match="bad.yaml: d2h_gbps: unknown key"):
        load_profile(str(bad))
    src = (PROFILES_DIR / "dgx-h100-gen4.yaml").read_text()
    neg = tmp_path / "neg.yaml"
    neg.write_text(src.replace("value: 52.77", "value: -1"))
    with pytest.raises(UserError, match="d2h_GBps.value: must be positive"):
        load_profile(str(neg))


def test_a_profile_without_read_figures_says_they_are_assumed(tmp_path: Path) -> None:
    """No ssd_read_GBps or h2d_GBps: read = write, host-to-device = device-to-host, each
    marked assumed in the inputs table."""
    import yaml

    d = yaml.safe_load((PROFILES_DIR / "dgx-h100-gen4.yaml").read_text())
    del d["ssd_read_GBps"], d["h2d_GBps"]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(d))
    p = load_profile(str(path))
    assert (p.ssd_read_Bps, p.h2d_Bps) == pytest.approx((3.8 * GB, 52.77 * GB))
    assert p.assumed("ssd_read_GBps") and p.assumed("h2d_GBps")
    rows = {r[0]: r for r in input_rows(p)}
    assert rows["SSD read r"][1:3] == ("3.80 GB/s", "assumed")
    assert "no read figure in the profile" in rows["SSD read r"][3]
    assert rows["host-to-device h"][1:3] == ("52.77 GB/s", "assumed")
    assert not load_profile("dgx-h100-gen4").assumed("ssd_read_GBps", "h2d_GBps")


def test_from_run_calibrates_from_cpu_single_medians() -> None:
    run = runs.load(str(DEFAULT))
    p = from_run(run)
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
    assert math.isinf(break_even(p))


def test_from_run_prefers_env_ceilings() -> None:
    run = runs.load(str(DEFAULT))
    one = {"direct_write_Bps": 2e9}
    env = dict(run.env, ceilings={"d2h_Bps": 20e9, "copy_Bps": 15e9, "per_ssd_count": {"1": one}})
    p = from_run(dataclasses.replace(run, env=env))
    assert (p.d2h_Bps, p.host_copy_Bps, p.ssd_write_Bps) == (20e9, 15e9, 2e9)
    assert "ceilings" in p.sources["d2h_GBps"][1]


def test_from_run_without_a_write_or_copy_ceiling_falls_back_on_the_rows() -> None:
    """A ceiling that failed (per_ssd_count without O_DIRECT, or no copy runs): the rows
    calibrate the model, and its sources say so, instead of a traceback or a NaN."""
    run = runs.load(str(DEFAULT))
    for ceilings in (
        {"copy_Bps": 9e9, "copy_runs": [9e9], "per_ssd_count": {"1": {"buffered_write_Bps": 1e9}}},
        {"per_ssd_count": {"1": {"direct_write_Bps": 2e9, "direct_write_runs": [2e9]}}},
    ):
        p = from_run(dataclasses.replace(run, env=dict(run.env, ceilings=ceilings)))
        assert all(math.isfinite(v) and v > 0 for v in (p.d2h_Bps, p.host_copy_Bps))
        assert math.isfinite(p.ssd_write_Bps) and p.ssd_write_Bps > 0
        assert "cpu-single" in p.sources["d2h_GBps"][1] or "ceilings" in p.sources["d2h_GBps"][1]


def test_from_run_predicts_with_the_typical_ceiling_runs_not_the_best() -> None:
    """The model predicts medians: the copy and write rates are the medians of the ceiling runs
    (before and after the sweep, averaged), not the best run the efficiencies are judged by."""
    run = runs.load(str(DEFAULT))

    def ceil(copy: list[float], direct: list[float]) -> dict:
        one = {"direct_write_Bps": max(direct), "direct_write_runs": direct}
        one |= {"buffered_write_Bps": 1e9, "buffered_write_runs": [1e9]}
        return {"copy_Bps": max(copy), "copy_runs": copy, "per_ssd_count": {"1": one}}

    env = dict(
        run.env,
        ceilings=ceil([9e9, 8e9, 4e9], [1e9, 0.5e9, 0.6e9]),
        ceilings_after=ceil([6e9, 10e9, 7e9], [0.4e9, 0.4e9, 0.9e9]),
    )
    p = from_run(dataclasses.replace(run, env=env))
    assert p.host_copy_Bps == pytest.approx((8e9 + 7e9) / 2)
    assert p.d2h_Bps == pytest.approx((8e9 + 7e9) / 2)  # host-emulated: the copy
    assert p.ssd_write_Bps == pytest.approx((0.6e9 + 0.4e9) / 2)
    assert "median" in p.sources["host_copy_GBps"][1]


def test_a_workload_is_predicted_from_the_probes_around_it() -> None:
    """With probes (env.json ceilings_probes), a workload's model takes the median of three
    points in time over its own target count: the point before (the previous probe, or the
    ceilings before the sweep), its own probe, the point after (the next probe, or the ceilings
    after). torch.save, one writer, gets the one-writer page-cache rate."""
    run = runs.load(str(DEFAULT))

    def ceil(direct: float, copy: float) -> dict:
        one = {"direct_write_Bps": direct, "direct_write_runs": [direct]}
        one |= {"buffered_write_Bps": 1e9, "buffered_write_runs": [1e9]}
        one |= {"buffered_write_config": {"jobs": 4, "iodepth": 1}}
        one |= {"buffered_write_search": [{"jobs": 1, "iodepth": 1, "Bps": 0.2e9}]}
        return {"copy_Bps": copy, "copy_runs": [copy], "per_ssd_count": {"1": one}}

    def probe(wl: str, n: int, direct: float, copy: float, one_writer: float) -> dict:
        return {
            "workload": wl,
            "n_targets": n,
            "direct_write_Bps": direct,
            "buffered_write_Bps": 1e9,
            "buffered_write_1_Bps": one_writer,
            "copy_Bps": copy,
            "serialize_Bps": 3e9,
        }

    env = dict(
        run.env,
        ceilings=ceil(1.0e9, 8e9),
        ceilings_after=ceil(0.4e9, 6e9),
        ceilings_probes=[
            probe("a", 1, 0.9e9, 9e9, 0.3e9),
            probe("a", 4, 5e9, 1e9, 5e9),  # another target count: never mixed in
            probe("b", 1, 0.5e9, 7e9, 0.5e9),
            probe("c", 1, 0.3e9, 5e9, 0.6e9),
        ],
    )
    r = dataclasses.replace(run, env=env)
    base = from_run(r)
    a, b, c = (near(base, r, wl, 1) for wl in "abc")
    assert dict(a.direct_by_n)[1] == pytest.approx(0.9e9)  # median(1.0, 0.9, 0.5)
    assert dict(b.direct_by_n)[1] == pytest.approx(0.5e9)  # median(0.9, 0.5, 0.3)
    assert dict(c.direct_by_n)[1] == pytest.approx(0.4e9)  # median(0.5, 0.3, 0.4 after)
    assert a.host_copy_Bps == pytest.approx(8e9) and c.host_copy_Bps == pytest.approx(6e9)
    assert a.d2h_Bps == a.host_copy_Bps  # host-emulated: the copy
    assert dict(a.buffered_single_by_n)[1] == pytest.approx(0.3e9)  # median(0.2, 0.3, 0.5)
    assert dict(c.buffered_single_by_n)[1] == pytest.approx(0.5e9)  # median(0.5, 0.6, 0.2)
    assert near(base, r, "not-probed", 1) is base
    s = float(1 << 30)
    ts = predict(b, "torch-save", 1, s, g=1)
    # one writer: P1, not P; then the serialisation z = 3e9 on top
    assert ts.durable_s == pytest.approx(s / 7e9 + s / 0.5e9 + s / 3e9)
    # cpu-double writes with several threads: the chosen configuration's rate
    assert predict(b, "cpu-double", 1, s, g=1).durable_s == pytest.approx(s / 7e9 + s / 1e9)


def test_cli_model_prints_the_feasibility_table(capsys: pytest.CaptureFixture[str]) -> None:
    """One answer: the headline, the ratio row and the per-engine table all come from predict
    with the host's 8 GPUs at once (d = min(52.77, 100 / 8) = 12.5 GB/s)."""
    assert main(["model", "dgx-h100-gen4"]) == 0
    out = capsys.readouterr().out
    assert (
        "break-even with 8 GPU(s) checkpointing at once: 4 SSDs per GPU (n* = d / w = "
        "12.50 / 3.80 = 3.29, d = min(b, C/g)); GDS stalls 3.29x as long"
    ) in out
    assert "52.77 GB/s" in out and "vendor rating" in out and "nvbandwidth" in out
    assert "ratio         3.29" in out
    lines = {
        ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith(("gds ", "cpu-"))
    }
    assert lines["gds"][1] == "21.1"  # 80 GB / 3.8 GB/s
    assert lines["cpu-single"][1] == "6.4"  # 80 GB / 12.5 GB/s
    assert main(["model", "dgx-h100-gen4", "--ssds", "2", "--size", "40GB"]) == 0
    out = capsys.readouterr().out
    assert "each GPU's checkpoint of 40 GB, 8 GPU(s) at once, 2 SSD(s) per GPU" in out
    gds = next(ln for ln in out.splitlines() if ln.startswith("gds "))
    assert gds.split()[1] == "5.26"  # 40 / 7.6


def test_cli_model_mtbf_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["model", "dgx-h100-gen4", "--mtbf", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = load_profile("dgx-h100-gen4")
    for pl in plan(p, 12 * 3600):
        got = out["engines"][pl.engine]
        assert got["interval_s"] == pytest.approx(pl.interval_s)
        assert got["lost_fraction"] == pytest.approx(pl.lost_fraction)
        assert 0 < got["lost_fraction"] < 1
    e = out["engines"]
    assert e["cpu-single"]["lost_fraction"] < e["gds"]["lost_fraction"]
    assert main(["model", "dgx-h100-gen4", "--mtbf", "0"]) == 2
    assert "--mtbf: must be a positive number of hours, got 0" in capsys.readouterr().err


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


# --- what checkpointing costs the host -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cores", "dram", "cites"),
    [
        ("dgx-h100-gen4", 112, 614.4, ("inference_results_v3.1", "ServeTheHome")),
        ("dgx-h100-gen5", 112, 614.4, ("inference_results_v3.1", "ServeTheHome")),
        ("a100-gen4", 128, 409.6, ("inference_results_v3.0", "Tom's Hardware")),
        ("nd-h200-v5", 96, None, ("nd-h200-v5-series",)),
    ],
)
def test_host_figures_cite_their_source(
    name: str, cores: float, dram: float | None, cites: tuple[str, ...]
) -> None:
    p = load_profile(name)
    assert p.host_cores == cores
    assert p.dram_Bps == (None if dram is None else pytest.approx(dram * GB))
    text = " ".join(p.sources[k][1] for k in HOST_KEYS if k in p.sources)
    for c in cites:
        assert c in text
    for k in HOST_KEYS:
        if k in p.sources:
            kind, source = p.sources[k]
            assert kind in ("spec", "derived", "assumed"), (k, kind)
            if kind == "assumed":
                assert "not verified" in source
    if dram is None:  # no cited figure: the table says so, never a guess
        row = next(r for r in input_rows(p) if r[0] == "host DRAM bandwidth")
        assert row[1:3] == ("unknown", "unknown")


def host_prof(**kw: object) -> Profile:
    """prof() with 2 SSDs of 5 GB/s in all (10 GB/s), 10 cores, 100 GB/s of DRAM and a CPU
    cost for cpu-double (0.5 CPU-s per GB, 0.3 of it persisting) and gds (0.1, persist unknown)."""
    base: dict[str, object] = dict(
        host_cores=10.0,
        dram_Bps=100 * GB,
        cpu_cost=(("cpu-double", 0.5, 0.3), ("gds", 0.1, math.nan)),
        cpu_cost_source="by hand",
    )
    base.update(kw)
    return dataclasses.replace(prof(), **base)  # type: ignore[arg-type]


def test_host_need_by_hand() -> None:
    p = host_prof()
    assert p.storage_Bps(p.host_ssds) == pytest.approx(10 * GB)  # 2 GPUs x 1 SSD x 5 GB/s
    cd = host_need(p, "cpu-double")
    assert cd.host_cores == pytest.approx(0.5 * 10)
    assert cd.host_cores_persist == pytest.approx(0.3 * 10)
    # staging lands (1), the page-cache copy reads and writes (2), the SSD reads it (1)
    assert cd.dram_per_byte == 4 and cd.dram_per_byte_persist == 3
    assert cd.dram_Bps == pytest.approx(40 * GB)
    assert cd.dram_share_persist == pytest.approx(30 / 100)
    assert cd.verdict == "affordable"
    gds = host_need(p, "gds")
    assert gds.host_cores == pytest.approx(1.0) and gds.host_cores_persist is None
    assert gds.dram_Bps == 0 and gds.verdict == "affordable"
    assert host_need(p, "cpu-single").verdict == "unknown: no measured CPU cost of cpu-single"
    few = host_need(host_prof(host_cores=4.0), "cpu-double")
    assert few.verdict == "cannot afford: 5 cores of 4"
    slow = host_need(host_prof(dram_Bps=30 * GB), "cpu-double")
    assert slow.verdict == "cannot afford: 40 GB/s of DRAM of 30"
    blind = host_prof(dram_Bps=None, host_cores=None)
    assert host_need(blind, "cpu-double").verdict == (
        "unknown: no cited host cores, no cited DRAM bandwidth"
    )
    assert host_need(blind, "cpu-double").dram_share_persist is None
    # gds moves no host DRAM: only its cores are unknown
    assert host_need(blind, "gds").verdict == "unknown: no cited host cores"


def test_cli_model_json_gives_host_cores_and_dram_for_every_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    assert main(["model", "dgx-h100-gen4", "--mtbf", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = load_profile("dgx-h100-gen4")
    assert out["host"]["cores"] == 112 and out["host"]["dram_GBps"] == pytest.approx(614.4)
    assert out["host"]["ssd_rate_GBps"] == pytest.approx(8 * 3.8)
    cost = {e: t for e, t, _ in p.cpu_cost}
    assert set(cost) >= set(ENGINES)  # the reference file covers every model engine
    for e in ENGINES:
        got = out["engines"][e]
        assert got["host_cores"] == pytest.approx(cost[e] * 8 * 3.8)
        per_byte = sum(traits_of(e).dram_per_byte(False))
        assert got["dram_GBps"] == pytest.approx(per_byte * 8 * 3.8)
        assert got["dram_source"] == "derived"
        assert got["host_verdict"] in ("affordable",) or got["host_verdict"].startswith("cannot")
    assert out["engines"]["gds"]["dram_GBps"] == 0
    assert out["engines"]["cpu-double"]["dram_GBps"] > out["engines"]["cpu-single"]["dram_GBps"]
    # no cited DRAM bandwidth: unknown, never a guess
    assert main(["model", "nd-h200-v5", "--mtbf", "12", "--json"]) == 0
    nd = json.loads(capsys.readouterr().out)
    assert nd["host"]["dram_GBps"] is None
    assert nd["engines"]["cpu-double"]["dram_share_lost_persisting"] is None
    assert "no cited DRAM bandwidth" in nd["engines"]["cpu-double"]["host_verdict"]


def test_cli_model_prints_what_the_host_pays(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "dgx-h100-gen4"]) == 0
    out = capsys.readouterr().out
    assert "what the host pays to checkpoint all 8 GPU(s) at its 8 SSDs' 30.4 GB/s" in out
    assert "(host: 112 cores, 614 GB/s DRAM peak)" in out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("  cpu-")}
    assert rows["cpu-double"][4] == "4" and rows["cpu-single"][4] == "2"  # DRAM B/B
    assert "CPU-seconds per GB: ckptbench run " in out  # the reference file's source


def test_reference_cpu_cost_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "cpu-cost").mkdir()
    assert reference_cpu_cost(tmp_path) == ((), "")  # none: every cores verdict unknown
    (tmp_path / "cpu-cost" / "reference.yaml").write_text(
        "kind: measured\nsource: s\nengines: {gds: {total: 1, totl: 1}}\n"
    )
    with pytest.raises(UserError, match="reference.yaml: engines.gds.totl: unknown key"):
        reference_cpu_cost(tmp_path)
