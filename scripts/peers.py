"""The single-copy path against the libraries users would otherwise pick (NVIDIA's NIXL among
them: POSIX with io_uring and with AIO, GDS_MT on a GPU), and against the disk itself, in one
alternating run (`make peers`).

Every method saves the same state (random bytes, 64 MiB tensors) into one target, one after the
other, repetition by repetition: the page cache dropped before every save (when root), every save
durable (fsync). Then each restores as its best user restarts (bench.run.restart, timed by
bench.run.protocol.restore_phase): into the state's own tensors, scrubbed first, its pages evicted;
in place where its API can, else its loader and the copy into the state; checked against the
source's fingerprints. Beside them fio writes the same number of bytes with O_DIRECT (libaio,
queue depth 16, 8 MiB blocks, end_fsync) into a preallocated file and reads them back with
O_DIRECT (without fio: the built-in read ceiling's O_DIRECT read of as many bytes): what the
disk does; and the copy ceiling (the snapshot's own copy, best of 5) is
measured in every repetition, so that each stall is judged against the memory bandwidth of its
own moment. The tables give stall and time to durability (min-max over the repetitions) and the
median bandwidth to durability, then each restart's time and median bandwidth; the raw rows go
to results/peers-<stamp>/peers.csv with env.json, each save's row with the options its engine
ran with and what its save reported (`options`, `io_detail`).

With `--tuned PROFILE` (`make peers TUNED=PROFILE`), each method whose engine the profile tuned
(`ckptbench tune`: DCP's thread_count, nixl's backend, request size, batch and buffer,
cpu-single's threads and chunk, FastPersist's buffer) runs a second time with the profile's
knobs, labelled tuned, beside its default run; the profile is refused in one line, as `run
--tuned` refuses it (bench.run.tune.profile.resolve), when its host or the target's file system
or device differ. env.json's `tuned` block names the profile and what was applied.

    .venv/bin/python scripts/peers.py [--size 1GiB] [--reps 5] [--target DIR] [--tuned PROFILE]
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
from typing import Any

from bench import engines
from bench.common import cudasync, devices, sizes
from bench.common.errors import UserError
from bench.measure import ceilings, clock, env, results, witness
from bench.measure import timers as measure
from bench.measure.ceilings import Ceilings, Measured, Method, builtin
from bench.measure.ceilings.data import make_read_files, remove_files
from bench.measure.ceilings.fio import fio_env, fio_version
from bench.measure.ceilings.memory import copy_bandwidth, d2h_bandwidth
from bench.run import protocol
from bench.run import rows as rowlib
from bench.run.tune import profile
from bench.storage import verify
from bench.workloads import synthetic_state

COPY = "copy ceiling (warm buffer, best of 5)"
FIO = "fio O_DIRECT libaio qd16 bs 8m end_fsync"
OURS = "cpu-single (ckptbench defaults)"
DISK_READ = "built-in O_DIRECT read, 16 in flight, 8 MiB blocks (no fio)"
METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("cpu-single", OURS, {}),
    ("cpu-single", "cpu-single, overlap forced on", {"overlap": True}),
    ("safetensors", "safetensors save_file + fsync", {}),
    ("fastpersist", "DeepSpeed FastPersist (FastFileWriter)", {}),
    # NVIDIA's NIXL as nixlbench drives it, each POSIX io queue; GDS_MT where CUDA is
    ("nixl", "NIXL POSIX io_uring", {"backend": "posix-uring"}),
    ("nixl", "NIXL POSIX AIO", {"backend": "posix-aio"}),
    ("nixl", "NIXL GDS_MT", {"backend": "gds-mt"}),
    ("dcp", "DCP async_save, cached staging", {}),
    ("torch-save", "torch.save + fsync", {}),
]


def with_tuned(
    methods: list[tuple[str, str, dict[str, Any]]], chosen: dict[str, dict[str, Any]]
) -> list[tuple[str, str, dict[str, Any]]]:
    """`methods` with, after the first method of each engine in `chosen` (profile.choose), that
    method again with the profile's knobs over its options, labelled with them."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    seen: set[str] = set()
    for name, label, opts in methods:
        out.append((name, label, opts))
        if name in chosen and name not in seen:
            seen.add(name)
            knobs = chosen[name]["knobs"]
            said = " ".join(f"{k}={_knob(k, v)}" for k, v in sorted(knobs.items()))
            out.append((name, f"{name} tuned ({said})", {**opts, **knobs}))
    return out


def _knob(key: str, value: Any) -> str:
    return (
        sizes.format_size(value)
        if key.endswith("_bytes") and isinstance(value, int)
        else str(value)
    )


