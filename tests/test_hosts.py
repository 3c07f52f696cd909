"""Across hosts: scripts/hosts.py (two hosts on one machine: network, UTS and mount namespaces, a
veth pair, a loop disk each, one torchrun agent per host, as root), each host's ceilings judging
its ranks, the stragglers named, `compare` across hosts.

The pure pieces run in process. Every script test runs the script under its own tag and checks, after it, that nothing of that tag is
left: no namespace, no loop device on its images, no mount, no work directory. One real job (2
hosts x 1 rank, 8 MiB, host 1's target capped: the straggler named); the others end before any
rank saves: a config that differs on host 1 (exit 2 on both hosts, one line naming host and key),
a rendezvous that never forms (its timeout named), Ctrl-C while an agent waits in it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICK_BASELINE_S, REPO, scratch_base

sys.path.insert(0, str(REPO / "scripts"))
import hosts  # noqa: E402

from bench.measure import results  # noqa: E402

JOB_TIMEOUT_S = 300  # the hard guard around every invocation: catches hangs, not slowness
MiB = 2**20
GiB = 2**30
# The script's tests: root, and slow (each starts torch on two "hosts").
namespaces = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(hosts.requirements()), reason=f"scripts/hosts.py {hosts.requirements()}"
    ),
]


def _marks(f: Any) -> Any:
    for m in namespaces:
        f = m(f)
    return f


def _tag() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def _left(tag: str) -> list[str]:
    """What an invocation of `tag` left on the machine (empty: nothing)."""
    out = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [f"netns {line}" for line in netns.splitlines() if line.startswith(f"{tag}-h")]
    loops = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
        capture_output=True,
        text=True,
    ).stdout
    out += [f"loop {line}" for line in loops.splitlines() if f"ckptbench-hosts-{tag}-" in line]
    with open("/proc/self/mountinfo") as f:
        out += [f"mount {line}" for line in f if f"ckptbench-hosts-{tag}-" in line]
    for pid in os.listdir("/proc"):  # a mount inside any namespace still alive
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                if any(f"ckptbench-hosts-{tag}-" in line for line in f):
                    out.append(f"mount in the namespace of pid {pid}")
        except OSError:
            continue
    base = Path(tempfile.gettempdir())
    out += [f"dir {d}" for d in base.glob(f"ckptbench-hosts-{tag}-*")]
    return out


def _nothing_left(tag: str) -> None:
    # a loop device detached while busy goes once its last user has: allow it a moment
    end = time.monotonic() + 10
    while _left(tag) and time.monotonic() < end:
        time.sleep(0.2)
    assert _left(tag) == []


def _config(root: Path, **over: Any) -> str:
    raw = {
        "name": "hosts",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["cpu-single"],
        "total_sizes": ["8MiB"],
        "tensor_sizes": ["1MiB"],
        "repetitions": 1,
        "warmups": 0,
        "ceilings": {"enabled": False},
        "engine_options": {"cpu-single": {"chunk_bytes": "1MiB"}},
        "ranks": {"nproc": 1, "timeout_s": 30},
        **over,
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.json"  # JSON is YAML
    path.write_text(json.dumps(raw))
    return str(path)


def _script(tag: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "hosts.py"), "--tag", tag, *args]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="test_hosts-", dir=scratch_base()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@_marks
def test_a_config_that_differs_on_a_host_is_refused_on_both(root: Path) -> None:
    tag = _tag()
    cfg = _config(root)
    p = _run(
        _script(tag, "--nproc-per-host", "1", "--disk", "64MiB", "--host-set", "1:repetitions=2")
        + ["--", "run", cfg, "-o", str(root / "out"), "-q"]
    )
    assert p.returncode == 2, p.stderr[-3000:]
    why = (
        "repetitions: host1, rank 1 runs 2, host0 (rank 0) 1; give every node the same config "
        "and --set (only targets and scratch may differ)"
    )
    lines = p.stderr.splitlines()
    assert f"[host0] ckptbench: error: {why}" in lines
    assert f"[host1] ckptbench: error: {why}" in lines
    assert lines[-1] == f"hosts: refused on every host (exit 2: host0 2, host1 2): {why}"
    assert "Traceback" not in p.stderr
    assert not (root / "out").exists()  # refused before rank 0 opened a run directory
    _nothing_left(tag)


@_marks
def test_a_rendezvous_that_never_forms_names_its_timeout(root: Path) -> None:
    tag = _tag()
    p = _run(
        _script(tag, "--nproc-per-host", "1", "--disk", "64MiB", "--leave-out", "1")
        + ["--rdzv-timeout", "3", "--", "run", _config(root), "-o", str(root / "out"), "-q"]
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.splitlines()[-1] == (
        "hosts: host0: the rendezvous at 198.18.0.1:29400 did not form within 3 s "
        "(--rdzv-timeout): host1 never joined"
    )
    _nothing_left(tag)


@_marks
def test_ctrl_c_tears_everything_down(root: Path) -> None:
    """Ctrl-C while host 0's agent waits in the rendezvous (host 1 never starts one): the
    agent, its mount, the loop devices and the namespaces all go."""
    tag = _tag()
    cmd = _script(tag, "--nproc-per-host", "1", "--disk", "64MiB", "--leave-out", "1")
    cmd += ["--rdzv-timeout", "600", "--", "run", _config(root), "-o", str(root / "out"), "-q"]
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        # the agent is up once torchrun runs in host 0's namespace with its disk mounted
        end = time.monotonic() + 120
        while not (_agent_in(f"{tag}-h0") and any(x.startswith("mount in") for x in _left(tag))):
            assert proc.poll() is None and time.monotonic() < end, "the agent never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert err.splitlines()[-1] == "hosts: interrupted: the agents were stopped"
    _nothing_left(tag)


def _agent_in(netns: str) -> bool:
    """Whether a torchrun agent runs in network namespace `netns`."""
    p = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    for pid in p.stdout.split():
        try:
            if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


@_marks
def test_bad_options_are_one_line() -> None:
    p = _run(_script("x", "--host-set", "2:scratch=/x", "--", "run", "c.yaml"))
    assert (p.returncode, p.stderr) == (
        2,
        "hosts: error: --host-set: '2:scratch=/x' is not I:KEY=VALUE with I 0 or 1\n",
    )
    p = _run(_script("x"))
    assert (p.returncode, p.stderr) == (
        2,
        "hosts: error: nothing to run: give the ckptbench command after `--`\n",
    )


@_marks
def test_two_hosts_each_with_its_disk_and_ceilings_name_the_capped_one(root: Path) -> None:
    """2 hosts x 1 rank, 8 MiB: every row verified, each host's own loop device, environment
    and ceilings in env.json, each rank judged against its own host's ceilings, host 1's
    target capped at 8 MiB/s named the straggler; nothing left after."""
    from analysis import runs, stragglers

    tag = _tag()
    cfg = _config(
        root,
        repetitions=2,
        ceilings={
            "tool": "builtin", "min_bytes": "4MiB", "max_bytes": "8MiB", "max_seconds": 1,
            "repetitions": 1, "direct_search": [[1, 8]], "buffered_jobs": [1], "reads": False,
            "after": False, "probes": False,
        },
    )  # fmt: skip
    out = root / "out"
    p = _run(
        _script(tag, "--nproc-per-host", "1", "--disk", "96MiB")
        + ["--host-set", "1:max_write_bw=8MiB/s", "--", "run", cfg, "-o", str(out), "-q"]
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr.splitlines()[-1] == "hosts: exit 0 (host0 0, host1 0)"
    run_dir, df = _rows(out)
    per = df[~df["aggregate"]]
    assert (
        sorted(zip(per["rank"], per["node"], strict=True))
        == [(0, "host0")] * 2 + [(1, "host1")] * 2
    )
    assert df["verified"].all() and (df["error"] == "").all()
    assert set(df.loc[df["aggregate"], "total_bytes"]) == {8 * MiB}
    r = json.loads((run_dir / "env.json").read_text())["ranks"]
    nodes = r["nodes"]
    disks = [nodes[n]["storage"]["targets"][0]["block"]["disk"] for n in ("0", "1")]
    assert disks[0] != disks[1] and all(d.startswith("loop") for d in disks)
    assert [nodes[n]["env"]["host"] for n in ("0", "1")] == ["host0", "host1"]
    assert [nodes[n]["cache_drop"] for n in ("0", "1")] == [None, None]  # each host dropped
    direct = [nodes[n]["ceilings"]["per_ssd_count"]["1"]["direct_write_Bps"] for n in ("0", "1")]
    assert direct[1] < 8 * MiB * 1.5 < direct[0]  # host 1 measured its own, capped disk (a burst)
    # each rank judged against its own host's ceilings: host 1's rank near its capped ceiling
    # (against host 0's it would be below 8 MiB/s / (1.5 x 8 MiB/s))
    host1 = per[per["node"] == "host1"]
    assert host1["write_efficiency"].between(0.7, 1.5).all(), host1["write_efficiency"]
    spread = {s.time: s for s in stragglers.spreads(runs.load(str(run_dir)))}
    d = spread["durable"]
    assert (d.slowest_rank, d.slowest_host, d.named) == (1, "host1", True)
    _nothing_left(tag)


@_marks
def test_mlperf_across_two_hosts_lays_out_and_measures_as_the_rules_do(root: Path) -> None:
    """MLPerf's multi-host mode, 2 hosts x 1 rank of llama3-8b at 1/5000 (2.7 MiB a rank),
    3 checkpoints: host h runs rank h, each rank its own shard on its own host's disk; the
    metrics span both hosts (every rank's bytes over the slowest rank of either), and the
    report's section has each host's share."""
    from analysis import mlperf as metric
    from analysis import runs
    from analysis.report.doc import Doc
    from analysis.report.mlperf import mlperf_section
    from bench.workloads import mlperf as mp

    tag = _tag()
    cfg = _config(
        root,
        name="mlperf-hosts",
        total_sizes=[],
        tensor_sizes=[],
        repetitions=3,
        warmups=0,
        mlperf={"preset": "llama3-8b", "scale": 0.0002, "host_procs": 1, "hosts": 2},
        ranks={"nproc": 1, "shard": "per_rank", "timeout_s": 60},
    )
    out = root / "out"
    p = _run(
        _script(tag, "--nproc-per-host", "1", "--disk", "96MiB")
        + ["--", "run", cfg, "-o", str(out), "-q"]
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir, df = _rows(out)
    per = df[~df["aggregate"]]
    assert per["verified"].all() and (per["error"] == "").all()
    want = {r: mp.shard_at("llama3-8b", r, 0.0002).nbytes for r in (0, 1)}
    got = {
        (int(r), n): int(b)
        for (r, n), b in per.groupby(["rank", "node"])["total_bytes"].first().items()
    }
    assert got == {(0, "host0"): want[0], (1, "host1"): want[1]}
    env = json.loads((run_dir / "env.json").read_text())
    m = env["mlperf"]
    assert (m["hosts"], m["host_procs"], m["host_ranks"], m["mode"]) == (2, 1, [0, 1], "subset")
    assert {h: b["ranks"] for h, b in m["by_host"].items()} == {"0": [0], "1": [1]}
    assert m["host_bytes_run"] == sum(want.values()) and metric.order_ok(env, "cpu-single")
    disks = [env["ranks"]["nodes"][n]["storage"]["targets"][0]["block"]["disk"] for n in "01"]
    assert disks[0] != disks[1]  # each rank wrote its own host's disk
    # the rules' figures over both hosts: every rank's bytes, the slowest rank of either host
    t = metric.table(df).set_index("engine")
    by = per.groupby("rep")
    rules = (by["total_bytes"].sum() / GiB / by["total_s"].max()).mean()
    assert t.loc["cpu-single", "write_GiBps"] == pytest.approx(rules)
    h = metric.hosts(df)
    assert list(h["host"]) == ["host0", "host1"] and list(h["ranks"]) == ["0-0", "1-1"]
    assert h["sets_write"].sum() >= 3  # every checkpoint's duration is some host's
    d = Doc()
    mlperf_section(d, runs.load(str(run_dir)))
    text = d.markdown()
    assert "These 2 hosts ran MLPerf's subset mode: ranks 0-1" in text
    assert "host 0: ranks 0-0; host 1: ranks 1-1" in text
    assert "| host1 | 1-1 |" in text
    _nothing_left(tag)


@_marks
def test_a_host_killed_mid_save_is_named_and_costs_the_other_nothing(root: Path) -> None:
    """Host 1 goes down (its agent and its rank SIGKILLed) during its second save of 3: the
    job ends (exit 1) naming host1, rank 0 keeps every row (the first repetition's whole, the
    second's its own, its save measured), and host 0's committed checkpoint of that repetition
    still loads and matches its state (restored after the loss); nothing left."""
    from bench.run import distributed

    tag = _tag()
    cfg = _config(root, repetitions=3, ranks={"nproc": 1, "timeout_s": 30})
    out = root / "out"
    p = subprocess.run(
        _script(tag, "--nproc-per-host", "1", "--disk", "96MiB")
        + ["--", "run", cfg, "-o", str(out), "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        env={**os.environ, distributed.FAULT_ENV: "host@1:1"},
    )
    assert p.returncode == 1, p.stderr[-3000:]
    case = "synthetic-8MiB-1MiB-x1-cpu-single-shared-2r"
    lost = (
        f"rank 1 on host1 lost before the restore of {case} rep 1 (killed, crashed, or not "
        "there within the timeout)"
    )
    assert f"[host0] [rank 0] error: {lost}." in p.stderr
    assert p.stderr.splitlines()[-1] == "hosts: exit 1 (host0 1, host1 agent killed by SIGKILL)"
    _, df = _rows(out)
    assert set(df["case_id"]) == {case}
    r0 = df[df["rep"] == 0]
    assert sorted(r0["rank"]) == [-1, 0, 1] and r0["verified"].all() and (r0["error"] == "").all()
    r1 = df[df["rep"] == 1].set_index("rank")
    assert sorted(r1.index) == [-1, 0]  # host 1 never answered
    assert r1.loc[0, "error"] == lost and r1.loc[-1, "error"] == lost
    # host 0's shard was durable before the loss, and still loaded bit for bit after it
    assert r1.loc[0, "total_s"] > 0 and r1.loc[0, "restore_s"] > 0
    assert bool(r1.loc[0, "verified"]) and r1.loc[0, "restore_into"] in ("restart", "fresh")
    assert r1.loc[0, "device_read_bytes"] > 0
    assert not (df["rep"] == 2).any()
    _nothing_left(tag)


def _rows(out: Path) -> Any:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir, results.read_rows(str(run_dir))


# --- pure pieces -------------------------------------------------------------------------------


def _ceilings(direct_Bps: float) -> dict[str, Any]:
    return {"per_ssd_count": {"1": {"direct_write_Bps": direct_Bps}}, "copy_Bps": 10e9}


def _env(*hosts_Bps: float) -> dict[str, Any]:
    nodes = {
        str(n): {"host": f"host{n}", "ceilings": _ceilings(b)} for n, b in enumerate(hosts_Bps)
    }
    return {"ceilings": _ceilings(hosts_Bps[0]), "ranks": {"nodes": nodes}}


def test_each_host_judges_its_ranks_and_an_aggregate_their_sum() -> None:
    from bench.common.traits import BUILTIN
    from bench.measure import efficiency as eff

    env = _env(2e9, 1e9)
    row = {"engine": "cpu-single", "n_targets": 1, "total_bytes": 1e9, "total_s": 1.0}
    traits = BUILTIN["cpu-single"]
    # a rank on host 1 against host 1's 1 GB/s; an aggregate against 2 + 1 GB/s
    assert eff.efficiency_by(row, eff.judges(env, 1), traits)[0] == 1.0
    assert eff.efficiency_by(row, eff.judges(env, 0), traits)[0] == 0.5
    assert eff.efficiency_by(row, eff.judges(env, -1), traits)[0] == round(1 / 3, 4)
    # one host: the run's ceilings judge every row, as before
    one = {"ceilings": _ceilings(2e9), "ranks": {"nodes": {"0": {"ceilings": _ceilings(9e9)}}}}
    assert [eff.efficiency_by(row, eff.judges(one, n), traits)[0] for n in (0, -1)] == [0.5, 0.5]
    # a host without ceilings: an aggregate across hosts is not judged
    env["ranks"]["nodes"]["1"].pop("ceilings")
    assert eff.judges(env, -1) == [] and eff.judges(env, 1) == []


def test_a_config_difference_is_named_by_its_first_key() -> None:
    from bench.run.distributed import ranks

    a = {"repetitions": 3, "ceilings": {"enabled": True, "tool": "auto"}}
    b = {"repetitions": 3, "ceilings": {"enabled": True, "tool": "fio"}}
    assert ranks._first_difference(a, b) == "ceilings.tool"
    assert ranks._show(b, "ceilings.tool") == '"fio"'
    assert ranks._show(b, "mlperf") == "nothing"


def _rank_rows(durable: dict[int, list[float]], host_of: dict[int, str]) -> Any:
    import pandas as pd

    out = []
    for rank, ts in durable.items():
        for rep, t in enumerate(ts):
            out.append(
                {
                    "workload": "w",
                    "n_targets": 1,
                    "target_map": "shared",
                    "ranks_active": len(durable),
                    "engine": "cpu-single",
                    "rank": rank,
                    "node": host_of[rank],
                    "rep": rep,
                    "aggregate": False,
                    "stall_s": 0.01,
                    "total_s": t,
                    "restore_s": 0.1,
                }
            )
    return pd.DataFrame(out)


def test_a_slow_host_is_named_a_straggler_and_an_even_job_is_not() -> None:
    from types import SimpleNamespace

    from analysis import stragglers

    host_of = {0: "host0", 1: "host0", 2: "host1", 3: "host1"}
    slow = {0: [1.0, 1.1], 1: [0.9, 1.0], 2: [1.0, 1.0], 3: [4.0, 4.4]}
    run: Any = SimpleNamespace(ranked=_rank_rows(slow, host_of))
    ss = {s.time: s for s in stragglers.spreads(run)}
    d = ss["durable"]
    assert (d.n, d.p50_s, d.slowest_rank, d.slowest_host) == (8, 1.0, 3, "host1")
    assert d.slowest_over_p50 == pytest.approx(4.2) and d.max_over_p50 == pytest.approx(4.4)
    assert d.named and not ss["stall"].named and not ss["restore"].named
    assert stragglers.stragglers(list(ss.values())) == [
        "cpu-single, w, 4 ranks shared: rank 3 on host1 is the straggler, its durable 4.20x "
        "the p50 (1.000 s)"
    ]
    even = {0: [1.0, 1.2], 1: [1.1, 1.0], 2: [1.3, 1.0], 3: [1.2, 1.4]}
    run = SimpleNamespace(ranked=_rank_rows(even, host_of))
    assert not any(s.named for s in stragglers.spreads(run))


def _host_env(gpu: str | None, disk: str) -> dict[str, Any]:
    return {
        "env": {"gpu": {"name": gpu}, "kernel": "6.1", "cpu": {"model": "x"}},
        "storage": {"targets": [{"fstype": "ext4", "block": {"disk": disk}}]},
    }


def test_compare_refuses_runs_whose_hosts_differ() -> None:
    from types import SimpleNamespace

    import pandas as pd

    from analysis import compare

    def run(*nodes: dict[str, Any], device: str = "cpu") -> Any:
        table = [{"node_rank": n, "device": device} for n in range(len(nodes))]
        env = {
            "device": {"kind": "host-emulated"},
            "ranks": {"nodes": {str(n): b for n, b in enumerate(nodes)}, "table": table},
        }
        return SimpleNamespace(
            env=env, rows=pd.DataFrame({"device": ["host-emulated"]}), emulated=True,
            gds_modes=dict,
        )  # fmt: skip

    a = run(_host_env(None, "loop0"), _host_env(None, "loop1"))
    same = run(_host_env(None, "loop2"), _host_env(None, "loop3"))
    assert compare.essential_differences(a, same) == []
    b = run(_host_env(None, "loop0"), _host_env("H100", "nvme0n1"), device="cuda:0")
    assert compare.essential_differences(a, b) == [
        "host 0's device differs: A cpu, B cuda",
        "host 1's GPU differs: A None, B H100",
        "host 1's device differs: A cpu, B cuda",
    ]
    one = run(_host_env(None, "loop0"))
    assert compare.essential_differences(a, one) == ["hosts differ: A ran on 2 host(s), B on 1"]
