"""scripts/hosts.py: two hosts on one machine (network, UTS and mount namespaces, a veth pair,
a loop disk each, one torchrun agent per host), as root.

Every test runs the script under its own tag and checks, after it, that nothing of that tag is
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

pytestmark = [pytest.mark.root, pytest.mark.slow]
JOB_TIMEOUT_S = 300  # the hard guard around every invocation: catches hangs, not slowness


@pytest.fixture(autouse=True)
def _need_namespaces() -> None:
    why = hosts.requirements()
    if why:
        pytest.skip(f"scripts/hosts.py {why}")


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


def _rows(out: Path) -> Any:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir, results.read_rows(str(run_dir))
