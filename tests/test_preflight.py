"""The preflight (bench.run.preflight): what each case will hold at its peak against what the machine
has, before anything runs; and restores in place where a second copy would not fit.

The arithmetic is checked for every engine, host-emulated and on CUDA (a device with a given
free memory), with sizes far beyond this machine: nothing of them is allocated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ENGINES, QUICK_BASELINE_S, REPO, RUNNABLE

from bench.engines import REGISTRY
from bench.engines.base import StateSize, build_options
from bench.measure import results
from bench.run import preflight
from bench.storage import checksums, verify

GiB = 1 << 30
MiB = 1 << 20
S = 40 * GiB  # a state no machine of ours holds twice
T = 512 * MiB  # its largest tensor
N = 80  # its tensors


def plan(engine: str, cuda: bool, **options: Any):
    return REGISTRY[engine].memory_plan(StateSize(S, T, N, cuda, 2), build_options(engine, options))


# What each engine holds besides the state, worked out by hand from what it does (its module's
# docstring) and measured at 1 GiB here (host-emulated: cpu-single and cpu-double stage the state,
# dcp keeps a cached copy; safetensors' restore, load_file with pread, reads into the tensors: 1x).
HOST = {
    # engine: (staging, save, fresh restore, restart)
    # its coalescing buffer: small tensors may be there; its restore reads with O_DIRECT
    # through a bounce buffer of a chunk per reading thread (2 a target, 2 targets, 16 MiB)
    "gds": (64 * MiB, 0, S + 64 * MiB, 64 * MiB),
    # its O_DIRECT restore reads into one buffer laid out as the packed stream (64-byte aligned
    # tensors); in place through its staging
    "cpu-single": (S + N * 4096, 0, S + N * 64, 0),
    "cpu-double": (S + N * 4096, 0, S, 0),
    "torch-save": (0, 0, S, 0),
    "safetensors": (0, 0, S, T),
    "dcp": (S, 0, S, T),
    "fastpersist": (64 * MiB, 0, S, S),  # a restart: torch.load whole, then the copy
    "dlio-style": (0, 0, S, 0),
    # its registered buffer (two halves of 128 MiB); a fresh restore reads into new tensors
    # through it, a restart into the state's own
    "nixl": (256 * MiB, 0, S, 0),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engines_host_memory_plan(engine):
    p = plan(engine, cuda=False)
    assert (p.staging, p.save, p.restore_host, p.in_place_host) == HOST[engine]
    assert p.restore_device == 0 and not p.pinned or engine == "fastpersist"
    buffered = REGISTRY[engine].traits.page_cache
    assert p.page_cache == (S if buffered else 0)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engines_cuda_memory_plan(engine):
    """On CUDA the state is device memory; a fresh restore takes device memory too (gds through
    kvikio reads straight into it, the others through host memory); staging is pinned."""
    p = plan(engine, cuda=True)
    # cpu-single: one device buffer laid out as the packed stream (64-byte aligned tensors)
    assert p.restore_device == (S + N * 64 if engine == "cpu-single" else S)
    if engine == "gds":  # kvikio: its bounce buffers, 2 threads x 2 targets x 16 MiB
        assert (p.staging, p.restore_host, p.in_place_host) == (4 * 16 * MiB, 0, 0)
        # the coalescing buffer in device memory, and its checksums' temporaries
        assert p.staging_device == 64 * MiB + 32 * checksums.SEGMENT_WORDS
    elif engine == "cpu-single":
        # fresh and in place through a ring of chunks in its staging: no more host memory
        assert p.pinned and p.staging == S + N * 4096
        assert p.restore_host == p.in_place_host == 0
    elif engine == "cpu-double":
        assert p.pinned and p.staging == S + N * 4096 and p.restore_host == S
        assert p.in_place_host == T  # device tensors one at a time through host memory
    elif engine == "dcp":
        assert p.pinned and p.staging == S
    elif engine == "torch-save":
        assert p.save == T and p.in_place_host == T  # a device storage copied to the host


def test_gds_holds_a_coalescing_buffer_only_where_small_tensors_may_be():
    opts = build_options("gds", {})
    gds = REGISTRY["gds"]
    assert gds.memory_plan(StateSize(S, T, N, False, 2, smallest=MiB), opts).staging == 0
    small = StateSize(S, T, N, False, 2, smallest=4096)
    assert gds.memory_plan(small, opts).staging == 64 * MiB
    tiny = StateSize(8 * MiB, 4096, 2048, False, 1, smallest=4096)  # less than one window
    assert gds.memory_plan(tiny, opts).staging == 8 * MiB + 2048 * 64
    off = build_options("gds", {"coalesce_below": 0})
    assert gds.memory_plan(small, off).staging == 0


def test_bounded_staging_and_plain_dcp():
    p = plan("cpu-single", cuda=False, staging_chunks=4, chunk_bytes="16MiB")
    assert p.staging == 64 * MiB
    d = plan("dcp", cuda=False, staging="plain")
    assert (d.staging, d.save) == (0, S)  # a fresh copy inside every save


def test_judge_takes_fresh_where_it_fits_then_in_place_then_refuses():
    size = StateSize(8 * GiB, 256 * MiB, 32, False, 1)
    opts: dict[str, dict] = {"cpu-single": {"staging_chunks": 4}}
    # 8 (state) + 0.0625 (staging) + 8 (restore) = 16.06 GiB (+5 %): fresh fits in 20 GiB.
    (v,) = preflight.judge("c", ["cpu-single"], size, opts, 20 * GiB, None)
    # the O_DIRECT restore's buffer: the packed stream, each tensor 64-byte aligned
    assert v.restore == "fresh" and v.parts["save or restore"] == 8 * GiB + 32 * 64
    (v,) = preflight.judge("c", ["cpu-single"], size, opts, 12 * GiB, None)
    # in place through a ring of a chunk per read in flight and one (8 + 1 x 16 MiB): 80 MiB
    # beyond the 4-chunk staging it grows from
    ring = (8 + 1) * 16 * MiB - 64 * MiB
    assert v.restore == "restart" and v.parts["save or restore"] == ring
    assert v.host_need == int((8 * GiB + 64 * MiB + ring) * 1.05)
    (v,) = preflight.judge("c", ["cpu-single"], size, opts, 8 * GiB, None)
    assert v.restore is None
    assert v.why == (
        "c cpu-single: host memory: needs 8.5GiB (state 8GiB, cpu-single staging 64MiB, "
        "save or restore 80MiB), 8GiB available; way out: a smaller total_sizes"
    )
    (v,) = preflight.judge("c", ["cpu-single"], size, {}, 16 * GiB, None)
    assert v.restore is None and "bound the staging (engine_options.cpu-single" in v.why
    # restore: fresh asked for, and it does not fit
    (v,) = preflight.judge("c", ["cpu-single"], size, opts, 12 * GiB, None, restore="fresh")
    assert v.restore is None and "save or restore 8.0GiB" in v.why


def test_judge_holds_the_staging_of_the_engines_before():
    """Every engine of a group is warmed on the same state: their staging adds up, and an
    engine that would overflow is refused, naming the staging held beside it."""
    size = StateSize(4 * GiB, 64 * MiB, 64, False, 1)
    got = preflight.judge("c", ["cpu-single", "cpu-double", "gds"], size, {}, 11 * GiB, None)
    assert [v.restore for v in got] == ["restart", None, "restart"]
    assert "fewer engines at once (the staging of cpu-single is held too)" in got[1].why
    assert got[2].parts["cpu-single staging"] == 4 * GiB + 64 * 4096


def test_an_engine_judged_before_sees_the_staging_of_those_after_it():
    """All engines of a workload are warmed at once: safetensors' restore (a second copy of the
    state) runs while DCP, judged after it, holds its cached copy. Judged alone it would restore
    fresh (4 + 4 GiB, +5 %, in 12 GiB); beside DCP's 4 GiB (12.6 GiB) it must restore in place,
    as DCP must. (A sweep that judged each engine only against those before it was OOM-killed
    at 8 GiB.)"""
    size = StateSize(4 * GiB, 256 * MiB, 16, False, 1)
    alone = preflight.judge("c", ["safetensors"], size, {}, 12 * GiB, None)
    assert alone[0].restore == "fresh"
    both = preflight.judge("c", ["safetensors", "dcp"], size, {}, 12 * GiB, None)
    assert [v.restore for v in both] == ["restart", "restart"]
    assert both[0].parts == {
        "state": 4 * GiB,
        "safetensors staging": 0,
        "dcp staging": 4 * GiB,
        "save or restore": 256 * MiB,
    }


def test_judge_on_cuda_holds_device_memory_against_the_gpus_free_memory():
    size = StateSize(60 * GiB, GiB, 60, True, 1)
    # 60 GiB state + 60 GiB fresh restore on a GPU with 139 GiB free: fresh, no host state.
    (v,) = preflight.judge("c", ["gds"], size, {}, 100 * GiB, 139 * GiB)
    assert v.restore == "fresh" and v.parts["state"] == 0
    # 80 GiB free: a fresh restore does not fit on the device; in place it does
    (v,) = preflight.judge("c", ["gds"], size, {}, 100 * GiB, 80 * GiB)
    assert v.restore == "restart"
    (v,) = preflight.judge("c", ["gds"], size, {}, 100 * GiB, 80 * GiB, restore="fresh")
    assert v.restore is None
    assert v.why.startswith(
        "c gds: device memory: needs 120.2GiB (state 60GiB, buffers 192MiB, restore 60GiB)"
    )
    # 50 GiB free: not even the state
    (v,) = preflight.judge("c", ["cpu-single"], size, {}, 100 * GiB, 50 * GiB)
    assert v.restore is None
    # (its fresh restore, which needs no host memory beyond its staging, is named first)
    assert v.why.startswith(
        "c cpu-single: device memory: needs 120.0GiB (state 60GiB, restore 60.0GiB), 50GiB free"
    )
    # pinned staging of the whole state is host memory
    (v,) = preflight.judge("c", ["cpu-single"], size, {}, 50 * GiB, 139 * GiB)
    assert v.restore is None and "host memory: needs" in v.why


def test_cgroup_headroom(tmp_path, monkeypatch):
    """Inside a container MemAvailable is the host's: the cgroup's limit counts too."""
    rel = "kubepods/pod1"
    d = tmp_path / rel
    d.mkdir(parents=True)
    (d / "memory.max").write_text(f"{8 * GiB}\n")
    (d / "memory.current").write_text(f"{6 * GiB}\n")
    (d / "memory.stat").write_text(f"anon {GiB}\nactive_file {GiB}\ninactive_file {GiB}\n")
    real_open = open

    def fake_open(path: Any, *a: Any, **k: Any) -> Any:
        if path == "/proc/self/cgroup":
            p = tmp_path / "cgroup"
            p.write_text(f"0::/{rel}\n")
            return real_open(p, *a, **k)
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    assert preflight.cgroup_available(str(tmp_path)) == 4 * GiB  # 8 - 6 + 2 reclaimable
    (d / "memory.max").write_text("max\n")
    assert preflight.cgroup_available(str(tmp_path)) is None


def _config(tmp: Path, **extra: Any) -> Path:
    cfg = {
        "name": "pf",
        "host_baseline_s": QUICK_BASELINE_S,
        "engines": ["cpu-single"],
        "total_sizes": ["64MiB"],
        "tensor_sizes": ["16MiB"],
        "scratch": str(tmp / "t"),
        "repetitions": 1,
        "warmups": 0,
        "ceilings": {"enabled": False},
        **extra,
    }
    path = tmp / "c.json"
    path.write_text(json.dumps(cfg))
    return path


def test_an_oversized_state_is_refused_in_one_line_before_anything_runs(scratch):
    """A state far beyond this machine's memory: one line naming host memory, what is needed
    and what is there, exit 2; no state built (the process is not killed, it is refused)."""
    cfg = _config(scratch, total_sizes=["1TiB"], tensor_sizes=["1GiB"])
    p = subprocess.run(
        [sys.executable, "-m", "bench", "run", str(cfg), "-o", str(scratch / "out")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(
        "ckptbench: error: synthetic-1TiB-1GiB x1 cpu-single: host memory: needs 2.1TiB "
        "(state 1TiB, cpu-single staging 1.0TiB)"
    )
    assert "available; way out: bound the staging" in lines[0]
    assert not (scratch / "out").exists() or not list((scratch / "out").iterdir())


def test_a_sweep_runs_the_cases_that_fit_and_says_which_it_skipped(scratch, capsys, monkeypatch):
    from bench import cli

    # 256 MiB of host memory available: a 64 MiB state with staging fits, 512 MiB does not.
    monkeypatch.setattr(preflight, "host_available", lambda: 256 * MiB + preflight.HEADROOM)
    cfg = _config(scratch, total_sizes=["64MiB", "512MiB"])
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 0
    (run_dir,) = (scratch / "out").iterdir()
    rows = results.read_rows(str(run_dir))
    assert list(rows["workload"]) == ["synthetic-64MiB-16MiB"] and rows["verified"].all()
    env = json.loads((run_dir / "env.json").read_text())
    (skipped,) = [n for n in env["notes"] if n.startswith("case skipped")]
    assert "synthetic-512MiB-16MiB x1 cpu-single: host memory: needs" in skipped
    assert env["preflight"]["cases"]["synthetic-64MiB-16MiB x1 cpu-single"]["restore"] == "restart"
    # on_error: stop refuses the whole run instead
    cfg = _config(scratch, total_sizes=["64MiB", "512MiB"], on_error="stop")
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out2")]) == 2
    assert "synthetic-512MiB-16MiB x1 cpu-single: host memory" in capsys.readouterr().err


def _in_place(engine: str) -> bool:
    size = StateSize(MiB, MiB, 1, False, 1)
    return REGISTRY[engine].memory_plan(size, build_options(engine, {})).in_place_host is not None


def nested_state() -> dict[str, Any]:
    """A model-and-optimizer-shaped state: nested dicts, int keys, plain values, a
    non-contiguous tensor, a bf16 one."""
    g = torch.Generator().manual_seed(4)
    return {
        "model": {"w": torch.randn(64, 48, generator=g), "wt": torch.randn(8, 6, generator=g).t()},
        "optim": {
            "state": {0: {"step": torch.tensor(3.0), "m": torch.randn(100, generator=g)}},
            "param_groups": [{"lr": 1e-3, "params": [0]}],
        },
        "half": torch.randn(33, generator=g).to(torch.bfloat16),
    }


@pytest.mark.parametrize("engine", [e for e in RUNNABLE if _in_place(e)])
def test_every_engine_restores_in_place(make_engine, targets, engine):
    """load(into=state) reads every tensor back into the state's own memory, bit for bit, and
    returns that same state."""
    eng = make_engine(engine, targets(2))
    state = nested_state()
    want = verify.fingerprint(state)
    eng.save(state, "ckpt").wait()
    ptrs = [t.data_ptr() for _, t in verify_tensors(state)]
    for _, t in verify_tensors(state):
        t.zero_()
    assert verify.first_fingerprint_difference(want, verify.fingerprint(state)) is not None
    got = eng.load("ckpt", checksums=False, into=state)
    assert got is state
    assert [t.data_ptr() for _, t in verify_tensors(state)] == ptrs  # the same memory
    assert verify.first_fingerprint_difference(want, verify.fingerprint(state)) is None
    eng.check("ckpt", state)


def verify_tensors(state: Any) -> list:
    from bench.storage.tree import flatten

    return flatten(state)[1]


@pytest.mark.parametrize("engine", [e for e in RUNNABLE if _in_place(e)])
def test_a_sweep_restoring_in_place_verifies_every_row(scratch, engine):
    from bench import cli

    cfg = _config(scratch, engines=[engine], restore="restart")
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 0
    (run_dir,) = (scratch / "out").iterdir()
    rows = results.read_rows(str(run_dir))
    assert len(rows) == 1 and rows["verified"].all(), rows[["workload", "error"]]
    assert set(rows["restore_into"]) == {"restart"}


def test_a_wrong_in_place_restore_is_caught_and_the_state_built_again(scratch, monkeypatch):
    """A restore in place that brings back a wrong byte (torch-save: no checksums of its own,
    so only the fingerprints can tell): the row does not verify, and the next repetition saves
    a state built again, not the damaged one."""
    from bench import cli
    from bench.engines import torch_save

    real = torch_save.load_into
    calls = {"n": 0}

    def damaging(into, tensors, count):  # type: ignore[no-untyped-def]
        out = real(into, tensors, count)
        calls["n"] += 1
        if calls["n"] == 1:
            into["t00000"].view(torch.uint8)[5] ^= 1
        return out

    monkeypatch.setattr(torch_save, "load_into", damaging)
    cfg = _config(scratch, engines=["torch-save"], restore="restart", repetitions=2)
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 1
    (run_dir,) = (scratch / "out").iterdir()
    rows = results.read_rows(str(run_dir))
    assert list(rows["verified"]) == [False, True]
    assert rows["error"].iloc[0] == "restored state differs at ['t00000']"


def test_fingerprints_tell_a_flipped_bit_and_copy_nothing():
    g = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(1000, generator=g), "b": [torch.arange(10), torch.randn(3, 4).t()]}
    before = verify.fingerprint(state)
    assert verify.first_fingerprint_difference(before, verify.fingerprint(state)) is None
    state["b"][0][3] += 1
    assert verify.first_fingerprint_difference(before, verify.fingerprint(state)) == "['b'][0]"


def test_run_preflight_says_every_verdict_and_runs_nothing(scratch, capsys, monkeypatch):
    from bench import cli

    monkeypatch.setattr(preflight, "host_available", lambda: 320 * MiB + preflight.HEADROOM)
    cfg = _config(
        scratch, total_sizes=["64MiB", "512MiB"], engines=["cpu-single", "gds"], restore="auto"
    )
    assert cli.main(["run", str(cfg), "--preflight", "-o", str(scratch / "out")]) == 0
    out = capsys.readouterr().out
    table = {
        " ".join(ln.split()[:3]): ln.split()[3] for ln in out.splitlines() if ln.startswith("synth")
    }
    assert table == {
        "synthetic-64MiB-16MiB x1 cpu-single": "fresh",
        "synthetic-64MiB-16MiB x1 gds": "fresh",
        "synthetic-512MiB-16MiB x1 cpu-single": "refused",
        "synthetic-512MiB-16MiB x1 gds": "refused",
    }
    assert "refused: synthetic-512MiB-16MiB x1 cpu-single: host memory" in out
    # in place: the state, and gds's restore reading through 2 bounce chunks of 16 MiB
    assert (
        "refused: synthetic-512MiB-16MiB x1 gds: host memory: needs 571.2MiB (state 512MiB, "
        "save or restore 32MiB), 320MiB available"
    ) in out
    assert not (scratch / "out").exists()  # nothing run, no run directory
    cfg = _config(scratch, total_sizes=["1TiB"], tensor_sizes=["1GiB"])
    assert cli.main(["run", str(cfg), "--preflight", "-o", str(scratch / "out")]) == 2


def test_memory_taken_by_another_process_after_the_preflight_skips_the_workload(
    scratch, monkeypatch
):
    """The preflight saw room; by the time a workload's state is built another process has
    taken it: the workload is skipped with a line saying so (the kernel's OOM killer never
    decides), and the rows of the others are kept."""
    from bench import cli

    seen = {"n": 0}

    def shrinking() -> int:
        seen["n"] += 1
        # the preflight's reading and the first workload's check see room; then it is gone
        return 8 * GiB + preflight.HEADROOM if seen["n"] <= 2 else 64 * MiB

    monkeypatch.setattr(preflight, "host_available", shrinking)
    cfg = _config(scratch, total_sizes=["32MiB", "64MiB"])
    assert cli.main(["run", str(cfg), "-q", "-o", str(scratch / "out")]) == 0
    (run_dir,) = (scratch / "out").iterdir()
    rows = results.read_rows(str(run_dir))
    assert list(rows["workload"]) == ["synthetic-32MiB-16MiB"]
    env = json.loads((run_dir / "env.json").read_text())
    (line,) = [n for n in env["notes"] if n.startswith("workload skipped")]
    assert "synthetic-64MiB-16MiB x1: host memory: its cases need up to" in line
    assert "less than at the start of the run" in line


def test_the_gpus_free_memory_is_read_from_the_device(monkeypatch):
    from bench.common.devices import Device

    calls = []

    def mem_get_info(dev=None):  # type: ignore[no-untyped-def]
        calls.append(dev)
        return (42 * GiB, 139 * GiB)

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    cuda = Device("cuda", torch.device("cpu"))
    assert preflight.device_free(cuda) == 42 * GiB and calls == [cuda.torch_device]
    assert preflight.device_free(Device("host-emulated", torch.device("cpu"))) is None


def test_run_preflight_of_a_run_with_ranks_launches_nothing(scratch, capsys, monkeypatch):
    """--preflight of a config with `ranks:` (or --nproc) is refused in one line before torchrun
    would start: it used to launch the ranks and run the whole sweep."""
    from bench import cli
    from bench.run import launch

    monkeypatch.setattr(launch, "launch", lambda *a: pytest.fail("torchrun was launched"))
    out = scratch / "out"
    for argv in (
        ["run", str(REPO / "configs" / "multirank.yaml"), "--preflight"],
        ["run", str(_config(scratch)), "--nproc", "2", "--preflight"],
    ):
        assert cli.main([*argv, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("ckptbench: error: --preflight: ") and "\n" not in err, err
        assert "does not judge a run with ranks yet" in err
    assert not out.exists()
