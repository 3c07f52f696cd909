"""`ckptbench tune` (bench/run/tune/): the knobs each engine declares and their checks, the search
against a planted landscape, a real tune of cpu-single on real files, the profile's round trip
and refusals, `run --tuned` applying what was found, and `make peers TUNED=...` (scripts/peers.py
--tuned) running each tuned engine with its knobs beside its defaults."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.common.errors import UserError
from bench.engines.registry import ENGINES, knob_grid, options_model
from bench.run.tune import Tuner, parse_budget, profile
from bench.run.tune.search import Trial, halving, thin

MiB = 1 << 20


def one_line_error(capsys: pytest.CaptureFixture[str], code: int, *says: str) -> str:
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for s in says:
        assert s in lines[0], lines[0]
    return lines[0]


# -- knobs ---------------------------------------------------------------------------------------


def test_every_declared_grid_is_accepted_by_its_engine_and_holds_its_default():
    for name in ENGINES:
        model = options_model(name)
        grid = knob_grid(name)
        if not model.TUNABLE:
            assert grid == [{}]
            continue
        assert len(grid) == len({json.dumps(g, sort_keys=True) for g in grid}) > 1
        default = model()
        for knob, values in model.TUNABLE.items():
            assert getattr(default, knob) in values, (name, knob)
    assert {g["thread_count"] for g in knob_grid("dcp")} == {1, 2, 4, 8}
    assert len(knob_grid("cpu-single")) == 4 * 3 * 2


@pytest.mark.parametrize(
    "ranges, says",
    [
        ({"threads_per_target": [2, 0]}, "tune.cpu-single.threads_per_target: "),
        (
            {"chunk_bytes": ["16MiB", 5000]},
            "tune.cpu-single.chunk_bytes: must be a multiple of 4096",
        ),
        ({"thread_count": [2]}, "tune.cpu-single.thread_count: not a knob tune can search"),
        ({"staging_chunks": 4}, "tune.cpu-single.staging_chunks: expected a non-empty list"),
    ],
)
def test_a_range_the_engine_refuses_fails_naming_knob_and_value(ranges, says):
    with pytest.raises(UserError) as e:
        knob_grid("cpu-single", ranges)
    assert str(e.value).startswith(says), str(e.value)


def test_a_configs_tune_ranges_replace_the_declared_ones_in_sizes_the_model_holds():
    grid = knob_grid("cpu-single", {"chunk_bytes": ["8MiB"], "staging_chunks": [0]})
    assert grid == [
        {"threads_per_target": n, "chunk_bytes": 8 * MiB, "staging_chunks": 0} for n in (1, 2, 4, 8)
    ]


# -- the search ----------------------------------------------------------------------------------


class Landscape:
    """A planted landscape on a fake clock: rate = a peak at threads 4 and 16 MiB chunks, each
    trial taking `wall_s` of the clock, with a drift that favours trials run later."""

    def __init__(self, wall_s: float = 1.0, drift: float = 0.0) -> None:
        self.now = 0.0
        self.wall_s = wall_s
        self.drift = drift
        self.calls: list[tuple[int, dict]] = []

    def clock(self) -> float:
        return self.now

    def rate(self, s: dict) -> float:
        return 10 - abs(s["threads"] - 4) - abs(s["chunk"] - 16) / 8

    def trial(self, s: dict, rnd: int) -> Trial:
        self.calls.append((rnd, dict(s)))
        self.now += self.wall_s
        return Trial(s, rnd, self.rate(s) + self.drift * self.now, self.wall_s)


GRID = [{"threads": t, "chunk": c} for t in (1, 2, 4, 8) for c in (4, 16, 64)]
DEFAULT = {"threads": 2, "chunk": 16}


def test_the_search_finds_the_peak_and_halves_with_rounds_alternating():
    land = Landscape()
    found = halving(GRID, DEFAULT, land.trial, deadline=100.0, first_s=1.0, clock=land.clock)
    assert found.best == {"threads": 4, "chunk": 16}
    assert found.stopped == "one left"
    rounds = [r for r, _ in land.calls]
    # 12 settings, then 6, 3, 2: each round tries each survivor once
    assert [rounds.count(r) for r in range(4)] == [12, 6, 3, 2]
    assert land.calls[0][1] == DEFAULT  # the default first: it prices a trial
    r1 = [s for r, s in land.calls if r == 1]
    r2 = [s for r, s in land.calls if r == 2]
    # survivors ranked best first; odd rounds run them in reverse (drift favours no order)
    assert r1[-1] == {"threads": 4, "chunk": 16}
    assert r2[0] == {"threads": 4, "chunk": 16}


def test_the_search_keeps_its_deadline_and_thins_the_grid_evenly():
    land = Landscape(wall_s=2.0)
    found = halving(GRID, DEFAULT, land.trial, deadline=11.0, first_s=2.0, clock=land.clock)
    assert land.now <= 11.0
    assert len(found.trials) == 5 and found.stopped == "out of time"
    tried = [s for _, s in land.calls]
    assert tried[0] == DEFAULT
    assert {s["threads"] for s in tried} == {1, 2, 4, 8}  # spread, not the grid's head
    assert found.best == max(tried, key=land.rate)


def test_thinning_keeps_the_default_first_and_every_setting_when_time_allows():
    assert thin(GRID, DEFAULT, 1) == [DEFAULT]
    assert thin(GRID, DEFAULT, 99) == [DEFAULT, *(g for g in GRID if g != DEFAULT)]
    other = {"threads": 3, "chunk": 16}  # a default outside the grid is tried beside it
    assert thin(GRID, other, 99) == [other, *GRID]


def test_budget_parsing():
    assert parse_budget("60s") == parse_budget("1m") == parse_budget("60") == 60.0
    for bad in ("soon", "0s", "-5"):
        with pytest.raises(UserError, match="--budget"):
            parse_budget(bad)


# -- a real tune ---------------------------------------------------------------------------------


def write_config(d: Path, **changes: object) -> Path:
    targets = [d / "target-0"]
    for t in targets:
        t.mkdir(parents=True, exist_ok=True)
    raw = {
        "name": "tune",
        "engines": ["cpu-single"],
        "total_sizes": ["8MiB"],
        "tensor_sizes": ["1MiB", "2MiB"],
        "ssd_counts": [1],
        "targets": [str(t) for t in targets],
        "ceilings": {"min_bytes": "8MiB"},
        "engine_options": {"cpu-single": {"chunk_bytes": "1MiB"}},  # the default in the grid
        "tune": {
            "cpu-single": {
                "threads_per_target": [1, 2],
                "chunk_bytes": ["1MiB"],
                "staging_chunks": [0],
            }
        },
        **changes,
    }
    path = d / "tune.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """One real tune of cpu-single (two settings, 8 MiB states) on a real target."""
    d = tmp_path_factory.mktemp("tune")
    cfg = write_config(d)
    prof = d / "tuned.yaml"
    code = main(
        ["tune", str(cfg), "--budget", "40s", "-o", str(prof), "--output", str(d / "results")]
    )
    assert code == 0
    return cfg, prof, yaml.safe_load(prof.read_text())


def test_a_real_tune_saves_durably_and_keeps_its_budget(tuned):
    cfg, prof, d = tuned
    assert d["host"] == socket.gethostname() and d["budget_s"] == 40.0
    assert d["took_s"] <= 40.0 * 1.1
    assert d["total_bytes"] == 8 * MiB and d["tensor_bytes"] == 2 * MiB  # four tensors
    (r,) = d["results"]
    assert r["engine"] == "cpu-single" and r["ssd_count"] == 1
    assert r["default"] == {"threads_per_target": 2, "chunk_bytes": MiB, "staging_chunks": 0}
    settings = [t["setting"]["threads_per_target"] for t in r["trials"]]
    assert sorted(settings[:2]) == [1, 2] and settings[0] == 2  # the default first
    assert all(t["durable_GBps"] > 0 and not t.get("error") for t in r["trials"])
    best = r["best"]["threads_per_target"]
    mine = [t["durable_GBps"] for t in r["trials"] if t["setting"]["threads_per_target"] == best]
    assert r["best_GBps"] == pytest.approx(sorted(mine)[len(mine) // 2], abs=1e-3)
    for t in r["trials"]:  # each trial a real run whose raw rows are kept
        rows = (cfg.parent / "results" / t["run"] / "results.csv").read_text().splitlines()
        assert len(rows) == 2 and "cpu-single" in rows[1]
    (tgt,) = d["targets"]
    assert tgt["path"].endswith("target-0") and tgt["fstype"]
    assert not [p for p in os.listdir(prof.parent) if p.startswith(".tune-")]  # atomic


def test_the_profile_round_trips(tuned):
    _, prof, d = tuned
    p = profile.load(str(prof))
    assert p.model_dump(exclude_defaults=False)["results"][0]["best"] == d["results"][0]["best"]
    assert p.targets[0].fstype == d["targets"][0]["fstype"]


def test_run_tuned_applies_the_knobs_and_says_so(tuned, tmp_path: Path):
    cfg, prof, d = tuned
    # the profile's best, made distinct from the default so that applying it shows
    edited = tmp_path / "p.yaml"
    d2 = json.loads(json.dumps(d))
    d2["results"][0]["best"] = {"threads_per_target": 3, "chunk_bytes": 2 * MiB}
    edited.write_text(yaml.safe_dump(d2))
    out = tmp_path / "results"
    code = main(
        ["run", str(cfg), "--tuned", str(edited), "-q", "-o", str(out)]
        + ["--set", "warmups=0", "--set", "repetitions=1", "--set", "ceilings.enabled=false"]
    )
    assert code == 0
    (run,) = list(out.iterdir())
    env = json.loads((run / "env.json").read_text())
    assert env["tuned"]["profile"] == str(edited)
    r = d["results"][0]
    assert env["tuned"]["applied"] == {
        "cpu-single": {
            "ssd_count": 1,
            "knobs": {"threads_per_target": 3, "chunk_bytes": 2 * MiB},
            "default_GBps": r["default_GBps"],
            "tuned_GBps": r["best_GBps"],
        }
    }
    assert len(env["tuned"]["sha256"]) == 64
    opts = env["config"]["engine_options"]["cpu-single"]
    assert opts["threads_per_target"] == 3 and opts["chunk_bytes"] == 2 * MiB
    assert opts["checksums"] is True  # the config's other options kept
    # the report's section: the knobs, the tune's numbers and this run's
    from analysis import runs
    from analysis.report import tuning

    loaded = runs.load(str(run))
    assert tuning.present(loaded)
    (row,) = tuning.rows(loaded)
    assert row["knobs"] == f"chunk_bytes={2 * MiB} threads_per_target=3"  # env.json sorts keys
    assert (row["default"], row["tuned"]) == (r["default_GBps"], r["best_GBps"])
    assert row["run"] > 0 and row["ceiling"] is None  # ceilings off in this run
    assert tuning.headline(loaded, [row]).startswith(f"Run with the knobs of {edited}: ")


# -- refusals ------------------------------------------------------------------------------------


def test_a_budget_too_small_for_one_trial_is_refused_and_writes_nothing(tmp_path, capsys):
    cfg = write_config(tmp_path)
    prof = tmp_path / "p.yaml"
    code = main(["tune", str(cfg), "--budget", "2s", "-o", str(prof), "--output", str(tmp_path)])
    one_line_error(capsys, code, "--budget: 2s is too small", "1 searches")
    assert not prof.exists() and not (tmp_path / "results").exists()


def test_a_tune_range_the_engine_refuses_is_one_line(tmp_path, capsys):
    cfg = write_config(tmp_path, tune={"cpu-single": {"chunk_bytes": ["3KiB"]}})
    code = main(["tune", str(cfg), "-o", str(tmp_path / "p.yaml")])
    one_line_error(capsys, code, "tune.cpu-single.chunk_bytes", "3072")
    assert not (tmp_path / "p.yaml").exists()


def _refused(tuned, tmp_path, capsys, edit, *says: str) -> None:
    cfg, _, d = tuned
    bad = tmp_path / "bad.yaml"
    if callable(edit):
        d2 = json.loads(json.dumps(d))
        edit(d2)
        bad.write_text(yaml.safe_dump(d2))
    else:
        bad.write_text(edit)
    out = tmp_path / "results"
    code = main(["run", str(cfg), "--tuned", str(bad), "-q", "-o", str(out)])
    one_line_error(capsys, code, f"--tuned {bad}", *says)
    assert not out.exists()  # nothing written


def test_a_profile_from_another_file_system_is_refused(tuned, tmp_path, capsys):
    def edit(d):
        d["targets"][0]["fstype"] = "lustre"

    _refused(tuned, tmp_path, capsys, edit, "targets.0.fstype: tuned on 'lustre'")


def test_a_profile_from_another_device_or_host_is_refused(tuned, tmp_path, capsys):
    def disk(d):
        d["targets"][0]["disk"] = "nvme9n1"

    _refused(tuned, tmp_path, capsys, disk, "targets.0.disk: tuned on 'nvme9n1'")

    def host(d):
        d["host"] = "elsewhere"

    _refused(tuned, tmp_path, capsys, host, "host: tuned on 'elsewhere'")


def test_a_corrupt_profile_is_refused_naming_the_field(tuned, tmp_path, capsys):
    _, prof, _ = tuned
    text = prof.read_text()
    _refused(tuned, tmp_path, capsys, text[: len(text) // 3] + "\n  - [unclosed", "not YAML")

    def no_best(d):
        del d["results"][0]["best_GBps"]

    _refused(tuned, tmp_path, capsys, no_best, "results.0.best_GBps")

    def negative(d):
        d["budget_s"] = -1

    _refused(tuned, tmp_path, capsys, negative, "budget_s")


def test_tuner_refuses_a_config_with_nothing_to_tune(tmp_path):
    cfg = write_config(tmp_path, engines=["torch-save"], tune={})
    t = Tuner(str(cfg), [], 60.0, str(tmp_path), say=lambda _: None)
    with pytest.raises(UserError, match="torch-save: no knobs to tune"):
        t.plan()


def test_an_interrupted_tune_writes_no_profile_and_says_what_was_tried(
    tmp_path, capsys, monkeypatch
):
    """Ctrl-C during the second trial (a fake trial stands in for the save: the interrupt is
    what is tested)."""
    from bench.run.tune import trials

    calls = []

    def trial(self, engine, n, setting, rnd):
        calls.append(setting)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return Trial(setting, rnd, 1.0, 0.01, "run-1")

    monkeypatch.setattr(trials.Trials, "run", trial)
    cfg = write_config(tmp_path)
    prof = tmp_path / "p.yaml"
    code = main(["tune", str(cfg), "--budget", "30s", "-o", str(prof), "--output", str(tmp_path)])
    assert code == 130 and not prof.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tune-")]
    err = capsys.readouterr().err.strip()
    assert err == (
        "ckptbench: tune interrupted, no profile written; 1 trial(s) run (raw rows under "
        f"{tmp_path}/), searches finished: none; the last: cpu-single x1 threads_per_target=2 "
        f"chunk_bytes={MiB} staging_chunks=0"
    )


def test_targets_on_the_command_line_replace_the_configs(tmp_path, capsys, monkeypatch):
    """`--targets`: the searches run there and the profile records them (a fake trial stands in
    for the save: what is tested is where the tune points)."""
    from bench.run.tune import trials

    seen = []

    def trial(self, engine, n, setting, rnd):
        seen.append(self.config(engine, n, setting).resolved_targets()[:n])
        return Trial(setting, rnd, float(setting["threads_per_target"]), 0.01, "run-1")

    monkeypatch.setattr(trials.Trials, "run", trial)
    cfg = write_config(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    prof = tmp_path / "p.yaml"
    code = main(
        ["tune", str(cfg), "--targets", str(other), "--budget", "30s", "-o", str(prof)]
        + ["--output", str(tmp_path / "results")]
    )
    assert code == 0, capsys.readouterr().err
    d = yaml.safe_load(prof.read_text())
    assert [t["path"] for t in d["targets"]] == [str(other)]
    assert seen and all(s == [str(other)] for s in seen)
    assert d["results"][0]["best"]["threads_per_target"] == 2  # the planted best of [1, 2]


# -- make peers TUNED=... (scripts/peers.py --tuned) ---------------------------------------------

PEERS_KNOBS = {
    "cpu-single": {"threads_per_target": 3, "chunk_bytes": 2 * MiB},
    "dcp": {"thread_count": 3},
    "nixl": {"backend": "posix-aio", "request_bytes": 2 * MiB, "batch": 3},
}


def peers_profile(path: Path, target: Path, **changes: object) -> Path:
    """A profile for `target` as a tune here would write it, each engine's best distinct from
    its defaults (so that a row run with them shows it)."""
    results = [
        {
            "ssd_count": 1,
            "engine": e,
            "default": {},
            "default_GBps": 1.0,
            "best": knobs,
            "best_GBps": 2.0,
            "stopped": "done",
            "trials": [],
        }
        for e, knobs in PEERS_KNOBS.items()
    ]
    d = profile.build(
        targets=[str(target)],
        host=socket.gethostname(),
        config="peers.yaml",
        budget_s=60.0,
        took_s=1.0,
        total_bytes=8 * MiB,
        tensor_bytes=MiB,
        results=results,
    )
    d.update(changes)
    profile.write(d, str(path))
    return path


def run_peers(target: Path, out: Path, prof: Path) -> subprocess.CompletedProcess[str]:
    repo = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, str(repo / "scripts" / "peers.py"), "--size", "4MiB", "--tensor", "1MiB"]
        + ["--reps", "1", "--target", str(target), "-o", str(out), "--tuned", str(prof)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_peers_tuned_runs_each_tuned_engine_with_its_knobs_beside_its_default(scratch):
    from bench import engines

    target = scratch / "t"
    target.mkdir()
    prof = peers_profile(scratch / "tuned.yaml", target)
    got = run_peers(target, scratch / "out", prof)
    assert got.returncode == 0, got.stderr
    (run,) = (scratch / "out").iterdir()
    with open(run / "peers.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["engine"] in PEERS_KNOBS]
    for e, knobs in PEERS_KNOBS.items():
        if engines.unavailable(e, knobs):
            continue
        mine = [r for r in rows if r["engine"] == e]
        # one row with the profile's knobs, and the default rows beside it, all verified
        tuned = [r for r in mine if all(json.loads(r["options"])[k] == v for k, v in knobs.items())]
        assert len(tuned) == 1 and len(mine) > 1, (e, mine)
        assert tuned[0]["verified"] == "True" and float(tuned[0]["durable_s"]) > 0
        assert "tuned" in tuned[0]["method"]
        for r in mine:
            if r is not tuned[0]:
                assert "tuned" not in r["method"], r
    by = {r["method"]: r for r in rows}
    if not engines.unavailable("nixl", PEERS_KNOBS["nixl"]):
        # what nixl's save reported: the io queue and request sizes it ran with
        (nixl,) = [r for r in rows if r["engine"] == "nixl" and "tuned" in r["method"]]
        io = json.loads(nixl["io_detail"])
        assert (io["backend"], io["request_bytes"], io["batch"]) == ("POSIX/AIO", 2 * MiB, 3)
        default = json.loads(by["NIXL POSIX io_uring"]["io_detail"])
        assert (default["request_bytes"], default["batch"]) == (16 * MiB, 16)
    env = json.loads((run / "env.json").read_text())
    assert env["tuned"]["profile"] == str(prof) and len(env["tuned"]["sha256"]) == 64
    assert {e: a["knobs"] for e, a in env["tuned"]["applied"].items()} == PEERS_KNOBS
    assert f"tuned rows with the knobs of {prof}" in got.stdout


@pytest.mark.parametrize(
    "change, says",
    [
        ({"host": "elsewhere"}, "host: tuned on 'elsewhere'"),
        ("fstype", "targets.0.fstype: tuned on 'lustre'"),
        ({"results": []}, "results: no engine of the run"),
    ],
)
def test_make_peers_refuses_a_profile_that_does_not_fit_in_one_line(scratch, change, says):
    target = scratch / "t"
    target.mkdir()
    if change == "fstype":
        prof = peers_profile(scratch / "p.yaml", target)
        d = yaml.safe_load(prof.read_text())
        d["targets"][0]["fstype"] = "lustre"
        prof.write_text(yaml.safe_dump(d))
    else:
        prof = peers_profile(scratch / "p.yaml", target, **change)
    got = run_peers(target, scratch / "out", prof)
    assert got.returncode == 2, got.stderr
    assert "Traceback" not in got.stderr
    (line,) = got.stderr.strip().splitlines()
    assert line.startswith(f"peers: error: --tuned {prof}: ") and says in line, line
    assert not (scratch / "out").exists()  # nothing written
