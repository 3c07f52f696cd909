"""The typed ceilings (bench.measure.ceilings): JSON round trips of every type; env.json as earlier
versions wrote it (the committed fixture runs) reads into the same numbers and efficiencies; every
kind of KINDS is measured, kept, judged and shown; and a kind declared in KINDS with its measurer
in bench.measure.ceilings.measure.MEASURERS, and nowhere else, goes through all of it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import runs, summary
from analysis.report.environment import env_rows
from bench.common import devices
from bench.common.traits import BUILTIN, Traits
from bench.measure.ceilings import (
    BUFFERED_WRITE,
    BUFFERED_WRITE_1,
    COPY,
    D2H,
    DIRECT_WRITE,
    KINDS,
    SERIALIZE,
    Ceilings,
    Count,
    Kind,
    Measured,
    Method,
    Probe,
    RunCeilings,
    Tried,
    Writers,
)
from bench.measure.ceilings import measure as ceiling_measure
from bench.measure.ceilings import types as ceiling_types
from bench.measure.efficiency import efficiency
from bench.storage import odirect

MiB = 1 << 20
FIX = Path(__file__).parent / "fixtures" / "runs"
# Before, after and probes: every block a run writes (ckptbench before typed ceilings).
DEFAULT = FIX / "20261205T113902Z-default-3518d9"
# The first version's ceilings: best values only, no runs, one O_DIRECT queue depth.
MULTI = FIX / "20261202T173015Z-multirank-dfbdb1"

# -- round trips -------------------------------------------------------------------------------

rates = st.one_of(
    st.integers(1, 10**12), st.floats(1.0, 1e12, allow_nan=False, allow_infinity=False)
)
counts_of = st.integers(1, 10**12)
writers = st.builds(Writers, st.integers(1, 64), st.integers(1, 64))
measured = st.builds(
    Measured,
    rates,
    st.lists(counts_of, max_size=5).map(tuple),
    st.none() | writers,
    st.lists(st.builds(Tried, writers, counts_of), max_size=4).map(tuple),
)


def kinds(storage: bool | None) -> st.SearchStrategy[dict[Kind, Measured]]:
    of = [k for k in KINDS if storage is None or k.storage == storage]
    return st.dictionaries(st.sampled_from(of), measured)


maybe_text = st.none() | st.text(max_size=12)
maybe_int = st.none() | st.integers(1, 1 << 40)
methods = st.builds(
    Method,
    tool=maybe_text,
    fio=maybe_text,
    fio_buffers=maybe_text,
    block_bytes=maybe_int,
    checkpoint_bytes=maybe_int,
    min_bytes=maybe_int,
    max_bytes=maybe_int,
    max_seconds=st.none() | st.floats(0.1, 1e3),
    repetitions=st.none() | st.integers(1, 9),
    copy_threads=st.none() | st.integers(1, 64),
    queue_depth=st.none() | st.integers(1, 64),
)
ceilings_ = st.builds(
    Ceilings,
    st.dictionaries(st.integers(1, 64), st.builds(Count, maybe_int, kinds(True)), max_size=3),
    kinds(False),
    methods,
)
probes = st.builds(
    Probe,
    st.integers(1, 64),
    kinds(None),
    maybe_int,
    maybe_text,
    st.none() | st.floats(0, 2e9),
    st.none() | st.floats(0, 1e3),
)
TRIES = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def through_json(d: dict[str, Any]) -> Any:
    return json.loads(json.dumps(d))


@TRIES
@given(ceilings_)
def test_ceilings_read_back_equal_from_their_json(c: Ceilings) -> None:
    assert Ceilings.from_json(through_json(c.to_json())) == c


@TRIES
@given(probes)
def test_a_probe_reads_back_equal_from_its_json(p: Probe) -> None:
    assert Probe.from_json(through_json(p.to_json())) == p


@TRIES
@given(st.none() | ceilings_, st.none() | ceilings_, st.lists(probes, max_size=3), maybe_text)
def test_a_runs_ceilings_read_back_equal_from_env_json(
    before: Ceilings | None, after: Ceilings | None, probed: list[Probe], error: str | None
) -> None:
    """As the sweep writes them into env.json, each at its time (an empty block is none)."""
    env: dict[str, Any] = {"ceilings_probes": [p.to_json() for p in probed]}
    if before is not None:
        env["ceilings"] = before.to_json()
    if after is not None:
        env["ceilings_after"] = after.to_json()
    if error is not None:
        env["ceilings_error"] = error
    got = RunCeilings.from_env(through_json(env))
    none = Ceilings.from_json({})
    assert got.before == (None if before in (None, none) else before)
    assert got.after == (None if after in (None, none) else after)
    assert got.probes == tuple(probed) and got.error == error


# -- env.json as earlier versions wrote it --------------------------------------------------------


def _medians(d: Any) -> Any:
    """`d` without the `*_median_Bps` keys (derived from the runs beside them, not written again)."""
    if isinstance(d, dict):
        return {k: _medians(v) for k, v in d.items() if not k.endswith("_median_Bps")}
    return d


@pytest.mark.parametrize("run", [DEFAULT, MULTI], ids=lambda p: p.name)
def test_the_fixtures_env_json_is_written_again_as_it_was(run: Path) -> None:
    """Every ceilings block of the fixture runs reads into the types and writes back the same
    JSON, key for key and number for number, but for the medians beside the runs, which are
    derived again from those runs (to within their rounding to whole B/s)."""
    env = json.loads((run / "env.json").read_text())
    got = RunCeilings.from_env(env)
    pairs: list[tuple[Any, Any]] = [(got.before, env["ceilings"])]
    if "ceilings_after" in env:
        pairs.append((got.after, env["ceilings_after"]))
    pairs += list(zip(got.probes, env.get("ceilings_probes", []), strict=True))
    for typed, raw in pairs:
        assert typed is not None
        assert typed.to_json() == _medians(raw)
    for typed, raw in pairs[:2]:
        for n, block in raw["per_ssd_count"].items():
            for kind in (DIRECT_WRITE, BUFFERED_WRITE):
                median = block.get(f"{kind.name}_median_Bps")
                if median is not None:
                    assert typed.at(kind, int(n)).median() == pytest.approx(median, abs=1)


def test_the_fixtures_ceilings_read_into_the_same_numbers() -> None:
    before, after, first = _default()
    # the best of the runs and of the search's run of the configuration kept
    assert before.at(DIRECT_WRITE, 1).Bps == 2418337441.4414415
    assert before.at(BUFFERED_WRITE, 1).Bps == 1458888348
    assert before.at(BUFFERED_WRITE, 1).median() == 1162058251
    assert before.at(BUFFERED_WRITE, 1).writers == Writers(1, 1)
    assert [t.Bps for t in before.at(DIRECT_WRITE, 1).search] == [
        1731841652,
        2200290623,
        2147483648,
        2182402081,
    ]
    # the search kept one writer: the one-writer ceiling is that very measurement
    assert before.at(BUFFERED_WRITE_1, 1) is before.at(BUFFERED_WRITE, 1)
    assert BUFFERED_WRITE_1 not in before.counts[1].kinds  # derived, not written
    assert before.at(COPY).Bps == 4949753837.590082 and before.at(COPY).median() == 4790068637
    assert before.at(SERIALIZE).median() == 1497790710 and before.at(D2H) is None
    assert before.method == Method(
        tool="fio-3.33",
        fio="fio-3.33",
        fio_buffers="transparent huge pages (glibc.malloc.hugetlb=1)",
        block_bytes=16 << 20,
        checkpoint_bytes=256 << 20,
        min_bytes=256 << 20,
        repetitions=1,
        copy_threads=2,
    )
    assert after.at(DIRECT_WRITE, 1).Bps == 2684354560.0 and after.at(DIRECT_WRITE, 1).search == ()
    # a probe: the best of its runs, the copy without its runs (a median, as it was taken)
    assert first.workload == "synthetic-256MiB-1MiB" and first.n_targets == 1
    assert first.at(BUFFERED_WRITE_1).runs == (1137438373, 1328888396)
    assert first.at(COPY) == Measured(4468127021.0)
    # The first version's: values only.
    multi = RunCeilings.from_env(json.loads((MULTI / "env.json").read_text()))
    assert multi.before is not None and multi.after is None and multi.probes == ()
    assert multi.before.at(DIRECT_WRITE, 2) == Measured(1617081060.2409637)
    assert multi.before.at(DIRECT_WRITE, 2).median() == 1617081060.2409637
    assert multi.before.at(BUFFERED_WRITE_1, 2) is None  # no search, no configuration
    assert multi.before.method.queue_depth == 8 and multi.before.method.repetitions is None


def _default() -> tuple[Ceilings, Ceilings, Probe]:
    got = RunCeilings.from_env(json.loads((DEFAULT / "env.json").read_text()))
    assert got.before is not None and got.after is not None and len(got.probes) == 4
    return got.before, got.after, got.probes[0]


def test_the_best_of_a_fixture_run_is_each_kinds_best() -> None:
    got = RunCeilings.from_env(json.loads((DEFAULT / "env.json").read_text()))
    best = got.best()
    assert best is not None
    for kind in (DIRECT_WRITE, BUFFERED_WRITE, COPY):
        values = [c.at(kind, 1) for c in (got.before, got.after)]
        values += [p.at(kind) for p in got.probes]
        assert best.at(kind, 1).Bps == max(m.Bps for m in values if m is not None)
    assert best.at(DIRECT_WRITE, 1).Bps == 2739137306  # a probe's
    assert best.at(COPY).Bps == 13658527670.0  # the last probe's (a median of its runs)


def test_the_fixture_runs_efficiencies_are_those_their_version_wrote() -> None:
    """The default fixture's results.csv was judged by the version before typed ceilings, at the
    end of its sweep, against the best of its ceilings: the typed ceilings judge every row the
    same. The multi-rank fixture (from before efficiency columns) against its one block, whose
    values are written here."""
    run = runs.load(str(DEFAULT))
    got = runs.add_efficiencies(run.rows, run.env)
    for mine, theirs in (
        ("write_eff", "write_efficiency"),
        ("snapshot_eff", "snapshot_efficiency"),
    ):
        written = pd.to_numeric(run.rows[theirs]).to_numpy(float)
        assert np.array_equal(got[mine].to_numpy(float), written, equal_nan=True), mine
    assert got["write_eff"].notna().all() and got["snapshot_eff"].notna().any()

    multi = runs.load(str(MULTI))
    got = runs.add_efficiencies(multi.rows, multi.env)
    ceiling_of = {"direct": 1617081060.2409637, "page cache": 555766989.6480331}
    effs = zip(got["write_eff"], got["snapshot_eff"], strict=True)
    for r, (w, s) in zip(multi.rows.to_dict("records"), effs, strict=True):
        t = BUILTIN[r["engine"]]
        bound = ceiling_of["page cache" if t.page_cache else "direct"]
        assert w == round(r["total_bytes"] / r["total_s"] / bound, 4)
        if t.stall == "snapshot" and not t.from_device:
            assert s == round(r["total_bytes"] / r["stall_s"] / 19500338305.069084, 4)
        else:
            assert math.isnan(s)


# -- every kind, and a new one -------------------------------------------------------------------


def test_every_kind_has_one_name_its_own_keys_and_a_measurer() -> None:
    assert set(ceiling_measure.MEASURERS) == set(KINDS)
    assert len({k.name for k in KINDS}) == len({k.label for k in KINDS}) == len(KINDS)
    keys = [
        key
        for k in KINDS
        for key in Measured(1.0, (1,), Writers(1), (Tried(Writers(1), 1),)).to_json(k.name)
    ]
    fields = [f.name for f in dataclasses.fields(Method)] + ["per_ssd_count", "file_bytes"]
    assert len(set(keys)) == len(keys) == 4 * len(KINDS) and not set(keys) & set(fields)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_kind_is_kept_judged_shown_and_checked_for_drift(kind: Kind) -> None:
    """One kind alone measured before and after the sweep (half as fast after): env.json keeps
    it, the run's best is its best, the summary and the report name it, a storage kind's move is
    a drift, and a kind that judges is the ceiling of the engines it fits."""
    m, half = Measured(2e9, (2e9, 1.8e9), Writers(2, 4)), Measured(1e9, (1e9,))

    def alone(x: Measured) -> Ceilings:
        if kind.storage:
            return Ceilings({1: Count(MiB, {kind: x})}, method=Method(tool="builtin"))
        return Ceilings(host={kind: x}, method=Method(tool="builtin"))

    before, after = alone(m), alone(half)
    env = through_json({"ceilings": before.to_json(), "ceilings_after": after.to_json()})
    got = RunCeilings.from_env(env)
    assert got.before == before and got.after == after
    best = got.best()
    assert best is not None and best.at(kind, 1) == m
    lines = summary.ceiling_lines(env)
    assert any(f"{kind.label} 2.00 / 1.00 GB/s" in ln for ln in lines), lines
    (report,) = [v for k, v in env_rows(env) if k == "device ceilings"]
    workers = "reader" if kind.reads else "writer"
    assert f"{kind.label} 2.00 GB/s (runs 2.00 1.80 GB/s, 2 {workers}(s), depth 4)" in report
    moved = (
        f"{kind.name.replace('_', ' ')} ceiling of 1 target(s) moved from 2.00 GB/s before the "
        "sweep to 1.00 GB/s after"
    )
    assert before.drift(after) == ([moved] if kind.storage else [])
    if kind.judges is None:
        return
    fitting = [t for t in BUILTIN.values() if kind.fits(t)]
    assert fitting, f"{kind.name} judges no built-in engine"
    for t in fitting:
        assert best.bound(kind.judges, t, 1) == 2e9
    for t in BUILTIN.values():
        if not kind.fits(t):
            assert best.bound(kind.judges, t, 1) is None


def test_a_snapshot_is_judged_against_the_device_to_host_copy_where_there_is_one() -> None:
    both = Ceilings(host={COPY: Measured(10e9), D2H: Measured(20e9)})
    single = BUILTIN["cpu-single"]
    assert both.bound("snapshot", single, 1) == 20e9
    assert Ceilings(host={COPY: Measured(10e9)}).bound("snapshot", single, 1) == 10e9
    assert both.bound("snapshot", BUILTIN["gds"], 1) is None  # no snapshot: it reads the device


def _dirs(scratch: Path, n: int) -> list[str]:
    out = []
    for i in range(n):
        d = scratch / f"t{i}"
        d.mkdir()
        out.append(str(d))
    reason = odirect.probe(out[0])
    if reason:
        pytest.skip(f"scratch refuses O_DIRECT: {reason}")
    return out


def test_a_kind_declared_in_one_place_is_measured_kept_judged_and_shown(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new kind (here a planted read of n targets, judging the write of the engines that read
    device memory themselves) declared as an entry of KINDS, and its measurer an entry of
    MEASURERS, with no other edit: the ceilings before and after the sweep and the probe measure
    it (its configuration chosen before is measured again), env.json keeps it, the run's best and
    drift take it in, gds rows are judged against it (cpu-single's still against O_DIRECT
    writes), and the summary and the report show it."""

    def reads_device(t: Traits) -> bool:
        return t.from_device

    read = Kind("planted_read", "planted read", True, "write", reads_device)
    monkeypatch.setattr(ceiling_types, "KINDS", (read, *KINDS))
    seen: list[tuple[int, bool, Writers | None]] = []
    speed = {"per target": 3e9}

    def measure_read(s: ceiling_measure.Session, got: Any) -> Measured:
        seen.append((len(s.targets), s.probe, s.chosen.get(read)))
        rate = speed["per target"] * len(s.targets)
        return Measured.best_of([rate, 0.9 * rate], s.chosen.get(read) or Writers(1, 4))

    monkeypatch.setitem(ceiling_measure.MEASURERS, read, measure_read)
    dirs = _dirs(scratch, 2)
    host = devices.detect("host-emulated")
    quick = ceiling_measure.Options(
        targets=dirs,
        ssd_counts=[1, 2],
        checkpoint_bytes=8 * MiB,
        block=MiB,
        device=host,
        use_fio=False,
        repetitions=1,
        min_bytes=8 * MiB,
        tensor_bytes=MiB,
        grids={DIRECT_WRITE: [(1, 2)], BUFFERED_WRITE: [(1, 1)]},
    )
    before = ceiling_measure.measure(quick)
    speed["per target"] = 1.5e9
    after = ceiling_measure.measure(dataclasses.replace(quick, configs=before.chosen()))
    speed["per target"] = 4e9
    probe = ceiling_measure.probe(dirs, 8 * MiB, MiB, host, before.chosen()[2], use_fio=False)
    assert seen == [
        (1, False, None),
        (2, False, None),
        (1, False, Writers(1, 4)),
        (2, False, Writers(1, 4)),
        (2, True, Writers(1, 4)),
    ]
    text = json.dumps(
        {
            "ceilings": before.to_json(),
            "ceilings_after": after.to_json(),
            "ceilings_probes": [probe.to_json()],
        }
    )
    env = json.loads(text)
    assert env["ceilings"]["per_ssd_count"]["2"]["planted_read_Bps"] == 6e9
    assert env["ceilings_probes"][0]["planted_read_runs"] == [8_000_000_000, 7_200_000_000]
    got = RunCeilings.from_env(env)
    assert (got.before, got.after, got.probes) == (before, after, (probe,))
    best = got.best()
    assert best is not None
    assert (best.at(read, 1).Bps, best.at(read, 2).Bps) == (3e9, 8e9)  # before's, the probe's
    assert (
        "planted read ceiling of 1 target(s) moved from 3.00 GB/s before the sweep to "
        "1.50 GB/s after"
    ) in before.drift(after)
    row = {"n_targets": 2, "total_bytes": 4e9, "total_s": 1.0, "stall_s": 0.5}
    assert efficiency(row, best, BUILTIN["gds"]) == (0.5, None)
    direct = best.at(DIRECT_WRITE, 2).Bps
    assert efficiency(row, best, BUILTIN["cpu-single"])[0] == round(4e9 / direct, 4)
    lines = summary.ceiling_lines(env)
    assert any(
        ln.startswith("  1 target(s): planted read 3.00 / 1.50 GB/s (1 writer(s), depth 4), ")
        for ln in lines
    ), lines
    (report,) = [v for k, v in env_rows(env) if k == "device ceilings"]
    assert (
        "2 target(s): planted read 6.00 GB/s (runs 6.00 5.40 GB/s, 1 writer(s), depth 4)" in report
    )