def fio_disk(target: str, nbytes: int) -> tuple[float, float]:
    """Seconds fio takes to write `nbytes` with O_DIRECT, libaio qd16, 8 MiB blocks, end_fsync,
    into a preallocated file, from buffers on huge pages as cpu-single's staging
    (bench.measure.ceilings.fio.fio_env); then to read them back the same way, the file's pages
    dropped first (`invalidate=1`)."""
    path = os.path.join(target, ".ckptbench-peers-fio")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)
    try:
        return _fio(path, nbytes, "write"), _fio(path, nbytes, "read")
    finally:
        os.unlink(path)


def _fio(path: str, nbytes: int, rw: str) -> float:
    out = subprocess.run(
        [
            "fio",
            "--output-format=json",
            "--name=disk",
            f"--filename={path}",
            f"--size={nbytes}",
            f"--rw={rw}",
            f"--bs={min(8 << 20, nbytes)}",  # fio refuses a block larger than the file
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=16",
            *(["--end_fsync=1"] if rw == "write" else ["--invalidate=1"]),
            "--fallocate=none",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env=fio_env()[0],
    )
    w = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0][rw]
    return float(w["runtime"]) / 1e3


def builtin_read(target: str, nbytes: int) -> float:
    """Seconds the built-in read ceiling (bench.measure.ceilings.builtin.builtin_read) takes to
    read `nbytes` back with O_DIRECT, 16 reads of 8 MiB in flight, from a file it wrote first
    (untimed): the disk's read where fio is not installed."""
    block = 8 << 20
    files = make_read_files([target], max(block, nbytes // block * block), block)
    try:
        return nbytes / builtin.builtin_read(files, nbytes, block, True, 1, 16)
    finally:
        remove_files(files)


def restart(eng: Any, name: str, state: Any, want: Any, dev: devices.Device, rep: int) -> Any:
    """One restart of checkpoint `name` into `state` (bench.run.protocol.restore_phase: scrubbed,
    evicted, the load timed, the destination checked against `want`); its row."""
    n, total = rowlib.tensor_stats(state)
    row = results.Row(
        run_id="peers",
        case_id=name,
        engine=eng.name,
        device=dev.kind,
        emulated=dev.emulated,
        workload="peers",
        total_bytes=total,
        tensor_bytes=0,
        n_tensors=n,
        n_targets=1,
        rep=rep,
        warmup=False,
        cache_dropped=True,
        dtype="float32",
        options=rowlib.options_json(eng),
    )
    try:
        protocol.restore_phase(row, eng, eng.name, state, name, dev, True, fingerprint=want)
    except Exception as e:  # the row says it, the table counts it as unverified
        row.error, row.verified = rowlib.error_text(e), False
    return row


def copy_ceilings(size: int, dev: devices.Device, threads: int) -> Ceilings:
    """The copy ceiling of one repetition (and on CUDA the device-to-host one), best of 5."""
    host = {ceilings.COPY: Measured.best_of(copy_bandwidth(size, threads=threads))}
    if dev.is_cuda:
        host[ceilings.D2H] = Measured.best_of(d2h_bandwidth(size, dev))
    return Ceilings(host=host, method=Method(copy_threads=threads))


def _witnessed(
    written: int | None = None, flushes: int | None = None, text: str = "", read: str = ""
) -> dict[str, Any]:
    """The block device's witness of a save and of its restart, as peers.csv's columns (empty
    for the copy, fio and disk-read rows, which are no checkpoint)."""
    return {
        "device_written_bytes": "" if written is None else written,
        "device_flushes": "" if flushes is None else flushes,
        "durable_witness": text,
        "restore_witness": read,
    }


def _given(eng: Any = None, detail: Any = None) -> dict[str, Any]:
    """The options the engine ran with and what its save reported (bench.measure.detail), as
    peers.csv's columns (empty for the copy, fio and disk-read rows): what a tuned row was given."""
    return {
        "options": rowlib.options_json(eng) if eng is not None else "",
        "io_detail": json.dumps(detail.to_json(), sort_keys=True) if detail is not None else "",
    }


def main(argv: list[str] | None = None) -> int:
    try:
        return peers(argv)
    except UserError as e:
        print(f"peers: error: {e}", file=sys.stderr)
        return 2


def peers(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--tensor", default="64MiB")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target", default="scratch/peers")
    ap.add_argument("-o", "--output", default="results")
    ap.add_argument(
        "--tuned",
        metavar="PROFILE",
        help="also run each tuned engine with the knobs of this `ckptbench tune` profile",
    )
    a = ap.parse_args(argv)
    size = sizes.parse_size(a.size, "--size")
    methods, tuned = METHODS, None
    if a.tuned:  # refused before anything is written, as `run --tuned` refuses it
        names = list(dict.fromkeys(m[0] for m in METHODS))
        chosen, tuned = profile.resolve(a.tuned, [a.target], names, [1], socket.gethostname())
        methods = with_tuned(METHODS, chosen)
        print(f"tuned knobs from {a.tuned}: {', '.join(chosen)}", file=sys.stderr)
    sync = cudasync.blocking_sync()  # before any CUDA context
    os.makedirs(a.target, exist_ok=True)
    dev = devices.detect("auto")
    state = synthetic_state(size, sizes.parse_size(a.tensor, "--tensor"), device=dev.torch_device)
    made = []
    for name, label, opts in methods:
        why = engines.unavailable(name, opts)
        if why:
            print(f"skipped {label}: {why}", file=sys.stderr)
            continue
        eng = engines.create(name, [a.target], **opts)
        eng.warm(state)
        made.append((name, label, eng))
    has_fio = fio_version() is not None
    threads = min(os.cpu_count() or 1, 8)
    copies: list[Ceilings] = []
    run_id, run_dir = results.new_run_dir(a.output, "peers")
    rows: list[dict[str, Any]] = []
    want = verify.fingerprint(state)  # what every restart must bring back
    for rep in range(a.reps):
        # The copy ceiling alternates with the saves too: this host's memory bandwidth moves
        # as much as its disk does, and a stall is judged against the ceiling of its own rep.
        copies.append(copy_ceilings(size, dev, threads))
        rows.append(
            {
                "rep": rep,
                "method": COPY,
                "engine": "copy",
                "stall_s": size / copies[-1].host[ceilings.COPY].Bps,
                "durable_s": "",
                "restore_s": "",
                "restore_cached_bytes": "",
                "verified": True,
                **_witnessed(),
                **_given(),
            }
        )
        for name, label, eng in made:
            # the last restore's garbage is not this save's (bench.run.protocol.save_phase)
            gc.collect()
            measure.drop_page_cache()
            # The harness's clock around the save, as in a sweep (bench.measure.clock)
            timed = clock.clocked(eng).save(state, f"peers-{rep}")
            res = timed.wait()
            seen = timed.witnessed  # the device's counters around it (bench.measure.witness)
            back = restart(clock.clocked(eng), f"peers-{rep}", state, want, dev, rep)
            eng.delete(f"peers-{rep}")
            if not back.verified:  # the state holds what the restart left: made again
                state = synthetic_state(
                    size, sizes.parse_size(a.tensor, "--tensor"), device=dev.torch_device
                )
            rows.append(
                {
                    "rep": rep,
                    "method": label,
                    "engine": name,
                    "stall_s": res.stall_s,
                    "durable_s": res.total_s,
                    "restore_s": back.restore_s if back.restore_s is not None else "",
                    "restore_cached_bytes": back.restore_cached_bytes,
                    "verified": bool(back.verified),
                    **_witnessed(seen.bytes, seen.flushes, seen.text, back.restore_witness),
                    **_given(eng, res.detail),
                }
            )
            print(
                f"rep {rep} {label}: stall {res.stall_s:.3f} s, durable {res.total_s:.3f} s, "
                f"restart {back.restore_s or float('nan'):.3f} s"
                + ("" if back.verified else f", {back.error}")
                + ("" if seen.text == witness.YES else f", device witness {seen.text}")
                + (
                    ""
                    if back.restore_witness == witness.YES
                    else f", restore witness {back.restore_witness}"
                ),
                file=sys.stderr,
            )
        if has_fio:
            measure.drop_page_cache()
            t, r = fio_disk(a.target, size)
            rows.append(
                {
                    "rep": rep,
                    "method": FIO,
                    "engine": "fio",
                    "stall_s": "",
                    "durable_s": t,
                    "restore_s": r,
                    "restore_cached_bytes": 0,
                    "verified": True,
                    **_witnessed(),
                    **_given(),
                }
            )
        else:
            rows.append(
                {
                    "rep": rep,
                    "method": DISK_READ,
                    "engine": "disk",
                    "stall_s": "",
                    "durable_s": "",
                    "restore_s": builtin_read(a.target, size),
                    "restore_cached_bytes": 0,
                    "verified": True,
                    **_witnessed(),
                    **_given(),
                }
            )
    for _, _, eng in made:
        eng.close()
    with open(os.path.join(run_dir, "peers.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    envb = env.collect([os.path.abspath(a.target)], engines.environment_blocks())
    envb.update(
        device={"kind": dev.kind, "emulated": dev.emulated},
        copy_ceilings=[c.to_json() for c in copies],
        size_bytes=size,
        stall_clock=clock.STALL_CLOCK,
        **({"cuda_sync": sync} if dev.is_cuda else {}),
        **({"tuned": tuned} if tuned is not None else {}),
    )
    if has_fio:
        envb["fio_buffers"] = fio_env()[1]
    results.write_json(os.path.join(run_dir, "env.json"), envb)
    copy_s = [size / c.host[ceilings.COPY].Bps for c in copies]
    print(
        f"\n{sizes.format_size(size)} of {a.tensor} tensors, one target, {a.reps} alternating "
        f"repetitions ({dev.kind}); copy ceiling {min(copy_s):.3f}-{max(copy_s):.3f} s "
        f"({threads} threads, measured in every repetition)"
        + (f"; fio writes from {fio_env()[1]}" if has_fio else "")
        + (f"; tuned rows with the knobs of {a.tuned}" if a.tuned else "")
    )
    print("| method | stall s | durable s | median GB/s to durability |")
    print("|---|---|---|---|")
    med: dict[str, float] = {}
    for label in dict.fromkeys(r["method"] for r in rows if r["durable_s"] != ""):
        rs = [r for r in rows if r["method"] == label]
        # a save the device denied durable has no time to durability (stall kept)
        d = [float(r["durable_s"]) for r in rs if not str(r["durable_witness"]).startswith("no")]
        if not d:
            print(f"| {label} | | denied by the device in all {len(rs)} | |")
            continue
        st = [float(r["stall_s"]) for r in rs if r["stall_s"] != ""]
        med[label] = statistics.median(d)
        # By what the engine's save waits for, not by the numbers: a snapshot stall that
        # happened to run long is still a snapshot stall.
        waits = {
            engines.REGISTRY[r["engine"]].traits.stall
            for r in rs
            if r["engine"] in engines.REGISTRY
        }
        stall = f"{min(st):.3f}-{max(st):.3f}" if st and waits == {"snapshot"} else "= durable"
        if not st:
            stall = ""
        print(f"| {label} | {stall} | {min(d):.2f}-{max(d):.2f} | {size / med[label] / 1e9:.2f} |")
    fio = med.get(FIO)
    ours = med.get(OURS)
    if fio and ours:
        # Each rep's stall over the same rep's copy ceiling, then the median of those ratios.
        stalls = [float(r["stall_s"]) for r in rows if r["method"] == OURS]
        ratios = [s / c for s, c in zip(stalls, copy_s, strict=True)]
        of_medians = statistics.median(stalls) / statistics.median(copy_s)
        # One copy against one copy: the stall over the median of its repetition's copy runs
        # (the ceiling is their best; a single stall set against the best of five carries
        # the machine's run-to-run noise, about 1.1x here, on top of any real overhead).
        typical = [size / c.host[ceilings.COPY].median() for c in copies]
        like = [s / c for s, c in zip(stalls, typical, strict=True)]
        print(
            f"\ncpu-single end to end: {fio / ours:.2f} x fio's median; stall: median "
            f"{statistics.median(ratios):.2f} x its repetition's copy ceiling "
            f"({min(ratios):.2f}-{max(ratios):.2f}; the ratio of the medians: {of_medians:.2f}); "
            f"median {statistics.median(like):.2f} x its repetition's median copy run"
        )
    denied = [r for r in rows if str(r["durable_witness"]).startswith("no")]
    for r in denied:
        print(
            f"rep {r['rep']} {r['method']}: not durable as the device saw it: "
            f"{r['durable_witness']}",
            file=sys.stderr,
        )
    restarts(rows, size)
    print(f"rows: {run_dir}/peers.csv")
    ours_denied = any(
        r["engine"] in engines.REGISTRY and not engines.REGISTRY[r["engine"]].traits.baseline
        for r in denied
    )
    return 0 if all(r["verified"] for r in rows) and not ours_denied else 1


def restarts(rows: list[dict[str, Any]], size: int) -> None:
    """The restore side: each method's restart (fio: its O_DIRECT read of the same bytes),
    min-max and median GB/s, the page cache it left, and the median against the disk's read
    (fio's, else the built-in one)."""
    print(
        "\n| restart into the existing state | restore s | median GB/s | x the disk's read "
        "| cached bytes |"
    )
    print("|---|---|---|---|---|")
    med: dict[str, float] = {}
    for label in dict.fromkeys(r["method"] for r in rows if r["restore_s"] != ""):
        d = [float(r["restore_s"]) for r in rows if r["method"] == label and r["restore_s"] != ""]
        med[label] = statistics.median(d)
    fio = med.get(FIO) or med.get(DISK_READ)
    for label, m in med.items():
        d = [float(r["restore_s"]) for r in rows if r["method"] == label and r["restore_s"] != ""]
        cached = max(int(r["restore_cached_bytes"] or 0) for r in rows if r["method"] == label)
        vs = f"{fio / m:.2f}" if fio else ""
        print(f"| {label} | {min(d):.2f}-{max(d):.2f} | {size / m / 1e9:.2f} | {vs} | {cached} |")


if __name__ == "__main__":
    sys.exit(main())
