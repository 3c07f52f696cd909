"""Hot paths of a checkpoint, timed one at a time with pytest-benchmark (`make perf`).

- snapshot copy: the state's tensors copied into a warm staging buffer, as the plain snapshot
  does (bench.engines.snapshot.plain; the whole stall of cpu-single and cpu-double);
- O_DIRECT write of one 16 MiB chunk with bench.storage.layout.write_piece, aligned (the packed layout)
  and unaligned (the direct layout: head and tail blocks through a bounce buffer); write+fsync
  of 64 MiB, O_DIRECT and buffered;
- checksum: bench.storage.checksums.checksum (xxh3) over 64 MiB;
- manifest commit: bench.storage.manifest.commit of a 1000-tensor manifest (temp file, fsync, rename,
  fsync of the directory), and its JSON serialisation alone.

Every buffer holds random bytes (zero pages would flatter copies and storage). Each benchmark
runs a fixed number of warm-up rounds and rounds (benchmark.pedantic), so the whole file takes
well under a minute on 2 cores. On a machine with a GPU, the snapshot copy runs device-to-pinned
as on the real path; elsewhere host-to-host (host-emulated). After pytest-benchmark's timing
table, a second table gives each benchmark's throughput in GB/s.

This file is named bench_*.py so that the default collection (`test_*.py`, `make test`) skips
it; `make perf` collects it with `-o python_files='bench_*.py'`. Its fixtures live here, and
what it shares with bench_per_tensor.py (scratch directories, the summary tables' plugin) in
perf_common.py, not in a tests/perf/conftest.py: a second module named `conftest` would shadow
tests/conftest.py for the tests that `from conftest import ...`.

Scratch files go to `$CKPTBENCH_SCRATCH/perf`, else `<repo>/scratch/perf`, never /tmp: /tmp is
often tmpfs, which refuses O_DIRECT.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from perf_common import SummaryTable, scratch_dir

from bench.common.devices import Device, detect
from bench.storage import checksums, generations, layout, manifest, odirect
from bench.storage.staging import Staging
from bench.storage.tree import flatten
from bench.workloads import fill_random, synthetic_state

MiB = 1 << 20
CHUNK = 16 * MiB  # StripedOptions.chunk_bytes default
SNAPSHOT_BYTES = 256 * MiB
WRITE_FSYNC_BYTES = 64 * MiB
CHECKSUM_BYTES = 64 * MiB
UNALIGNED_AT = 1000  # a tensor address 1000 bytes past a 4 KiB boundary (direct layout)


# -- scratch space and the throughput table -----------------------------------------------------


@pytest.fixture(scope="session")
def perf_scratch() -> Iterator[Path]:
    """A fresh directory on a disk-backed filesystem for this session, removed afterwards."""
    d = scratch_dir("run-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def odirect_dir(perf_scratch: Path) -> Path:
    """The scratch directory, or a skip with the probe's reason where it refuses O_DIRECT."""
    reason = odirect.probe(str(perf_scratch))
    if reason:
        pytest.skip(reason)
    return perf_scratch


class _ThroughputTable(SummaryTable):
    """Bytes per round over time per round: (group, name, bytes moved per round, median, min)."""

    def write(self, tr: Any) -> None:
        tr.write_sep("-", "throughput: bytes per round / time per round (GB/s = 1e9 B/s)")
        gw = max(len(r[0]) for r in self.rows)
        nw = max(len(r[1]) for r in self.rows)
        tr.write_line(
            f"{'group':<{gw}}  {'name':<{nw}}  {'bytes':>8}  {'median':>9}  "
            f"{'GB/s median':>11}  {'GB/s best':>9}"
        )
        for group, name, nbytes, median, best in self.rows:
            size = f"{nbytes / 2**20:,.0f}MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:,.0f}KiB"
            tr.write_line(
                f"{group:<{gw}}  {name:<{nw}}  {size:>8}  {median * 1e3:>6.2f} ms  "
                f"{nbytes / median / 1e9:>11.2f}  {nbytes / best / 1e9:>9.2f}"
            )


@pytest.fixture(scope="session")
def _throughput_table(pytestconfig: pytest.Config) -> _ThroughputTable:
    return _ThroughputTable().register(pytestconfig, "ckptbench-perf-throughput")


