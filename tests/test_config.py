"""bench.config.sweep: the shipped configs load; every bad value fails with one line naming its key."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ENGINES

from bench.common.errors import UserError
from bench.config import sweep as config

REPO = Path(__file__).resolve().parent.parent
BASE: dict[str, Any] = {
    "engines": ["cpu-single", "gds"],
    "total_sizes": ["8MiB"],
    "tensor_sizes": ["1MiB"],
}


def _write(scratch: Path, raw: Any, name: str = "c.yaml") -> str:
    path = scratch / name
    path.write_text(yaml.safe_dump(raw) if not isinstance(raw, str) else raw)
    return str(path)


def _error(path: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(UserError) as e:
        config.load(path, overrides)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("name", ["default", "smoke", "models", "server"])
def test_shipped_configs_load_and_resolve(name: str) -> None:
    path = str(REPO / "configs" / f"{name}.yaml")
    cfg = config.load(path)
    assert cfg.name == name
    r = config.resolved(cfg)
    json.dumps(r)  # stored in env.json as it is
    assert r["engines"][:5] == ["gds", "cpu-double", "cpu-single", "torch-save", "dcp"]
    assert set(r["engines"]) <= set(ENGINES)
    assert set(r["engine_options"]) == set(cfg.engines)
    assert all(os.path.isabs(t) for t in r["targets"])
    assert len(r["targets"]) >= max(cfg.ssd_counts)
    assert r["skipped_cases"] == []
    for engine in ("gds", "cpu-double", "cpu-single"):
        chunk = r["engine_options"][engine]["chunk_bytes"]
        assert isinstance(chunk, int) and chunk % 4096 == 0
    assert all(isinstance(s, int) for s in r["total_sizes"] + r["tensor_sizes"])


def test_shipped_config_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # default targets are relative to the working directory
    default = config.load("configs/default.yaml")
    assert default.total_sizes == [256 * 2**20]
    # a curve from optimizer-state to weight-shard sizes, every engine, two SSD counts
    assert default.tensor_sizes == [2**20, 16 * 2**20, 64 * 2**20, 256 * 2**20]
    assert default.ssd_counts == [1, 4]
    # every engine but dlio-style, MLPerf Storage's writer, which configs/mlperf.yaml runs
    assert sorted(default.engines) == sorted(e for e in ENGINES if e != "dlio-style")
    assert default.resolved_targets() == [
        str(REPO / "scratch" / "bench" / f"target-{i}") for i in range(4)
    ]
    models = config.load(str(REPO / "configs" / "models.yaml"))
    # the presets at their true sizes (the preflight refuses what a machine cannot hold)
    assert [
        (m.preset, m.optimizer, m.world_size, m.rank, m.expert_parallel) for m in models.models
    ] == [
        ("gpt2-small", True, 8, 0, 1),
        ("gpt2-large", True, 8, 0, 1),
        ("gpt2-xl", True, 8, 0, 1),
        ("llama-7b-shard", True, 8, 0, 1),
        ("olmoe-1b-7b-shard", True, 8, 0, 8),
    ]
    scaling = config.load(str(REPO / "configs" / "scaling.yaml"))
    sizes = scaling.total_sizes
    assert len(sizes) >= 5 and min(sizes) == 256 * 2**20 and max(sizes) >= 12 * 2**30
    assert sorted(scaling.engines) == sorted(
        e for e in ENGINES if e not in ("fastpersist", "dlio-style")
    )
    opts = config.resolved(scaling)["engine_options"]
    assert opts["cpu-single"]["staging_chunks"] == opts["cpu-double"]["staging_chunks"] == 4
    many = config.load(str(REPO / "configs" / "many-tensors.yaml"))
    # the same 80 MiB as 20,480 x 4 KiB, 1,280 x 64 KiB and 5 x 16 MiB, and an MoE shard
    run, skipped = many.synthetic_cases()
    assert run == [(80 * 2**20, t) for t in (4 * 2**10, 64 * 2**10, 16 * 2**20)]
    assert [80 * 2**20 // t for _, t in run] == [20_480, 1_280, 5] and skipped == []
    assert many.engines == ["gds", "cpu-single", "cpu-double", "torch-save"]
    (moe,) = many.models
    assert (moe.preset, moe.world_size, moe.expert_parallel, moe.rank) == (
        "olmoe-1b-7b-shard",
        64,
        4,
        5,
    )
    assert not many.ceilings.enabled and many.ssd_counts == [1]
    server = config.load(str(REPO / "configs" / "server.yaml"))
    assert server.resolved_targets() == [f"/mnt/nvme{i}/ckptbench" for i in range(8)]
    assert config.resolved(server)["engine_options"]["cpu-single"]["chunk_bytes"] == 32 * 2**20


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"repetitons": 3}, "repetitons: unknown key"),
        (
            {"models": [{"preset": "gpt2-small", "optimiser": True}]},
            "models.0.optimiser: unknown key",
        ),
        ({"repetitions": "3"}, "repetitions: Input should be a valid integer, got '3'"),
        ({"repetitions": 0}, "repetitions: Input should be greater than 0, got 0"),
        ({"warmups": -1}, "warmups: Input should be greater than or equal to 0, got -1"),
        ({"verify": "yes"}, "verify: Input should be a valid boolean, got 'yes'"),
        ({"device": "gpu"}, "device: Input should be 'auto', 'cuda' or 'host-emulated', got 'gpu'"),
        (
            {"restore": "sideways"},
            "restore: Input should be 'restart', 'fresh' or 'auto', got 'sideways'",
        ),
        ({"on_error": "ignore"}, "on_error: Input should be 'continue' or 'stop', got 'ignore'"),
        ({"engines": "cpu-single"}, "engines: Input should be a valid list, got 'cpu-single'"),
        ({"total_sizes": [0]}, "total_sizes.0: size must be positive, got 0"),
        ({"total_sizes": ["0B"]}, "total_sizes.0: size must be positive, got '0B'"),
        ({"total_sizes": ["-1GiB"]}, "total_sizes.0: size must be positive, got '-1GiB'"),
        ({"tensor_sizes": [-4096]}, "tensor_sizes.0: size must be positive, got -4096"),
        ({"tensor_sizes": ["1MiB", "12 parsecs"]}, "tensor_sizes.1: cannot read '12 parsecs'"),
        ({"tensor_sizes": ["1Gb"]}, "tensor_sizes.0: '1Gb' is in bits"),
        ({"total_sizes": [True]}, "total_sizes.0: expected a size like '256MiB', got True"),
        (
            {"tensor_sizes": ["16MiB", "1GiB"]},
            "tensor_sizes: every tensor size is larger than every total size",
        ),
        (
            {"ssd_counts": [1, 3], "targets": ["a", "b"]},
            "ssd_counts: 3 SSDs asked for, but targets lists only 2",
        ),
        ({"ssd_counts": [0]}, "ssd_counts.0: Input should be greater than 0, got 0"),
        (
            {"targets": ["a", "b", "./a"]},
            f"targets.2: {os.path.abspath('a')} is already listed as targets.0",
        ),
        (
            {"engines": ["cpu-single", "nvme-magic"]},
            "engines.1: unknown engine 'nvme-magic' (known: gds, cpu-single, cpu-double, "
            "torch-save, dcp, safetensors, fastpersist, dlio-style, nixl)",
        ),
        (
            {"engines": ["cpu-single", "gds", "cpu-single"]},
            "engines: an engine is listed twice in ['cpu-single', 'gds', 'cpu-single']",
        ),
        (
            {"engine_options": {"cpu-single": {"chunkbytes": "1MiB"}}},
            "engine_options.cpu-single.chunkbytes: unknown key (known: chunk_bytes, "
            "threads_per_target, checksums, device, fallocate, max_write_bw, staging_chunks, "
            "copy_threads, overlap, overlap_writes, read_threads_per_target, restore_direct)",
        ),
        (
            # gds has no snapshot: the snapshot's knobs are refused, not silently ignored
            {"engine_options": {"gds": {"copy_threads": 2}}},
            "engine_options.gds.copy_threads: unknown key (known: chunk_bytes, "
            "threads_per_target, checksums, device, fallocate, max_write_bw, io, allow_compat, "
            "gds_threshold, register_buffers, coalesce_below, coalesce_bytes)",
        ),
        (
            {"engine_options": {"torch-save": {"threads": 2}}},
            "engine_options.torch-save.threads: unknown key (known: none)",
        ),
        (
            {"engine_options": {"cpu-single": {"chunk_bytes": "1000"}}},
            "engine_options.cpu-single.chunk_bytes: must be a multiple of 4096, got 1000",
        ),
        (
            {"engine_options": {"gds": {"chunk_bytes": "lots"}}},
            "engine_options.gds.chunk_bytes: cannot read 'lots' as a size",
        ),
        (
            {"engine_options": {"cpu-double": {"threads_per_target": 0}}},
            "engine_options.cpu-double.threads_per_target: Input should be greater than 0, got 0",
        ),
        (
            {"engine_options": {"gds": {"io": "magic"}}},
            "engine_options.gds.io: Input should be 'auto', 'kvikio' or 'emulated', got 'magic'",
        ),
        ({"engine_options": {"nvme": {}}}, "engine_options.nvme: unknown engine 'nvme'"),
        ({"engines": []}, "engines: List should have at least 1 item after validation, not 0"),
        (
            {"ssd_counts": []},
            "ssd_counts: List should have at least 1 item after validation, not 0",
        ),
        ({"dtype": "float33"}, "dtype: unknown dtype 'float33'"),
        ({"dtype": "Tensor"}, "dtype: unknown dtype 'Tensor'"),
        (
            {"models": [{"preset": "gpt2-small", "dtype": "fp8"}]},
            "models.0.dtype: unknown dtype 'fp8'",
        ),
        (
            {"dtype": "float64", "tensor_sizes": [1028]},
            "tensor_sizes.0: 1028 bytes is not a multiple of the float64 size (8 B)",
        ),
        (
            {"total_sizes": [1022], "tensor_sizes": [8]},
            "total_sizes.0: 1022 bytes is not a multiple of the float32 size (4 B)",
        ),
        ({"models": ["gpt3"]}, "models.0.preset: unknown preset 'gpt3' (known: gpt2-small, "),
        (
            {"models": [{"preset": "llama-7b-shard", "world_size": 4, "rank": 4}]},
            "models.0.rank: 4 must be below world_size 4",
        ),
        (
            {"models": [{"preset": "llama-7b-shard", "world_size": 0}]},
            "models.0.world_size: Input should be greater than 0, got 0",
        ),
        (
            {"models": [{"preset": "llama-7b-shard", "world_size": 64}]},
            "models.0: llama-7b-shard: need 1 <= world_size <= 32 and 0 <= rank < world_size, "
            "got world_size=64, rank=0",
        ),
        (
            {"models": [{"preset": "gpt2-small", "expert_parallel": 8}]},
            "models.0: gpt2-small: expert_parallel applies to mixture-of-experts presets only, "
            "got 8",
        ),
        (
            {"models": [{"preset": "olmoe-1b-7b-shard", "world_size": 8, "expert_parallel": 16}]},
            "models.0: olmoe-1b-7b-shard: expert_parallel must divide num_experts (64) and "
            "world_size (8), got 16",
        ),
        (
            {"models": [{"preset": "olmoe-1b-7b-shard", "world_size": 64, "expert_parallel": 2}]},
            "models.0: olmoe-1b-7b-shard: need 1 <= world_size / expert_parallel <= 16 pipeline "
            "stages and 0 <= rank < world_size, got world_size=64, expert_parallel=2, rank=0",
        ),
        (
            {"models": [{"preset": "olmoe-1b-7b-shard", "expert_parallel": 0}]},
            "models.0.expert_parallel: Input should be greater than 0, got 0",
        ),
        ({"name": "a/b"}, "name: 'a/b' must be a non-empty name without '/'"),
        ({"host_baseline_s": 0}, "host_baseline_s: Input should be greater than 0, got 0"),
    ],
)
def test_bad_values_fail_with_their_key_path(scratch: Path, change: dict, says: str) -> None:
    path = _write(scratch, {**BASE, **change})
    msg = _error(path)
    assert msg.startswith(f"config {path}: "), msg
    assert says in msg, msg


def test_missing_keys(scratch: Path) -> None:
    path = _write(scratch, {"total_sizes": ["8MiB"], "tensor_sizes": ["1MiB"]})
    assert _error(path) == f"config {path}: engines: Field required"
    path = _write(scratch, {"engines": ["gds"], "total_sizes": ["8MiB"]})
    assert "total_sizes, tensor_sizes: give both" in _error(path)
    path = _write(scratch, {"engines": ["gds"], "models": ["gpt2-small"], "total_sizes": ["8MiB"]})
    assert _error(path) == f"config {path}: total_sizes, tensor_sizes: give both or neither"


def test_file_errors(scratch: Path) -> None:
    missing = str(scratch / "nope.yaml")
    assert _error(missing) == f"config {missing}: no such file"
    assert _error(str(scratch)) == f"config {scratch}: is a directory"
    bad = _write(scratch, "engines: [cpu-single\ntotal_sizes: [1MiB]\n", "bad.yaml")
    assert _error(bad) == f"config {bad}: not valid YAML at line 2"
    top_list = _write(scratch, "- cpu-single\n- gds\n", "list.yaml")
    assert _error(top_list) == f"config {top_list}: expected a mapping of keys, got list"
    empty = _write(scratch, "", "empty.yaml")
    assert _error(empty) == f"config {empty}: engines: Field required"


def test_set_overrides(scratch: Path) -> None:
    path = _write(scratch, BASE)
    cfg = config.load(path, ["repetitions=5", "engine_options.cpu-single.chunk_bytes=32MiB"])
    assert cfg.repetitions == 5
    r = config.resolved(cfg)
    assert r["engine_options"]["cpu-single"]["chunk_bytes"] == 32 * 2**20
    assert r["engine_options"]["gds"]["chunk_bytes"] == 16 * 2**20
    cfg = config.load(
        path, ["engines=[cpu-single,dcp]", "ssd_counts=[1, 2]", "models=[gpt2-small]"]
    )
    assert cfg.engines == ["cpu-single", "dcp"]
    assert cfg.ssd_counts == [1, 2]
    assert cfg.models[0].preset == "gpt2-small"


@pytest.mark.parametrize(
    ("assignment", "says"),
    [
        ("nokey", "--set 'nokey': expected key=value, e.g. repetitions=5"),
        ("=5", "--set '=5': bad key ''"),
        ("engine_options..chunk_bytes=1MiB", "bad key 'engine_options..chunk_bytes'"),
        ("engines.x=1", "--set 'engines.x=1': engines is not a mapping"),
        ("repetitions=[", "--set 'repetitions=[': cannot parse the value '['"),
        ("repetitions=three", "repetitions: Input should be a valid integer, got 'three'"),
        ("repetiton=3", "repetiton: unknown key"),
    ],
)
def test_set_errors(scratch: Path, assignment: str, says: str) -> None:
    msg = _error(_write(scratch, BASE), [assignment])
    assert says in msg, msg


def test_skipped_combinations_are_listed(scratch: Path) -> None:
    raw = {**BASE, "total_sizes": ["8MiB", "64MiB"], "tensor_sizes": ["1MiB", "16MiB"]}
    cfg = config.load(_write(scratch, raw))
    run, skipped = cfg.synthetic_cases()
    mib = 2**20
    assert run == [(8 * mib, mib), (64 * mib, mib), (64 * mib, 16 * mib)]
    assert skipped == [(8 * mib, 16 * mib)]
    assert config.resolved(cfg)["skipped_cases"] == [
        {"total_bytes": 8 * mib, "tensor_bytes": 16 * mib, "why": "tensor larger than total"}
    ]


def test_defaults_and_bare_model_names(scratch: Path) -> None:
    cfg = config.load(_write(scratch, {"engines": ["dcp"], "models": ["gpt2-small"]}))
    assert cfg.name == "run"
    assert cfg.ssd_counts == [1]
    assert (cfg.repetitions, cfg.warmups, cfg.verify, cfg.on_error) == (3, 1, True, "continue")
    assert cfg.models[0] == config.ModelSpec(preset="gpt2-small")
    assert cfg.resolved_targets() == [os.path.abspath("scratch/bench/target-0")]


def test_model_workloads_name_their_shard(scratch: Path) -> None:
    """A sharded preset's workload id says which shard (and the expert-parallel cut); its size
    comes from the shapes without building the state."""
    from bench.run import plan

    raw = {
        "engines": ["cpu-single"],
        "models": [
            "gpt2-small",
            {"preset": "llama-7b-shard", "world_size": 8, "rank": 1},
            {"preset": "olmoe-1b-7b-shard", "world_size": 64, "expert_parallel": 4, "rank": 5},
            {"preset": "olmoe-1b-7b-shard", "world_size": 16, "optimizer": False},
        ],
    }
    cfg = config.load(_write(scratch, raw))
    wls = plan.workloads(cfg)
    assert [w.id for w in wls] == [
        "gpt2-small",
        "llama-7b-shard-r1of8",
        "olmoe-1b-7b-shard-r5of64-ep4",
        "olmoe-1b-7b-shard-noopt-r0of16",
    ]
    size = wls[2].size(cfg, False, 1)
    # layer 1's experts 16-31: 48 matrices of 1024 x 2048, fp32, with AdamW (4 tensors each)
    assert (size.nbytes, size.tensors) == (48 * 3 * 4 * 1024 * 2048 + 48 * 4, 192)


def test_restore_defaults_to_a_restart_and_reads_in_place_as_one() -> None:
    base = {"engines": ["cpu-single"], "total_sizes": ["1MiB"], "tensor_sizes": ["1MiB"]}
    assert config.from_dict(base).restore == "restart"
    assert config.from_dict({**base, "restore": "in-place"}).restore == "restart"
    assert config.from_dict({**base, "restore": "fresh"}).restore == "fresh"
