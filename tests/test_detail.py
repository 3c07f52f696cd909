"""bench.measure.detail: what an engine reports beyond the row's columns, typed: every kind
round-trips through the row's io_detail JSON, rows written before `kind` was read back by
their keys (as the committed fixture runs hold them), and every engine's save reports the kind
its data path has."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench.measure import detail

FIXTURES = Path(__file__).parent / "fixtures" / "runs"

SAMPLES = [
    detail.SnapshotDetail(copy_s=0.012, overlap=True),
    detail.SnapshotDetail(copy_s=0.5, staging_is_pinned=True, torch_host_allocator={"a": 1}),
    detail.GdsDetail(io="emulated", device_bytes=7, coalesced_tensors=3, coalesced_bytes=12),
    detail.GdsDetail(
        io="kvikio",
        kvikio="26.10",
        num_threads=4,
        task_size=1 << 20,
        gds_threshold=0,
        files=2,
        host_bytes=4,
        registered_bytes=1 << 30,
        unregistered_device_bytes=0,
        checksum="wsum64 on the device",
        gds_evidence="nvidia-fs counted 1 MiB",
        compat_reasons=["one", "two"],
    ),
    detail.DcpDetail(staging="cached", checkpointer="thread"),
    detail.FastPersistDetail(block_bytes=1, queue_depth=2, threads=3, buffer_bytes=4),
    detail.NixlDetail(
        backend="POSIX/URING",
        nixl="1.5.1",
        request_bytes=1 << 20,
        batch=8,
        buffer_bytes=16 << 20,
        requests=3,
        descriptors=24,
        copy_s=0.01,
        post_s=0.002,
        poll_s=0.05,
        fsync_s=0.004,
    ),
]


@pytest.mark.parametrize("d", SAMPLES, ids=lambda d: d.kind)
def test_every_kind_round_trips_through_the_rows_json(d: detail.Detail) -> None:
    text = detail.dumps(d)
    back = detail.read(text)
    assert back == d and type(back) is type(d)
    got = json.loads(text)
    assert got["kind"] == d.kind and None not in got.values()  # None fields are left out


def test_no_detail_is_an_empty_cell() -> None:
    assert detail.dumps(None) == "" and detail.read("") is None and detail.read(None) is None
    assert detail.read('{"something": 1}') is None  # of no kind known


def test_the_rows_of_older_runs_read_by_their_keys() -> None:
    """Rows written before `kind`: the committed fixture runs' io_detail, each engine's."""
    kinds = {}
    for path in sorted(FIXTURES.glob("*/results.csv")):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r.get("io_detail"):
                    got = detail.read(r["io_detail"])
                    assert got is not None, r["io_detail"]
                    kinds.setdefault(r["engine"], set()).add(got.kind)
    assert kinds == {
        "gds": {"gds"},
        "cpu-single": {"snapshot"},
        "cpu-double": {"snapshot"},
        "dcp": {"dcp"},
    }
    old = detail.read('{"checkpointer": "thread", "staging": "cached"}')
    assert old == detail.DcpDetail(staging="cached", checkpointer="thread")
    assert detail.read('{"device_bytes": 0, "io": "emulated"}') == detail.GdsDetail()


def test_every_kind_is_readable_by_its_name() -> None:
    """A new kind is one class here: listed in KINDS, its JSON says its kind."""
    assert set(detail.KINDS) == {d.kind for d in SAMPLES}
    for kind, cls in detail.KINDS.items():
        assert cls.kind == kind and detail.read(json.dumps({"kind": kind})) == cls()
