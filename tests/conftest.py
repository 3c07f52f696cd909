"""Shared fixtures: scratch directories on a disk-backed filesystem, target sets, engines, and the
gds engine over fake kvikio and fake CUDA (tests/fake_kvikio.py).

Scratch space lives under $CKPTBENCH_SCRATCH, else `<repo>/scratch/tests`, never /tmp: /tmp is
often tmpfs, which refuses O_DIRECT, and the O_DIRECT engines (cpu-single, gds) would all skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_kvikio import FakeCuda, FakeCudart, FakeKvikio

from bench import engines
from bench.common.devices import Device
from bench.engines import gds
from bench.measure import results
from bench.storage import odirect, staging

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


# The host's idle baseline (the config's `host_baseline_s`) for sweeps whose host-cost figures
# the test does not read: 2 x 0.05 s instead of 2 x 0.5 s a sweep. tests/test_hostcost.py runs
# its sweeps with the real one.
QUICK_BASELINE_S = 0.05


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


# -- the gds engine over fake kvikio and fake CUDA (tests/test_gds_*.py) --------------------------

# A CUDA Device whose memory is the host's: the gds engine's device branches run under the fakes.
FAKE_CUDA_DEVICE = Device("cuda", torch.device("cpu"))


@pytest.fixture
def fake_kvikio(monkeypatch, tmp_path, fake_cuda) -> Iterator[Callable[..., FakeKvikio]]:
    """`fake_kvikio(**knobs)` makes `import kvikio` import a FakeKvikio and returns it; its
    nvidia-fs statistics are a file the engine is pointed at (`nvfs_stats=None`: no driver
    statistics at all)."""
    made: list[FakeKvikio] = []

    def install(**kw: Any) -> FakeKvikio:
        kw.setdefault("allocation_of", fake_cuda.allocation_of)
        kw.setdefault("nvfs_stats", str(tmp_path / f"nvidia-fs-stats-{len(made)}"))
        fake = FakeKvikio(**kw).install(monkeypatch)
        monkeypatch.setattr(gds.labels, "NVFS_STATS", kw["nvfs_stats"] or str(tmp_path / "absent"))
        made.append(fake)
        return fake

    yield install
    for fake in made:
        fake.uninstall()


class _Refuse:
    """A meta-path finder for `kvikio` that fails the way a machine without it (or without the
    libraries it loads) does."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] == "kvikio":
            raise self.error
        return None


@pytest.fixture
def no_kvikio(monkeypatch) -> Callable[[BaseException | None], None]:
    """`no_kvikio(error)`: `import kvikio` raises `error` (default: not installed)."""

    def install(error: BaseException | None = None) -> None:
        for name in list(sys.modules):
            if name.split(".")[0] in ("kvikio", "libkvikio"):
                monkeypatch.delitem(sys.modules, name)
        err = error or ModuleNotFoundError("No module named 'kvikio'", name="kvikio")
        monkeypatch.setattr(sys, "meta_path", [_Refuse(err), *sys.meta_path])

    return install


@pytest.fixture
def fake_cudart(monkeypatch) -> FakeCudart:
    rt = FakeCudart()
    monkeypatch.setattr(staging, "cudart", lambda: rt)
    return rt


def sample_state() -> dict[str, torch.Tensor]:
    """A small host state of awkward tensors: strided, bfloat16, an unaligned view, a scalar,
    an empty one."""
    g = torch.Generator().manual_seed(0)
    flat = torch.randint(-(2**40), 2**40, (6000,), generator=g)
    return {
        "w": torch.randn(96, 80, generator=g),
        "wt": torch.randn(40, 70, generator=g).t(),  # non-contiguous: copied first
        "half": torch.randn(4097, generator=g).to(torch.bfloat16),
        "offset_view": flat[3:5003],  # contiguous, unaligned start
        "step": torch.tensor(7.0),  # an optimizer's step: stays on the host
        "empty": torch.empty(0, 3),
    }


def mixed_state(cuda: FakeCuda) -> dict[str, torch.Tensor]:
    """The sample state in fake device memory, but for `step`, which stays on the host."""
    return cuda.to_device(sample_state(), keep_on_host=("step",))


def kvikio_engine(make_engine: Any, dirs: list[str], **opts: Any) -> Any:
    """gds through the fake kvikio; each tensor written from its own memory unless the test
    turns coalescing on (test_coalesced_*)."""
    opts = {"io": "kvikio", "device": "cuda", "chunk_bytes": "8KiB", "coalesce_below": 0, **opts}
    return make_engine("gds", dirs, **opts)


def data_files(dirs: list[str], m: dict[str, Any], name: str = "ckpt") -> dict[int, str]:
    return {int(t): os.path.join(dirs[int(t)], name, i["file"]) for t, i in m["files"].items()}


# -- the committed default run the analysis tests read (tests/test_analysis_*.py) ----------------

# A trimmed real default run (host-emulated), committed under tests/fixtures/runs.
DEFAULT_RUN = REPO / "tests" / "fixtures" / "runs" / "20261202T160516Z-default-b10c3b"


@pytest.fixture(scope="session")
def default_report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """DEFAULT_RUN's report (analysis.report.build.Report), built once for the whole test run:
    a build draws every figure as PNG and PDF, and several test files read the same report."""
    from analysis.report.build import build

    return build(str(DEFAULT_RUN), str(tmp_path_factory.mktemp("default-report")))


# The test files that take longest, longest first (pytest --durations, summed per file). `make
# test` runs the files in parallel, one file per worker at a time, in collection order: started
# last, one of them would leave a worker busy alone at the end.
LONGEST_FIRST = (
    "test_gpu_check.py",
    "test_hosts.py",
    "test_cli.py",
    "test_distributed.py",
    "test_mlperf.py",
    "test_faults.py",
    "test_crash.py",
    "test_training.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (LONGEST_FIRST); within a file, and among the others, the
    order pytest found."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
