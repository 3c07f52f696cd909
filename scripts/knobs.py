"""Sweep one engine knob at a time on configs/ceiling.yaml and print a Markdown table (the source
of the measurements in bench/PERF.md).

    .venv/bin/python scripts/knobs.py                 # every knob, 5 repetitions each
    .venv/bin/python scripts/knobs.py threads chunk   # only these
    .venv/bin/python scripts/knobs.py --reps 3 --size 512MiB ring

Each setting is one `ckptbench run` of configs/ceiling.yaml (one target, one 1 GiB state of
64 MiB tensors, ceilings off: fio is measured once by `make ceiling`) with `--set` overrides; the
runs stay under results/ with their raw rows. The table gives the medians of the timed
repetitions: persist GB/s (bytes / persist_s), stall, time to durability, pinned staging and
checksum time.
"""

from __future__ import annotations

import argparse
import sys

from bench.common import devices
from bench.config import sweep as config
from bench.measure import results
from bench.run.sweep import Sweep

# knob -> (engine, [(label, [--set overrides])])
KNOBS = {
    "threads": (
        "cpu-single",
        [
            (f"threads_per_target={n}", [f"engine_options.cpu-single.threads_per_target={n}"])
            for n in (1, 2, 4, 8)
        ],
    ),
    "chunk": (
        "cpu-single",
        [
            (f"chunk_bytes={c}", [f"engine_options.cpu-single.chunk_bytes={c}"])
            for c in ("4MiB", "16MiB", "32MiB", "64MiB")
        ],
    ),
    "checksums": (
        "cpu-single",
        [
            (f"checksums={v}", [f"engine_options.cpu-single.checksums={v}"])
            for v in ("true", "false")
        ],
    ),
    "ring": (
        "cpu-single",
        [
            (f"staging_chunks={k}", [f"engine_options.cpu-single.staging_chunks={k}"])
            for k in (0, 16, 4, 2)
        ],
    ),
    "fallocate": (
        "cpu-single",
        [
            (f"fallocate={v}", [f"engine_options.cpu-single.fallocate={v}"])
            for v in ("false", "true", "false", "true")
        ],
    ),
    "fallocate-threads": (
        "cpu-single",
        [
            (
                f"fallocate=true threads_per_target={n}",
                [
                    "engine_options.cpu-single.fallocate=true",
                    f"engine_options.cpu-single.threads_per_target={n}",
                ],
            )
            for n in (1, 2, 4, 8)
        ],
    ),
    "double-threads": (
        "cpu-double",
        [
            (f"threads_per_target={n}", [f"engine_options.cpu-double.threads_per_target={n}"])
            for n in (1, 2, 4)
        ],
    ),
}


def run_one(engine: str, sets: list[str], reps: int, size: str) -> dict[str, float]:
    cfg = config.load(
        "configs/ceiling.yaml",
        [
            f"engines=[{engine}]",
            f"repetitions={reps}",
            "ceilings.enabled=false",
            f"total_sizes=[{size}]",
            *sets,
        ],
    )
    run_dir = Sweep(cfg, devices.detect("host-emulated"), "results", quiet=True).run()
    df = results.read_rows(run_dir)
    df = df[~df["warmup"].astype(bool) & (df["error"].isna() | (df["error"] == ""))]
    persist = df["persist_s"].where(df["persist_s"] > 0, df["total_s"])
    return {
        "persist_GBps": float((df["total_bytes"] / persist).median() / 1e9),
        "e2e_GBps": float((df["total_bytes"] / df["total_s"]).median() / 1e9),
        "stall_s": float(df["stall_s"].median()),
        "total_s": float(df["total_s"].median()),
        "pinned_MiB": float(df["pinned_bytes"].median() / 2**20),
        "hash_s": float(df["hash_s"].median()),
        "n": len(df),
        "run": run_dir.rstrip("/").rsplit("/", 1)[-1],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("knobs", nargs="*", help=f"any of {', '.join(KNOBS)} (default: all)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--size", default="1GiB")
    a = p.parse_args()
    unknown = [k for k in a.knobs if k not in KNOBS]
    if unknown:
        p.error(f"unknown knob {unknown[0]!r} (known: {', '.join(KNOBS)})")
    print(
        "| engine | setting | persist GB/s | end-to-end GB/s | stall s | total s | pinned MiB | "
        "hash s | n | run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for knob in a.knobs or list(KNOBS):
        engine, settings = KNOBS[knob]
        for label, sets in settings:
            r = run_one(engine, sets, a.reps, a.size)
            print(
                f"| {engine} | {label} | {r['persist_GBps']:.2f} | {r['e2e_GBps']:.2f} | "
                f"{r['stall_s']:.3f} | "
                f"{r['total_s']:.3f} | {r['pinned_MiB']:.0f} | {r['hash_s']:.3f} | {r['n']} | "
                f"{r['run']} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
