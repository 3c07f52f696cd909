"""The typed ceilings (bench.measure.ceilings): JSON round trips of every type; env.json as earlier
versions wrote it (the committed fixture runs) reads into the same numbers and efficiencies."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import runs
from bench.common.traits import BUILTIN
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
