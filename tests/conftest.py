"""Shared fixtures: scratch directories on a disk-backed filesystem, target sets, engines.

Scratch space lives under $CKPTBENCH_SCRATCH, else `<repo>/scratch/tests`, never /tmp: /tmp is
often tmpfs, which refuses O_DIRECT, and the O_DIRECT engines (cpu-single, gds) would all skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import engines
from bench.measure import results
from bench.storage import odirect

REPO = Path(__file__).resolve().parent.parent
# Tests parametrise over the registry: a new engine is tested by what its traits say it is.
ENGINES = tuple(engines.names())
STRIPED_ENGINES = tuple(e for e in ENGINES if engines.traits_of(e).stripes)
BASELINE_ENGINES = tuple(e for e in ENGINES if not engines.traits_of(e).stripes)
# The engines that can run on this machine (an optional library may be missing: DeepSpeed).
RUNNABLE = tuple(e for e in ENGINES if engines.unavailable(e) is None)
# Ceilings for tests that need some ceiling, not a ceiling study: small probes, one
# configuration (no search), one run.
QUICK_CEILINGS = {
    "min_bytes": "8MiB",
    "repetitions": 1,
    "direct_search": [[2, 8]],
    "buffered_jobs": [1],
    "probes": False,
}


def result_row(**cells: Any) -> results.Row:
    """A results.csv row of a made-up case (one 1 MiB tensor, one target), `cells` set."""
    case: dict[str, Any] = {
        "run_id": "r",
        "case_id": "c",
        "engine": "cpu-single",
        "device": "host-emulated",
        "emulated": True,
        "workload": "w",
        "total_bytes": 1 << 20,
        "tensor_bytes": 1 << 20,
        "n_tensors": 1,
        "n_targets": 1,
        "rep": 0,
        "warmup": False,
        "cache_dropped": False,
        "dtype": "float32",
        "options": "{}",
    }
    return results.Row(**(case | cells))


def scratch_base() -> Path:
    """The directory under which every test gets its own scratch directory (created)."""
    env = os.environ.get("CKPTBENCH_SCRATCH")
    base = Path(env) if env else REPO / "scratch" / "tests"
    base.mkdir(parents=True, exist_ok=True)
    return base


@pytest.fixture
def scratch(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh, empty directory on a disk-backed filesystem, removed after the test."""
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60] + "-"
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=scratch_base()))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def targets(scratch: Path) -> Callable[[int], list[str]]:
    """A factory: `targets(n)` makes n new, empty target directories and returns their paths.

    Each call makes a different set, so a test can compare two target lists.
    """
    made = 0

    def make(n: int) -> list[str]:
        nonlocal made
        made += 1
        out = []
        for i in range(n):
            d = scratch / f"set{made}" / f"t{i}"
            d.mkdir(parents=True)
            out.append(str(d))
        return out

    return make


def skip_without_odirect(engine: str, dirs: list[str]) -> None:
    """Skip the test, with the probe's reason, if `engine` needs O_DIRECT and a dir refuses it."""
    if not engines.traits_of(engine).o_direct:
        return
    for d in dirs:
        reason = odirect.probe(d)
        if reason:
            pytest.skip(f"{engine}: {reason}")


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Any]]:
    """A factory: `make_engine(name, targets, **options)`; skips where O_DIRECT is refused and
    closes every engine it made after the test."""
    made: list[Any] = []

    def make(name: str, dirs: list[str], **options: Any) -> Any:
        reason = engines.unavailable(name, options)
        if reason:
            pytest.skip(f"{name}: {reason}")
        skip_without_odirect(name, dirs)
        eng = engines.create(name, dirs, **options)
        made.append(eng)
        return eng

    yield make
    for eng in reversed(made):
        eng.close()


# -- helpers the test modules share (`from conftest import ...`) ---------------------------------


def bits(t: Any) -> Any:
    """A tensor's bytes in logical order, as a 1-D uint8 tensor on the host: NaNs compare as
    their bits, and a device or strided tensor as its values."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    """A flat state restored: the same keys in order, each tensor's dtype, shape and bytes."""
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(bits(got[k]), bits(want[k])), k


def read_manifest(dirs: list[str], name: str = "ckpt") -> dict[str, Any]:
    """A checkpoint's manifest as plain JSON (its last key is its own checksum)."""
    with open(Path(dirs[0]) / name / "manifest.json") as f:
        m = json.load(f)
    assert list(m)[-1] == "manifest_xxh3"
    return m


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Fake device memory (tests/fake_kvikio.py), seen as CUDA memory by the gds engine's
    seam; engines asking for device=cuda get a Device of kind cuda whose memory is the fake's."""
    from fake_kvikio import FakeCuda

    return FakeCuda().install(monkeypatch)


# --- report.md's shape (analysis.report): used wherever a test builds a report -----------------


def report_sections(md: str) -> dict[str, list[str]]:
    """report.md's `## ` sections: heading -> its blocks (Markdown paragraphs)."""
    out = {}
    for part in md.split("\n## ")[1:]:
        head, _, body = part.partition("\n")
        out[head] = [b.strip() for b in body.strip().split("\n\n") if b.strip()]
    return out


def assert_answers_first(md: str) -> None:
    """Every section but the appendix opens with its answer: one sentence (at most 60 words)
    with a number of the run in it, before any figure, table, list or quote."""
    from analysis.report.build import APPENDIX

    secs = report_sections(md)
    assert secs and all(a in secs for a in APPENDIX if a != "All columns"), list(secs)
    for head, blocks in secs.items():
        if head in APPENDIX:
            continue
        first = blocks[0]
        assert first[0] not in "|!>-*#`", f"{head}: opens with {first[:60]!r}"
        assert re.search(r"\d", first), f"{head}: no number in {first!r}"
        assert len(first.split()) <= 60, f"{head}: {len(first.split())} words: {first!r}"
        assert first.endswith(".") and not re.search(r"[.;:]\s+[A-Z][a-z]", first), (
            f"{head}: more than one sentence: {first!r}"
        )


def table_headers(md: str) -> list[str]:
    """Every column header of every table in `md`, in order."""
    lines = md.splitlines()
    out: list[str] = []
    for above, line in zip(lines, lines[1:], strict=False):
        if line.startswith("|---"):
            out += [c.strip() for c in re.split(r"(?<!\\)\|", above.strip())[1:-1]]
    return [h for h in out if h]


def assert_glossary_complete(md: str) -> None:
    """The Glossary defines every column named in the report's tables, and quotes the row
    types' docs of the results columns they are computed from."""
    from analysis.report.glossary import TERMS
    from bench.measure import columns

    glossary = md.split("\n## Glossary\n", 1)[1]
    assert "\n## " not in glossary  # the last section
    assert "(not defined)" not in glossary
    said = re.findall(r"^- \*\*(.+?)\*\*: ", glossary, re.M)
    assert set(table_headers(md.split("\n## Glossary\n")[0])) <= set(said)
    assert len(said) == len(set(said))
    docs = {c.name: c.doc for c in columns.columns(results.Row)}
    for h in said:
        for name in TERMS[h].of:
            if ":" not in name:
                assert f"- `{name}`: {docs[name]}" in glossary, name
