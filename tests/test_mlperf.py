"""MLPerf Storage's checkpoint workload: the presets' bytes against the published sizes (from
DLIO's arithmetic and the layouts, bench.workloads.mlperf), the config's rules, the refusal of
a host share that does not fit, the dlio-style engine's files, and a tiny real run of 2 ranks
under torchrun: 10 checkpoints, written all, cache cleared, read all, MLPerf's metrics from its
rows, and the report's section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from conftest import QUICK_BASELINE_S, REPO, assert_answers_first, assert_glossary_complete

from bench.common.errors import UserError
from bench.config import sweep as config
from bench.engines import REGISTRY
from bench.measure import results
from bench.run import preflight
from bench.run.mlperf import host_check
from bench.storage.tree import flatten
from bench.workloads import mlperf as mp

GiB = 2**30


# --- the presets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "published_gib"),
    # the sizes the issue measured, and the rules' Table 2: 105 GB, 912 GB and 5.29 TB are
    # DLIO's 1024^3 units ("GB"), and a thousand of them ("TB"), rounded as printed
    [("llama3-8b", 104.7), ("llama3-70b", 911.2), ("llama3-405b", 5290.0)],
)
def test_every_ranks_bytes_add_up_to_the_published_size(name: str, published_gib: float) -> None:
    m = mp.MODELS[name]
    total = mp.total_bytes(m) / GiB
    half_digit = 5.0 if published_gib > 1000 else 0.05  # half the last printed digit
    assert abs(total - published_gib) <= half_digit, total
    assert m.published.split()[0] in {"105", "912", "5.29"}


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b"])
def test_zero3_rank_holds_14_bytes_per_parameter_of_its_share(name: str) -> None:
    """fp16 weights (2 B) and three fp32 optimizer tensors (12 B) of P / (TP x DP)."""
    m = mp.MODELS[name]
    assert m.zero == 3 and m.pp == 1
    want = 14 * mp.num_parameters(m) / (m.tp * m.dp)
    for r in (0, m.world - 1):
        got = mp.rank_shard(m, r).nbytes
        assert abs(got - want) / want < 1e-3, (r, got, want)


def test_layouts_are_the_rules_table() -> None:
    """Table 2: TPxPPxDP 1x1x8, 8x1x8, 8x32x2, 8x64x2 (8, 64, 512 and 1,024 processes)."""
    got = {k: (m.tp, m.pp, m.dp, m.zero, m.world) for k, m in mp.MODELS.items()}
    assert got == {
        "llama3-8b": (1, 1, 8, 3, 8),
        "llama3-70b": (8, 1, 8, 3, 64),
        "llama3-405b": (8, 32, 2, 1, 512),
        "llama3-1t": (8, 64, 2, 1, 1024),
    }
    assert mp.HOST_PROCS == 8 and mp.CHECKPOINTS == 10


def test_ranks_are_laid_out_as_dlio_lays_them_out() -> None:
    m = mp.MODELS["llama3-405b"]  # 126 layers over 32 stages: 30 stages of 4, 2 of 3
    first = mp.rank_shard(m, 0)
    # layer 0 (embedding, 1/TP of vocab x hidden) and transformer layers 1-4, 6 tensors each
    assert len(first.model) == 5 and first.model[0] == (m.hidden * m.vocab // m.tp,)
    assert all(len(layer) == 6 for layer in first.model[1:])
    last = mp.rank_shard(m, m.tp * (m.pp - 1))  # TP rank 0 of the last stage, DP rank 0
    # 3 transformer layers, then the head (L+1) and the final norm (L+2)
    assert len(last.model) == 5 and last.model[-1] == (m.hidden,)
    # ZeRO-1: a rank of data-parallel rank 1 holds optimizer states only
    dp1 = mp.rank_shard(m, m.tp * m.pp)
    assert dp1.model == () and dp1.optim == first.optim
    # the 8 ranks of one host: one tensor-parallel group of stage 0, all alike
    host = {mp.rank_shard(m, r).nbytes for r in mp.host_ranks(m)}
    assert len(host) == 1
    assert mp.host_ranks(mp.MODELS["llama3-8b"]) == list(range(8))


def test_scale_shrinks_every_tensor_of_every_rank() -> None:
    full = mp.rank_shard(mp.MODELS["llama3-1t"], 0)
    s = mp.shard_at("llama3-1t", 0, 1 / 256)
    assert [len(layer) for layer in s.model] == [len(layer) for layer in full.model]
    assert len(s.optim) == len(full.optim)
    assert abs(s.nbytes - full.nbytes / 256) / (full.nbytes / 256) < 1e-3


# --- the config and the refusal ---------------------------------------------------------------


def test_the_mlperf_config_runs_the_largest_preset_as_mlperf_does() -> None:
    cfg = config.load(str(REPO / "configs" / "mlperf.yaml"))
    assert cfg.mlperf is not None and cfg.ranks is not None
    largest = max(mp.MODELS, key=lambda k: mp.total_bytes(mp.MODELS[k]))
    assert cfg.mlperf.preset == largest == "llama3-1t"
    assert cfg.repetitions == mp.CHECKPOINTS and cfg.warmups == 0
    assert cfg.ranks.nproc == mp.HOST_PROCS and cfg.ranks.shard == "per_rank"
    assert "dlio-style" in cfg.engines and cfg.mlperf.scale < 1


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"ranks": {"nproc": 4, "shard": "per_rank"}}, "ranks.nproc: llama3-8b runs 8 ranks"),
        ({"warmups": 1}, "warmups: MLPerf times every checkpoint"),
        ({"mlperf": {"preset": "llama3-3b"}}, "mlperf.preset: unknown 'llama3-3b'"),
        ({"total_sizes": ["1MiB"], "tensor_sizes": ["1MiB"]}, "mlperf: the run's state"),
        (
            {"mlperf": {"preset": "llama3-8b", "hosts": 3, "host_procs": 4}},
            "mlperf.hosts: 3 hosts of 4 GPUs (host_procs) are 12 ranks, llama3-8b's layout has 8",
        ),
        (
            {"mlperf": {"preset": "llama3-8b", "hosts": 2, "host_procs": 4}},
            "ranks.nproc: llama3-8b runs 4 ranks on each of its 2 hosts (mlperf.host_procs), got 8",
        ),
    ],
)
def test_mlperf_config_errors_name_their_key(change: dict[str, Any], says: str) -> None:
    raw = {
        "engines": ["dlio-style"],
        "mlperf": {"preset": "llama3-8b", "scale": 0.001},
        "ranks": {"nproc": 8, "shard": "per_rank"},
        "warmups": 0,
        **change,
    }
    with pytest.raises(UserError) as e:
        config.from_dict(raw)
    assert says in str(e.value)


def test_a_host_share_that_does_not_fit_is_refused_with_the_scale_that_would() -> None:
    cfg = config.load(str(REPO / "configs" / "mlperf.yaml"), ["mlperf.scale=1"])
    with pytest.raises(UserError) as e:
        host_check(cfg, host_avail=16 * GiB)
    msg = str(e.value)
    assert msg.startswith("mlperf: llama3-1t at scale 1 does not fit this host: rank 0 of 8")
    assert "--set mlperf.scale=" in msg and "\n" not in msg
    # the scale it names fits that host
    scale = float(msg.split("--set mlperf.scale=")[1].split()[0])
    host_check(
        config.load(str(REPO / "configs" / "mlperf.yaml"), [f"mlperf.scale={scale}"]), 16 * GiB
    )


def test_ranks_across_hosts_are_laid_out_as_mpirun_and_dlio_lay_them_out() -> None:
    """Host h runs ranks h x host_procs onwards (mpirun by slot, DLIO's node offsets); the
    whole layout is MLPerf's default mode, fewer ranks its subset mode."""
    m = mp.MODELS["llama3-70b"]
    assert [mp.host_ranks(m, 8, h) for h in range(3)] == [
        list(range(0, 8)),
        list(range(8, 16)),
        list(range(16, 24)),
    ]
    assert mp.job_ranks(m, 8, 3) == list(range(24)) and mp.mode(m, 24) == "subset"
    e = mp.MODELS["llama3-8b"]
    assert mp.job_ranks(e, 4, 2) == list(range(8)) and mp.mode(e, 8) == "default"
    assert mp.host_bytes(e, 4, 0) + mp.host_bytes(e, 4, 1) == mp.total_bytes(e)
    # one host: the first host_procs of the layout, or all of it (as before)
    assert mp.host_ranks(e, 16) == mp.job_ranks(e, 16) == list(range(8))


def _two_hosts(scale: float = 1.0) -> config.Config:
    return config.from_dict(
        {
            "engines": ["dlio-style"],
            "mlperf": {"preset": "llama3-8b", "scale": scale, "hosts": 2, "host_procs": 4},
            "ranks": {"nproc": 4, "shard": "per_rank"},
            "warmups": 0,
            "repetitions": 10,
        }
    )


def test_a_job_that_is_not_the_configs_hosts_is_refused_with_the_torchrun_options() -> None:
    from bench.run.mlperf import check_job

    cfg = _two_hosts()
    check_job(cfg, [{"rank": r, "node_rank": r // 4} for r in range(8)])
    with pytest.raises(UserError) as e:
        check_job(cfg, [{"rank": r, "node_rank": 0} for r in range(4)])
    assert str(e.value) == (
        "mlperf.hosts: llama3-8b runs on 2 host(s) of 4 ranks, this job has 4 rank(s) on 1 "
        "host(s) (4 a host); start one torchrun agent a host with --nnodes 2 --nproc-per-node 4"
    )


def test_a_host_without_room_for_its_share_is_named() -> None:
    """Host 1's share at full size: its 4 ranks' 10 checkpoints (524 GiB) on its first target."""
    cfg = _two_hosts()
    from bench.run.mlperf import _free

    free = _free(cfg.resolved_targets()[0]) or 0
    share = mp.host_bytes(mp.MODELS["llama3-8b"], 4, 1)
    if free > share * 11:
        pytest.skip("this disk holds host 1's 10 checkpoints of llama3-8b at full size")
    with pytest.raises(UserError) as e:
        host_check(cfg, host_avail=1 << 50, host=1)
    msg = str(e.value)
    assert msg.startswith(
        "mlperf: llama3-8b at scale 1: 10 checkpoints of 52.4GiB (the share of host 1 of 2) "
        "need 549.7GiB on "
    ), msg
    assert "; way out: --set mlperf.scale=" in msg and "\n" not in msg
    # its memory: a rank of host 1 named, against that host's share
    with pytest.raises(UserError) as e:
        host_check(cfg, host_avail=16 * GiB, host=1)
    assert str(e.value).startswith(
        "mlperf: llama3-8b at scale 1 does not fit host 1 of 2: rank 4 of 8 holds 13.1GiB"
    )


def test_the_cli_refuses_more_than_one_host_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import cli

    assert cli.main(["run", str(REPO / "configs" / "mlperf-hosts.yaml")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        "ckptbench: error: mlperf.hosts: 2 hosts: start one torchrun agent on each host "
        "(docs/multi-rank.md; two hosts on one machine: scripts/hosts.py); `ckptbench run` "
        "starts the ranks of one host"
    ]


def test_the_cli_refuses_the_full_size_in_one_line_exit_2() -> None:
    if preflight.host_available() > 150 * GiB:
        pytest.skip("this host holds llama3-1t's 8 ranks of 18 GiB")
    p = subprocess.run(
        [sys.executable, "-m", "bench", "run", "configs/mlperf.yaml", "--set", "mlperf.scale=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptbench: error: mlperf: llama3-1t"), lines
    assert p.stdout == ""


# --- the dlio-style engine --------------------------------------------------------------------


def test_dlio_style_writes_dlios_two_torch_save_files(scratch: Path) -> None:
    from bench.workloads.models import mlperf_state

    state = mlperf_state("llama3-70b", 0, 1e-4)
    eng = REGISTRY["dlio-style"]([str(scratch)])
    eng.save(state, "ck").wait()
    files = {os.path.basename(f) for f in eng.cached_files("ck")}
    assert files == {"model_states.pt", "optim_states.pt", "keys"}
    gen = os.path.dirname(eng.cached_files("ck")[0])
    # each a plain torch.save file of that part, as DLIO's load_state reads it
    for part in ("model", "optim"):
        got = torch.load(os.path.join(gen, f"{part}_states.pt"), weights_only=True)
        want = flatten(state[part])[1]
        assert [k for k, _ in flatten(got)[1]] == [k for k, _ in want]
        for (_, a), (_, b) in zip(flatten(got)[1], want, strict=True):
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    back = eng.load("ck")
    assert list(back) == ["model", "optim"]
    eng.delete("ck")


# --- a tiny real run --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama3-8b's first 2 ranks of a 2-GPU host at 1/5000 of their bytes, dlio-style and
    cpu-single, 10 checkpoints each, under torchrun, then `ckptbench report`."""
    from conftest import scratch_base

    root = Path(os.path.realpath(scratch_base())) / f"test_mlperf-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    raw = {
        "name": "mlperf-tiny",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["dlio-style", "cpu-single"],
        "mlperf": {"preset": "llama3-8b", "scale": 0.0002, "host_procs": 2},
        "ranks": {"nproc": 2, "shard": "per_rank", "timeout_s": 60},
        "repetitions": 10,
        "warmups": 0,
        "scratch": str(root / "targets"),
        "ceilings": {"enabled": False},
        "engine_options": {"cpu-single": {"chunk_bytes": "1MiB"}},
    }
    path = root / "config.json"
    path.write_text(json.dumps(raw))
    out = root / "results"
    p = subprocess.run(
        [sys.executable, "-m", "bench", "run", str(path), "-o", str(out), "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    p = subprocess.run(
        [sys.executable, "-m", "bench", "report", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir


def test_tiny_run_writes_10_checkpoints_then_clears_the_cache_then_reads(tiny_run: Path) -> None:
    from analysis import mlperf as metric

    env = json.loads((tiny_run / "env.json").read_text())
    m = env["mlperf"]
    assert m["preset"] == "llama3-8b" and m["scale"] == 0.0002 and m["scaled"]
    assert m["host_ranks"] == [0, 1] and m["checkpoints"] == 10
    for engine in ("dlio-style", "cpu-single"):
        ev = m["order"][engine]
        assert [e["event"] for e in ev] == ["write"] * 10 + ["clear cache"] + ["read"] * 10
        assert metric.order_ok(env, engine)
    rows = results.read_rows(str(tiny_run))
    per = rows[~rows["aggregate"].astype(bool)]
    assert (per["error"].fillna("") == "").all() and per["verified"].all()
    for engine in ("dlio-style", "cpu-single"):
        mine = per[per["engine"] == engine]
        assert sorted(mine["rep"].unique()) == list(range(10))
        assert (mine.groupby("rep").size() == 2).all()
    # each rank's bytes are its scaled shard's; the restore read nothing from the page cache
    want = {r: mp.shard_at("llama3-8b", r, 0.0002).nbytes for r in (0, 1)}
    assert {int(r): int(b) for r, b in per.groupby("rank")["total_bytes"].first().items()} == want
    assert (per["restore_resident_bytes"] == 0).all()


def test_mlperf_metrics_are_computed_from_the_rows(tiny_run: Path) -> None:
    from analysis import mlperf as metric

    rows = results.read_rows(str(tiny_run))
    per = rows[~rows["aggregate"].astype(bool)]
    t = metric.table(rows).set_index("engine")
    for engine in ("dlio-style", "cpu-single"):
        mine = per[per["engine"] == engine]
        by = mine.groupby("rep")
        nbytes = by["total_bytes"].sum()
        zero = mine[mine["rank"] == 0].set_index("rep")
        slowest = (nbytes / GiB / by["total_s"].max()).mean()
        rank0 = (nbytes / GiB / zero["total_s"]).mean()
        read = (nbytes / GiB / by["restore_s"].max()).mean()
        assert t.loc[engine, "write_GiBps"] == pytest.approx(slowest)
        assert t.loc[engine, "write_GiBps_rank0"] == pytest.approx(rank0)
        assert t.loc[engine, "read_GiBps"] == pytest.approx(read)
        # the slowest rank is never faster than rank 0 alone
        assert t.loc[engine, "write_GiBps"] <= t.loc[engine, "write_GiBps_rank0"] + 1e-12
    zero = per[(per["engine"] == "dlio-style") & (per["rank"] == 0)].set_index("rep")
    nb = per[per["engine"] == "dlio-style"].groupby("rep")["total_bytes"].sum()
    as_run = (nb / GiB / zero["stall_s"]).mean()
    assert t.loc["dlio-style", "write_GiBps_not_durable"] == pytest.approx(as_run)
    assert pd.isna(t.loc["cpu-single", "write_GiBps_not_durable"])
    assert t.loc["dlio-style", "x_dlio_write"] == 1.0
    assert t.loc["cpu-single", "x_dlio_write"] == pytest.approx(
        t.loc["cpu-single", "write_GiBps"] / t.loc["dlio-style", "write_GiBps"]
    )


def test_the_report_has_the_mlperf_section(tiny_run: Path) -> None:
    text = (tiny_run / "report" / "report.md").read_text()
    section = text.split("## MLPerf Storage checkpointing", 1)[1].split("\n## ", 1)[0]
    assert "llama3-8b" in section and "Scaled: every rank's bytes x 0.0002" in section
    assert "In that order: dlio-style, cpu-single." in section or (
        "In that order: cpu-single, dlio-style." in section
    )
    assert "| write GiB/s (slowest rank, durable) |" in section
    assert "NOT durable" in section
    assert_answers_first(text)
    assert_glossary_complete(text)