@pytest.fixture
def record_throughput(_throughput_table: _ThroughputTable) -> Callable[[Any, int], None]:
    """`record_throughput(benchmark, nbytes)` after a benchmark: `nbytes` moved per round.

    Stores bytes and GB/s (1e9 bytes/s) of the median and of the fastest round in the
    benchmark's extra_info, which is saved with the run, and lists them in the summary.
    """

    def record(benchmark: Any, nbytes: int) -> None:
        benchmark.extra_info["bytes"] = nbytes
        if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
            return
        median, best = benchmark.stats.stats.median, benchmark.stats.stats.min
        benchmark.extra_info["gb_per_s_median"] = round(nbytes / median / 1e9, 3)
        benchmark.extra_info["gb_per_s_best"] = round(nbytes / best / 1e9, 3)
        _throughput_table.rows.append((benchmark.group or "", benchmark.name, nbytes, median, best))

    return record


# -- helpers ------------------------------------------------------------------------------------


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.Generator(np.random.SFC64(seed))


def _random_host_buffer(nbytes: int, seed: int) -> odirect.HostBuffer:
    """A pre-faulted, page-aligned buffer full of random bytes."""
    buf = odirect.HostBuffer(nbytes, prefault=True)
    fill_random(torch.from_numpy(buf.array), _rng(seed))
    return buf


# -- snapshot copy ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device() -> Device:
    return detect("auto")


@pytest.fixture(scope="module")
def staging(device: Device) -> Iterator[Staging]:
    """One warm (pre-faulted or pinned) staging buffer, shared by every snapshot case."""
    s = Staging(device)
    s.ensure(SNAPSHOT_BYTES + 1024 * layout.TENSOR_ALIGN)
    yield s
    s.release()


def _snapshot(
    staging: torch.Tensor,
    tensors: list[tuple[str, torch.Tensor]],
    entries: list[manifest.TensorEntry],
    offsets: list[int],
    device: Device,
) -> None:
    """The copy loop of a plain snapshot: a typed view of staging per tensor, copy_, sync."""
    for (_, t), e, off in zip(tensors, entries, offsets, strict=True):
        if e.nbytes:
            dst = staging[off : off + e.nbytes].view(t.dtype).view(t.shape)
            dst.copy_(t, non_blocking=True)
    device.synchronize()


@pytest.fixture(scope="module")
def snapshot_state(device: Device) -> Callable[[int], dict[str, torch.Tensor]]:
    """`snapshot_state(tensor_bytes)`: a random 256 MiB state on `device`, made once per size."""
    made: dict[int, dict[str, torch.Tensor]] = {}

    def get(tensor_bytes: int) -> dict[str, torch.Tensor]:
        if tensor_bytes not in made:
            made[tensor_bytes] = synthetic_state(
                SNAPSHOT_BYTES, tensor_bytes, device=device.torch_device
            )
        return made[tensor_bytes]

    return get


@pytest.mark.benchmark(group="snapshot copy")
@pytest.mark.parametrize(
    "tensor_bytes",
    [SNAPSHOT_BYTES, 4 * MiB, 256 * 1024],
    ids=["1x256MiB", "64x4MiB", "1024x256KiB"],
)
@pytest.mark.parametrize("torch_threads", [0, 1], ids=["threads=all", "threads=1"])
def test_snapshot_copy(
    benchmark: Any,
    record_throughput: Callable[[Any, int], None],
    staging: Staging,
    device: Device,
    snapshot_state: Callable[[int], dict[str, torch.Tensor]],
    tensor_bytes: int,
    torch_threads: int,
) -> None:
    """The stall of a snapshot engine. `threads=all` runs as the engine does (torch's default
    intra-op threads, one per core); `threads=1` copies each tensor on one thread, which shows
    how much of the time, and of its spread on a busy host, comes from torch's parallel copy."""
    _, tensors = flatten(snapshot_state(tensor_bytes))
    entries = [manifest.tensor_entry(p, t) for p, t in tensors]
    offsets, used = layout.pack_offsets(entries)
    assert not staging.ensure(used), "staging must already be large enough (warm)"
    benchmark.extra_info.update(
        tensors=len(tensors), device=device.kind, torch_threads=torch_threads or "all"
    )
    default_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads or default_threads)
    try:
        benchmark.pedantic(
            _snapshot,
            args=(staging.tensor, tensors, entries, offsets, device),
            rounds=15,
            warmup_rounds=3,
        )
    finally:
        torch.set_num_threads(default_threads)
    record_throughput(benchmark, SNAPSHOT_BYTES)
    for (_, t), e, off in zip(tensors, entries, offsets, strict=True):
        # Bytes, not values: random bits include NaNs, which never compare equal.
        got = staging.tensor[off : off + e.nbytes].cpu()
        assert torch.equal(got, t.reshape(-1).view(torch.uint8).cpu()), "snapshot differs"


