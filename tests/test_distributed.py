"""bench.run.distributed: multi-rank runs under torchrun (gloo on CPU).

Pure pieces (target mapping, shards, aggregate rows, world-size refusal) are tested in process;
three jobs run for real: 2 ranks through `ckptbench run --nproc 2` (shared and dedicated targets,
1 and 2 ranks at once), 4 ranks through plain `torchrun -m bench` (shared targets and dedicated
subfolders), 2 ranks with injected faults (a save that raises, then a rank that SIGKILLs itself),
and two "nodes" on this machine (two torchrun agents, c10d rendezvous on loopback). Every job
runs under a hard subprocess timeout: a hang fails the test instead of the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import QUICK_BASELINE_S, REPO, result_row, scratch_base

from bench import engines
from bench.common.errors import UserError
from bench.config import sweep as config
from bench.measure import columns, results
from bench.run import distributed
from bench.run import rows as rowlib
from bench.storage import odirect

MiB = 2**20
JOB_TIMEOUT_S = 300  # the hard guard around every torchrun job: catches hangs, not slowness


def _scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"test_distributed-{prefix}-", dir=scratch_base()))


def _write_config(root: Path, raw: dict[str, Any]) -> str:
    path = root / "config.json"  # JSON is YAML
    path.write_text(json.dumps(raw))
    return str(path)


def _raw(root: Path, **over: Any) -> dict[str, Any]:
    raw = {
        "name": "mr",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["cpu-single"],
        "total_sizes": ["16MiB"],
        "tensor_sizes": ["1MiB"],
        "ssd_counts": [2],
        "scratch": str(root / "targets"),
        "repetitions": 1,
        "warmups": 0,
        "ceilings": {"enabled": False},
        "engine_options": {
            "cpu-single": {"chunk_bytes": "1MiB"},
            "cpu-double": {"chunk_bytes": "1MiB"},
            "gds": {"chunk_bytes": "1MiB"},
        },
        "ranks": {"nproc": 2, "timeout_s": 20},
    }
    ranks = {**raw["ranks"], **over.pop("ranks", {})}
    return {**raw, **over, "ranks": ranks}


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        env={**os.environ, **(env or {})},
    )


def _run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _rows(run_dir: Path) -> pd.DataFrame:
    return results.read_rows(str(run_dir))


def _need_odirect(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    reason = odirect.probe(str(root))
    if reason:
        pytest.skip(f"scratch refuses O_DIRECT: {reason}")


# --- pure pieces -------------------------------------------------------------------------------


def test_assign_maps_ranks_to_targets() -> None:
    a = distributed.assign
    assert [a(4, "shared", 4, j) for j in range(4)] == [([0, 1, 2, 3], False)] * 4
    assert [a(4, "dedicated", 4, j)[0] for j in range(4)] == [[0], [1], [2], [3]]
    assert [a(4, "dedicated", 2, j)[0] for j in range(2)] == [[0, 1], [2, 3]]
    assert a(1, "dedicated", 4, 3, subfolders=True) == ([0], True)
    # per_target: groups of K ranks, each group on its share of the targets
    assert [a(2, "per_target", 4, j, ranks_per_target=2)[0] for j in range(4)] == [
        [0],
        [0],
        [1],
        [1],
    ]
    assert a(4, "per_target", 2, 1, ranks_per_target=4) == ([0, 1, 2, 3], False)
    with pytest.raises(ValueError, match="1 target.s. do not split evenly among 4 ranks"):
        a(1, "dedicated", 4, 0)
    with pytest.raises(ValueError, match="3 target.s. do not split evenly among 2 groups"):
        a(3, "per_target", 4, 0, ranks_per_target=2)


def test_shards_add_up_to_the_total() -> None:
    sizes = [distributed.shard_bytes(10 * 4, 3, j, 4, "even") for j in range(3)]
    assert sizes == [16, 12, 12] and sum(sizes) == 40
    assert distributed.shard_bytes(40, 3, 2, 4, "per_rank") == 40


def _row(
    rank: int,
    node: int,
    stall: float,
    total: float,
    nbytes: int,
    cache: int,
    error: str = "",
    verified: bool = True,
) -> results.Row:
    return result_row(
        total_bytes=nbytes,
        n_tensors=2,
        targets_used=2,
        stall_s=stall,
        persist_s=total - stall,
        total_s=total,
        restore_s=total / 2,
        hash_s=0.01,
        wait_prev_s=0.0,
        pinned_bytes=nbytes,
        page_cache_peak_bytes=cache,
        rss_peak_bytes=100,
        cpu_user_s=0.5,
        cpu_sys_s=0.25,
        checksums=True,
        staging_grew=False,
        copied_tensors=0,
        cache_dropped=True,
        capped=False,
        verified=verified,
        error=error,
        rank=rank,
        world_size=4,
        node="h",
        node_rank=node,
        aggregate=False,
        ranks_active=3,
        target_map="shared",
    )


def test_aggregate_row_is_max_of_times_and_sum_of_bytes() -> None:
    rows = [
        _row(0, 0, 0.1, 0.5, 4 * MiB, 10),
        _row(1, 0, 0.3, 0.4, 4 * MiB, 30),
        _row(2, 1, 0.2, 0.9, 8 * MiB, 5),
    ]
    agg = rowlib.aggregate(rows)
    assert isinstance(agg, results.Row)
    assert (agg.stall_s, agg.total_s, agg.restore_s) == (0.3, 0.9, 0.45)
    assert agg.persist_s == pytest.approx(0.6)
    assert agg.total_bytes == 16 * MiB and agg.pinned_bytes == 16 * MiB
    assert agg.n_tensors == 6 and agg.targets_used == 6
    assert agg.cpu_user_s == 1.5 and agg.rss_peak_bytes == 300
    assert agg.page_cache_peak_bytes == 30 + 5  # per node the max, summed over nodes
    assert agg.verified and agg.error == ""
    assert (agg.rank, agg.node, agg.node_rank, agg.aggregate) == (-1, "", -1, True)
    assert (agg.world_size, agg.ranks_active, agg.target_map) == (4, 3, "shared")
    assert (agg.checksums, agg.cache_dropped, agg.staging_grew) == (True, True, False)


def test_the_aggregate_combines_each_column_by_the_rule_its_type_declares() -> None:
    """Every column's rule (results.Row), held against ranks whose values differ: `first` is
    rank 0's, `max`/`sum` empty where a rank has none, and every `own` column set by the
    aggregate itself (none left at its default by an oversight)."""
    rows = [_row(0, 0, 0.1, 0.5, MiB, 10), _row(1, 1, 0.3, 0.4, 2 * MiB, 30)]
    rows[0].restore_resident_bytes, rows[1].restore_resident_bytes = 4096, 8192
    rows[1].staging_grew, rows[1].capped, rows[1].checksums = True, True, False
    rows[1].io_detail, rows[1].gds_mode = '{"x": 1}', "compat"
    agg = rowlib.aggregate(rows)
    assert agg.restore_resident_bytes == 4096 + 8192
    assert (agg.staging_grew, agg.capped, agg.checksums) == (True, True, False)
    assert (agg.io_detail, agg.gds_mode) == ("", "none")  # the first rank's
    rows[1].hash_s = None
    assert rowlib.aggregate(rows).hash_s is None  # a rank without it: none for the job
    own = {c.name for c in columns.columns(results.Row) if c.ranks == "own"}
    assert set(rowlib._own_columns(rows)) == own


def test_a_failure_on_one_rank_fails_the_repetition_on_all() -> None:
    rows = [
        _row(0, 0, 0.1, 0.5, MiB, 0),
        _row(1, 0, 0.1, 0.5, MiB, 0, error="OSError: disk full"),
        _row(2, 0, 0.1, 0.5, MiB, 0, verified=False),
    ]
    bad = rowlib.fail_together(rows, check=True)
    assert bad is rows[1]
    assert rows[0].error == "failed on rank 1: OSError: disk full"
    assert rows[1].error == "OSError: disk full"
    assert rows[2].error == "failed on rank 1: OSError: disk full"
    agg = rowlib.aggregate(rows)
    assert agg.error == "rank 1: OSError: disk full" and not agg.verified
    clean = [_row(0, 0, 0.1, 0.5, MiB, 0)]
    assert rowlib.fail_together(clean, check=True) is None and clean[0].error == ""


def test_monitored_barrier_errors_name_the_lost_ranks() -> None:
    assert distributed._lost_ranks(
        "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 20000 ms"
    ) == [1, 3]
    assert distributed._lost_ranks("Rank 2 failed to pass monitoredBarrier in 5 ms") == [2]
    assert distributed._lost_ranks("Connection closed by peer") == []
    e = distributed.RankLost("the restore of c rep 0", [1], "x")
    assert str(e) == (
        "rank 1 lost before the restore of c rep 0 (killed, crashed, or not there "
        "within the timeout)"
    )


def test_restore_with_another_world_size_is_refused(targets: Any) -> None:
    dirs = targets(2)
    eng = engines.create("cpu-double", dirs, chunk_bytes="1MiB")
    try:
        import torch

        state = {"w": torch.arange(1000, dtype=torch.float32)}
        distributed.save_shard(eng, state, "ck", 1, 2).wait()
        back = distributed.load_shard(eng, "ck", 1, 2)
        assert torch.equal(back["w"], state["w"])
        assert os.path.isdir(os.path.join(dirs[0], "ck.rank1-of-2"))
        with pytest.raises(UserError) as e:
            distributed.load_shard(eng, "ck", 1, 4)
        assert str(e.value) == (
            "checkpoint ck: saved by 2 rank(s), this job has 4; restore it with 2 rank(s) "
            "(resharding to another world size is not supported)"
        )
    finally:
        eng.close()


def test_config_ranks_section_is_strict() -> None:
    base = {"engines": ["cpu-single"], "total_sizes": ["8MiB"], "tensor_sizes": ["1MiB"]}
    cfg = config.from_dict(
        {**base, "ranks": {"nproc": 4, "mapping": "dedicated", "dedicated_subfolders": True}}
    )
    assert cfg.ranks is not None and cfg.ranks.mapping == ["dedicated"]
    assert cfg.ranks.active == [] and cfg.ranks.timeout_s == 60.0
    bad = [
        (
            {"mapping": ["everywhere"]},
            "ranks.mapping.0: Input should be 'shared', 'dedicated' or 'per_target'",
        ),
        ({"nproc": 2, "active": [4]}, "ranks.active: 4 ranks asked for, but ranks.nproc is 2"),
        (
            {"dedicated_subfolders": True},
            "ranks.dedicated_subfolders: applies to mapping dedicated",
        ),
        ({"timeot_s": 5}, "ranks.timeot_s: unknown key"),
    ]
    for ranks, msg in bad:
        with pytest.raises(UserError) as e:
            config.from_dict({**base, "ranks": ranks})
        assert str(e.value).startswith(f"config: {msg}"), str(e.value)
    with pytest.raises(UserError, match="models: model presets are not sharded across ranks"):
        config.from_dict({"engines": ["cpu-single"], "models": ["gpt2-small"], "ranks": {}})


def test_nproc_below_one_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    assert main(["run", str(REPO / "configs" / "smoke.yaml"), "--nproc", "0"]) == 2
    assert capsys.readouterr().err == "ckptbench: error: --nproc: must be at least 1, got 0\n"


# --- real jobs ---------------------------------------------------------------------------------


def _check_aggregates(df: pd.DataFrame, check_bytes: int | None = None) -> None:
    """Every repetition: per-rank rows and one aggregate row that is their max / sum."""
    for (case, warm, rep), g in df.groupby(["case_id", "warmup", "rep"]):
        per, agg = g[~g["aggregate"]], g[g["aggregate"]]
        assert len(agg) == 1, (case, warm, rep)
        a = agg.iloc[0]
        k = int(a["ranks_active"])
        assert sorted(per["rank"]) == list(range(k)), case
        assert a["stall_s"] == pytest.approx(per["stall_s"].max())
        assert a["total_s"] == pytest.approx(per["total_s"].max())
        assert a["restore_s"] == pytest.approx(per["restore_s"].max())
        assert a["total_bytes"] == per["total_bytes"].sum()
        if check_bytes:
            assert a["total_bytes"] == check_bytes
        assert bool(a["verified"]) and per["verified"].all(), case
        assert a["rank"] == -1 and a["node_rank"] == -1


@pytest.fixture(scope="module")
def two_ranks() -> Iterator[dict[str, Any]]:
    """`ckptbench run --nproc 2`: shared and dedicated targets, 1 and 2 ranks at once."""
    root = _scratch("two")
    try:
        _need_odirect(root)
        cfg = _write_config(
            root,
            _raw(
                root,
                engines=["cpu-single", "cpu-double", "torch-save"],
                warmups=1,
                ranks={"nproc": 1, "mapping": ["shared", "dedicated"], "active": [1, 2]},
            ),
        )
        out = root / "results"
        t0 = time.perf_counter()
        p = _run([sys.executable, "-m", "bench", "run", cfg, "--nproc", "2", "-o", str(out), "-q"])
        yield {
            "proc": p,
            "root": root,
            "run_dir": _run_dir(out),
            "seconds": time.perf_counter() - t0,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_two_ranks_rows_and_aggregates(two_ranks: dict[str, Any]) -> None:
    p = two_ranks["proc"]
    assert p.returncode == 0, p.stderr[-3000:]
    df = _rows(two_ranks["run_dir"])
    assert list(df.columns) == results.COLUMNS
    assert set(df["world_size"]) == {2}
    assert set(df.loc[~df["aggregate"], "node"]) == {socket.gethostname()}
    assert set(df.loc[df["aggregate"], "node"]) == {""}
    # 1 rank once (under the first mapping) + 2 ranks per mapping; 3 engines; warm-up + 1 rep
    groups = {(m, k) for m, k in zip(df["target_map"], df["ranks_active"], strict=True)}
    assert groups == {("shared", 1), ("shared", 2), ("dedicated", 2)}
    assert len(df) == 3 * 2 * (2 + 3 + 3)
    assert (df["error"] == "").all()
    _check_aggregates(df, 16 * MiB)
    per2 = df[~df["aggregate"] & (df["ranks_active"] == 2)]
    assert set(per2["total_bytes"]) == {8 * MiB}  # the total split evenly
    one = df[~df["aggregate"] & (df["ranks_active"] == 1)]
    assert set(one["total_bytes"]) == {16 * MiB} and set(one["rank"]) == {0}
    assert (
        df.loc[df["case_id"].str.endswith("-x2-cpu-single-dedicated-2r"), "targets_used"].tolist()
        == [1, 1, 2] * 2
    )
    assert (
        "aggregate write bandwidth, cpu-single, synthetic-16MiB-1MiB, 2 SSD(s): 1 rank" in p.stdout
    )
    assert "2 ranks dedicated" in p.stdout and "2 ranks shared" in p.stdout


def test_two_ranks_env_records_the_mapping(two_ranks: dict[str, Any]) -> None:
    envb = json.loads((two_ranks["run_dir"] / "env.json").read_text())
    r = envb["ranks"]
    assert r["world_size"] == 2 and r["backend"] == "gloo" and r["shard"] == "even"
    t = [str(two_ranks["root"] / "targets" / f"target-{i}") for i in range(2)]
    assert r["layout"]["x2-dedicated-2r"]["targets"] == {"0": [t[0]], "1": [t[1]]}
    assert r["layout"]["x2-shared-2r"]["targets"] == {"0": t, "1": t}
    assert r["layout"]["x2-shared-1r"]["targets"] == {"0": t}
    assert [x["rank"] for x in r["table"]] == [0, 1]
    assert envb["config"]["ranks"]["nproc"] == 2  # --nproc 2 is --set ranks.nproc=2
    for d in t:  # every checkpoint was removed after its case
        assert os.listdir(d) == []


def test_resume_with_another_world_size_is_refused(two_ranks: dict[str, Any]) -> None:
    run_dir = str(two_ranks["run_dir"])
    cfg = config.load(str(two_ranks["root"] / "config.json"), ["ranks.nproc=2"])
    assert cfg.ranks is not None
    with pytest.raises(UserError) as e:
        distributed.check_resume_world(run_dir, 4)
    assert str(e.value) == (
        f"--resume {run_dir}: it ran with 2 rank(s), this job has 4; resume it with --nproc 2"
    )


def test_resume_of_a_multi_rank_run_redoes_the_repetitions_without_an_aggregate(
    two_ranks: dict[str, Any],
) -> None:
    """A multi-rank run cut short: its last repetition lost whole, and the one before it
    written by rank 0 for both ranks but cut before its aggregate row. `--resume` with the same
    world size runs exactly those two again (a repetition counts as done by its aggregate row,
    not by per-rank rows) and leaves the others as they were."""
    assert two_ranks["proc"].returncode == 0
    root = _scratch("resume")
    try:
        run_dir = root / "run"
        shutil.copytree(two_ranks["run_dir"], run_dir)
        df = _rows(run_dir)
        keys = ["case_id", "warmup", "rep"]
        reps = df[keys].drop_duplicates()
        last, cut = tuple(reps.iloc[-1]), tuple(reps.iloc[-2])
        is_last = (df[keys] == pd.Series(last, index=keys)).all(axis=1)
        is_cut_agg = (df[keys] == pd.Series(cut, index=keys)).all(axis=1) & df["aggregate"]
        kept = df[~is_last & ~is_cut_agg]
        with open(run_dir / "results.csv") as f:
            lines = f.read().splitlines()
        (run_dir / "results.csv").write_text(
            "\n".join([lines[0]] + [lines[i + 1] for i in kept.index]) + "\n"
        )
        envb = json.loads((run_dir / "env.json").read_text())
        envb["sweep"]["finished"] = False
        (run_dir / "env.json").write_text(json.dumps(envb))
        cfg = str(two_ranks["root"] / "config.json")
        p = _run(
            [
                sys.executable,
                "-m",
                "bench",
                "run",
                cfg,
                "--nproc",
                "2",
                "-q",
                "--resume",
                str(run_dir),
            ]
        )
        assert p.returncode == 0, p.stderr[-3000:]
        after = _rows(run_dir)
        assert after.iloc[: len(kept)][["case_id", "rank", "rep", "total_bytes"]].equals(
            kept[["case_id", "rank", "rep", "total_bytes"]].reset_index(drop=True)
        )
        redone = after.iloc[len(kept) :]
        assert sorted(set(map(tuple, redone[keys].to_numpy()))) == sorted({last, cut})
        assert redone["aggregate"].sum() == 2 and redone["verified"].all()
        # every repetition of the run has exactly one aggregate row now
        agg = after[after["aggregate"]]
        assert len(agg) == len(reps) and not agg[keys].duplicated().any()
        assert json.loads((run_dir / "env.json").read_text())["sweep"]["finished"] is True
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_four_ranks_plain_torchrun_shared_and_subfolders() -> None:
    root = _scratch("four")
    try:
        _need_odirect(root)
        cfg = _write_config(
            root,
            _raw(
                root,
                engines=["cpu-single", "gds"],
                total_sizes=["32MiB"],
                ssd_counts=[1],
                ranks={
                    "nproc": 4,
                    "mapping": ["shared", "dedicated"],
                    "dedicated_subfolders": True,
                },
            ),
        )
        out = root / "results"
        p = _run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "4",
                "-m",
                "bench",
                "run",
                cfg,
                "-o",
                str(out),
                "-q",
            ]
        )
        assert p.returncode == 0, p.stderr[-3000:]
        run_dir = _run_dir(out)
        df = _rows(run_dir)
        assert set(df["target_map"]) == {"shared", "dedicated-subfolders"}
        assert len(df) == 2 * 2 * 5  # 2 mappings x 2 engines x (4 ranks + aggregate)
        _check_aggregates(df, 32 * MiB)
        assert set(df.loc[~df["aggregate"], "total_bytes"]) == {8 * MiB}
        assert set(df["world_size"]) == {4} and set(df["ranks_active"]) == {4}
        r = json.loads((run_dir / "env.json").read_text())["ranks"]
        t0 = root / "targets" / "target-0"
        sub = r["layout"]["x1-dedicated-subfolders-4r"]["targets"]
        assert sub == {str(i): [str(t0 / f"rank-{i}")] for i in range(4)}
        assert sorted(os.listdir(t0)) == [f"rank-{i}" for i in range(4)]
        assert all(os.listdir(t0 / f"rank-{i}") == [] for i in range(4))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_failed_and_killed_ranks_fail_the_case_without_a_hang() -> None:
    """Rank 1's first save raises (the repetition fails on both ranks, the run goes on); its
    third save SIGKILLs it: rank 0 names it, records the case and exits 1 well within the
    timeout, and torchrun ends the job."""
    root = _scratch("fault")
    try:
        timeout_s = 15
        cfg = _write_config(
            root, _raw(root, engines=["cpu-double"], repetitions=3, ranks={"timeout_s": timeout_s})
        )
        out = root / "results"
        # No bound on the job's wall time here (torch's start-up on a busy 2-core machine is
        # not ours to time): a rank 0 that waited for the lost rank for ever runs into the
        # hard guard around the job, and the message says it was told by the timeout.
        p = _run(
            [sys.executable, "-m", "bench", "run", cfg, "-o", str(out), "-q"],
            env={distributed.FAULT_ENV: "error@1:0,kill@1:2"},
        )
        assert p.returncode == 1, p.stderr[-3000:]
        assert "[rank 0] error: rank 1 lost before the restore of" in p.stderr
        df = _rows(_run_dir(out))
        case = "synthetic-16MiB-1MiB-x2-cpu-double-shared-2r"
        assert set(df["case_id"]) == {case}
        r0 = df[df["rep"] == 0].set_index("rank")["error"]
        injected = "RuntimeError: injected fault: rank 1 fails save 0"
        assert r0.to_dict() == {
            0: f"failed on rank 1: {injected}",
            1: injected,
            -1: f"rank 1: {injected}",
        }
        r1 = df[df["rep"] == 1]
        assert len(r1) == 3 and r1["verified"].all() and (r1["error"] == "").all()
        r2 = df[df["rep"] == 2].set_index("rank")
        assert sorted(r2.index) == [-1, 0]  # rank 1 never answered
        lost = f"rank 1 lost before the restore of {case} rep 2 (killed, crashed, or not there within the timeout)"
        assert r2.loc[0, "error"] == lost and r2.loc[-1, "error"] == lost
        assert r2.loc[0, "total_s"] > 0  # rank 0's own save was measured
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.alone  # it picks a free port, then the agents bind it
def test_two_nodes_on_loopback() -> None:
    """Two torchrun agents as two nodes (c10d rendezvous on 127.0.0.1), each with its own
    targets: rank 0 gathers every node's rows and records each node's storage."""
    root = _scratch("nodes")
    try:
        raw = _raw(root, engines=["cpu-double"], ranks={"nproc": 2, "mapping": ["dedicated"]})
        cfg = _write_config(root, raw)
        port = _free_port()
        procs = []
        for node in (0, 1):
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                f"test-{port}",
                "--rdzv-conf",
                f"is_host={1 - node}",
                "-m",
                "bench",
                "run",
                cfg,
                "-o",
                str(root / f"results-{node}"),
                "-q",
                "--set",
                f"scratch={root / f'node{node}'}",
            ]
            procs.append(
                subprocess.Popen(
                    cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        outs = [p.communicate(timeout=JOB_TIMEOUT_S) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
        assert not (root / "results-1").exists()  # only rank 0 writes
        run_dir = _run_dir(root / "results-0")
        df = _rows(run_dir)
        per = df[~df["aggregate"]]
        assert sorted(zip(per["rank"], per["node_rank"], strict=True)) == [(0, 0), (1, 1)]
        _check_aggregates(df, 16 * MiB)
        r = json.loads((run_dir / "env.json").read_text())["ranks"]
        assert sorted(r["nodes"]) == ["0", "1"]
        # each node splits its own 2 targets among its 1 active rank: its own disks
        lay = r["layout"]["x2-dedicated-2r"]["targets"]
        assert lay == {
            str(n): [str(root / f"node{n}" / f"target-{i}") for i in range(2)] for n in (0, 1)
        }
        paths = [t["path"] for t in r["nodes"]["1"]["storage"]["targets"]]
        assert paths == [str(root / "node1" / f"target-{i}") for i in range(2)]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(("name", "nproc"), [("multirank", 4), ("server-ranks", 8)])
def test_shipped_multirank_configs_load(name: str, nproc: int) -> None:
    cfg = config.load(str(REPO / "configs" / f"{name}.yaml"))
    assert cfg.name == name and cfg.ranks is not None and cfg.ranks.nproc == nproc
    assert cfg.ranks.mapping == ["shared", "dedicated"]
    json.dumps(config.resolved(cfg))  # stored in env.json as it is