# -- aligned I/O --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source() -> Iterator[odirect.HostBuffer]:
    """64 MiB (and a block to spare for the unaligned case) of random bytes, pre-faulted."""
    buf = _random_host_buffer(WRITE_FSYNC_BYTES + odirect.ALIGN, seed=1)
    yield buf
    buf.close()


def _open_data_file(directory: Path, o_direct: bool) -> tuple[int, Path]:
    """A new data file opened as the striped engines' writer opens one (StripeWriter.open)."""
    path = directory / f"data-{uuid.uuid4().hex}.bin"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if o_direct else 0)
    return os.open(path, flags, 0o644), path


@pytest.fixture
def odirect_fd(odirect_dir: Path) -> Iterator[int]:
    fd, path = _open_data_file(odirect_dir, o_direct=True)
    yield fd
    os.close(fd)
    path.unlink()


@pytest.mark.benchmark(group="O_DIRECT write 16MiB")
@pytest.mark.parametrize("at", [0, UNALIGNED_AT], ids=["aligned", "unaligned"])
def test_odirect_write_chunk(
    benchmark: Any,
    record_throughput: Callable[[Any, int], None],
    source: odirect.HostBuffer,
    odirect_fd: int,
    at: int,
) -> None:
    """One chunk, no fsync. Each round writes into an emptied file (blocks are allocated anew,
    as in a real save, whose data files are new); the truncation is not timed."""
    piece = layout.Piece(target=0, file_offset=at, mem=source.array, start=at, length=CHUNK)
    benchmark.extra_info["bounced_bytes"] = (
        0 if at == 0 else (odirect.ALIGN - at) + (CHUNK - (odirect.ALIGN - at)) % odirect.ALIGN
    )
    benchmark.pedantic(
        layout.write_piece,
        args=(odirect_fd, piece, True),
        setup=lambda: os.ftruncate(odirect_fd, 0),
        rounds=15,
        warmup_rounds=2,
    )
    record_throughput(benchmark, CHUNK)
    assert os.fstat(odirect_fd).st_size == odirect.align_up(at + CHUNK)


@pytest.mark.benchmark(group="write+fsync 64MiB")
@pytest.mark.parametrize("o_direct", [True, False], ids=["O_DIRECT", "buffered"])
def test_write_fsync(
    benchmark: Any,
    record_throughput: Callable[[Any, int], None],
    source: odirect.HostBuffer,
    perf_scratch: Path,
    o_direct: bool,
) -> None:
    """The persist of one target's file: 16 MiB chunks of the packed layout, then fsync.

    Written one chunk after another from one thread (the engine uses threads_per_target=2).
    """
    directory = perf_scratch
    if o_direct:
        reason = odirect.probe(str(perf_scratch))
        if reason:
            pytest.skip(reason)
    entry = manifest.TensorEntry("['w']", "uint8", [WRITE_FSYNC_BYTES], WRITE_FSYNC_BYTES)
    pieces, file_bytes = layout.packed(
        source.array, WRITE_FSYNC_BYTES, [entry], [0], n_targets=1, chunk=CHUNK
    )
    assert len(pieces) == WRITE_FSYNC_BYTES // CHUNK
    fd, path = _open_data_file(directory, o_direct)

    def write_and_fsync() -> None:
        for p in pieces:
            layout.write_piece(fd, p, o_direct)
        os.fsync(fd)

    try:
        benchmark.pedantic(
            write_and_fsync, setup=lambda: os.ftruncate(fd, 0), rounds=6, warmup_rounds=1
        )
        assert os.fstat(fd).st_size == file_bytes[0]
    finally:
        os.close(fd)
        path.unlink()
    record_throughput(benchmark, WRITE_FSYNC_BYTES)


# -- checksum -----------------------------------------------------------------------------------


@pytest.mark.benchmark(group="checksum")
def test_checksum(benchmark: Any, record_throughput: Callable[[Any, int], None]) -> None:
    buf = _random_host_buffer(CHECKSUM_BYTES, seed=2)
    try:
        digest = benchmark.pedantic(
            checksums.checksum, args=(buf.array,), rounds=20, warmup_rounds=2
        )
        assert digest == checksums.checksum(bytes(buf.array))
    finally:
        buf.close()
    record_throughput(benchmark, CHECKSUM_BYTES)


# -- manifest commit ----------------------------------------------------------------------------


def _model_like_manifest(targets: list[str], n_params: int = 250) -> manifest.Manifest:
    """A manifest as a cpu-single save of a ~2 GiB bf16 model with AdamW state would write:
    n_params parameters plus step, exp_avg and exp_avg_sq each (4 x 250 = 1000 tensors),
    striped in 16 MiB chunks over the targets, with checksums. Tensors live on the meta device:
    only their shapes matter here."""
    layer = [[2048, 2048]] * 4 + [[5632, 2048]] * 3 + [[2048]] * 2
    meta = torch.device("meta")
    model = {
        f"layers.{i // len(layer)}.p{i % len(layer)}": torch.empty(
            layer[i % len(layer)], dtype=torch.bfloat16, device=meta
        )
        for i in range(n_params)
    }
    optim = {
        "state": {
            i: {
                "step": torch.empty((), dtype=torch.float32, device=meta),
                "exp_avg": torch.empty(p.shape, dtype=torch.float32, device=meta),
                "exp_avg_sq": torch.empty(p.shape, dtype=torch.float32, device=meta),
            }
            for i, p in enumerate(model.values())
        },
        "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "params": list(range(n_params))}],
    }
    tree, tensors = flatten({"model": model, "optim": optim, "step": 1000})
    entries = [manifest.tensor_entry(p, t) for p, t in tensors]
    offsets, used = layout.pack_offsets(entries)
    _, file_bytes = layout.packed(
        np.empty(0, np.uint8), used, entries, offsets, len(targets), CHUNK
    )
    rng = _rng(3)
    for e in entries:
        e.xxh3 = f"{int(rng.integers(0, 2**63)):016x}"
    save_id = manifest.new_save_id()
    return manifest.Manifest(
        name="ckpt",
        engine="cpu-single",
        targets=targets,
        files={
            t: {"file": manifest.data_file_name(t, save_id), "bytes": n}
            for t, n in file_bytes.items()
        },
        tensors=entries,
        tree=tree,
        checksums=True,
        payload_bytes=sum(e.nbytes for e in entries),
        save_id=save_id,
        extra={"chunk_bytes": CHUNK, "o_direct": True},
    )


@pytest.fixture(scope="module")
def commit_targets(perf_scratch: Path) -> list[str]:
    out = []
    for i in range(2):
        d = perf_scratch / "commit" / f"t{i}"
        d.mkdir(parents=True)
        out.append(str(d))
    return out


@pytest.mark.benchmark(group="manifest commit")
def test_manifest_commit(benchmark: Any, commit_targets: list[str]) -> None:
    """Serialise, write, fsync, rename over the previous manifest, fsync the directory."""
    m = _model_like_manifest(commit_targets)
    os.makedirs(manifest.checkpoint_dir(commit_targets[0], m.name), exist_ok=True)
    benchmark.extra_info.update(tensors=len(m.tensors), manifest_bytes=len(m.to_json()))
    benchmark.pedantic(manifest.commit, args=(commit_targets, m), rounds=20, warmup_rounds=2)
    back = generations.read(commit_targets, m.name)
    assert back.save_id == m.save_id and len(back.tensors) == 1000


@pytest.mark.benchmark(group="manifest commit")
def test_manifest_to_json(benchmark: Any, commit_targets: list[str]) -> None:
    """The serialisation alone (JSON and its xxh3), to split a commit's time from its fsyncs."""
    m = _model_like_manifest(commit_targets)
    benchmark.extra_info.update(tensors=len(m.tensors))
    text = benchmark.pedantic(m.to_json, rounds=20, warmup_rounds=2)
    benchmark.extra_info["manifest_bytes"] = len(text)
