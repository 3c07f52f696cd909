"""The GPU check's table: one line per workload x engine of the check's runs (its stages, in
order; medians over the timed repetitions), under the env.json block that says what the machine
and kvikio/cuFile were, and the check's notes: what failed and why, what the sizing chose, which
stage was skipped or cut short, one line each.

    python scripts/gpu_table.py [--notes FILE] results/<run-id> [results/<run-id> ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.measure import detail as io_detail  # noqa: E402
from bench.measure import results  # noqa: E402
from bench.measure.ceilings import RunCeilings  # noqa: E402


def _gb(b: float) -> str:
    return f"{b / 1e9:.2f}"


def env_lines(env: dict) -> list[str]:
    """What the machine was; `ceilings` from whichever stage measured them."""
    gpu, kv, dev = env.get("gpu", {}), env.get("kvikio", {}), env.get("device", {})
    lines = [
        f"device {dev.get('kind')} (emulated={dev.get('emulated')}); GPU {gpu.get('name')} x"
        f"{gpu.get('count')}, driver {gpu.get('driver')}, CUDA {gpu.get('cuda')}, PCIe gen "
        f"{gpu.get('pcie_gen')} x{gpu.get('pcie_width')}",
        "kvikio " + ", ".join(f"{k}={v}" for k, v in sorted(kv.items())),
        f"torch {env.get('packages', {}).get('torch')}, targets "
        + ", ".join(
            f"{t['path']} ({t['fstype']} on {t['block'].get('name', '?')})"
            for t in env.get("storage", {}).get("targets", [])
        ),
    ]
    nixl = env.get("nixl")
    if isinstance(nixl, dict):  # the nixl peer's library: its version and plugins, or why not
        lines.append(
            f"nixl {nixl.get('version')}, plugins {','.join(nixl.get('plugins') or [])}"
            if nixl.get("available")
            else f"nixl: {nixl.get('reason')}"
        )
    sync = env.get("cuda_sync")
    if isinstance(sync, dict):  # how CUDA waits: blocking-sync or spin
        lines.append(f"cuda_sync in force: {sync.get('in_force')}")
    measured = RunCeilings.from_env(env)
    c = measured.before
    if c is not None:  # the host's, and those of one target
        got = [(k, m) for k, n, m in c.measured() if n in (None, 1)]
        lines.append(
            f"ceilings ({c.method.tool}): "
            + ", ".join(f"{k.label} {_gb(m.Bps)} GB/s" for k, m in got)
        )
    elif measured.error:
        lines.append(f"ceilings not measured: {measured.error}")
    return lines


def _evidence(text: str) -> str:
    """What decided a gds row's label: nvidia-fs's counters or the filesystem list."""
    if text.startswith("nvidia-fs"):
        return "nvidia-fs"
    return "fs list" if text else ""


def _or_blank(v: object) -> object:
    """A fact of the detail, or "" where the row's engine does not report it."""
    return "" if v is None else v


def _device_said(col: pd.Series) -> str:
    """The block device's word on a case's rows (bench.measure.witness): 'yes 3/3', or the
    first other verdict, cut short, with how many rows said yes."""
    said = [str(x) for x in col.fillna("")]
    other = [x for x in said if x != "yes"]
    if not other:
        return f"yes {len(said)}/{len(said)}"
    return f"yes {len(said) - len(other)}/{len(said)}; {other[0][:50]}"


def table(df: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (wl, eng), g in df.groupby(["workload", "engine"], sort=False):
        ok = g[(~g["warmup"].astype(bool)) & (g["error"].fillna("") == "")]
        if ok.empty:
            err = g["error"].fillna("").iloc[-1][:60]
            out.append({"workload": wl, "engine": eng, "n": 0, "error": err})
            continue
        d = io_detail.read(ok["io_detail"].fillna("").iloc[-1])  # typed (bench.measure.detail)
        gd = d if isinstance(d, io_detail.GdsDetail) else None
        sd = d if isinstance(d, io_detail.SnapshotDetail) else None
        nd = d if isinstance(d, io_detail.NixlDetail) else None
        med = {c: statistics.median(ok[c]) for c in ("stall_s", "total_s", "restore_s")}
        gb = ok["total_bytes"].iloc[0]
        out.append(
            {
                "workload": wl,
                "engine": eng,
                "n": len(ok),
                "gds_mode": ok["gds_mode"].iloc[-1],
                # how it reached the disk: gds's io (kvikio, or its emulation), nixl's backend
                "via": gd.io if gd else (nd.backend if nd else ""),
                "restore": ok["restore_mode"].iloc[-1],
                "stall_s": round(med["stall_s"], 3),
                "durable_s": round(med["total_s"], 3),
                "write_GBps": round(gb / med["total_s"] / 1e9, 2),
                "restore_GBps": round(gb / med["restore_s"] / 1e9, 2),
                "hash_s": round(statistics.median(ok["hash_s"].fillna(0)), 3),
                "pinned_GiB": round(ok["pinned_bytes"].fillna(0).iloc[-1] / 2**30, 3),
                "verified": bool(ok["verified"].astype(bool).all()),
                "device_durable": _device_said(ok.get("durable_witness", pd.Series([""]))),
                "device_read": _device_said(ok.get("restore_witness", pd.Series([""]))),
                "threads": _or_blank(gd and gd.num_threads),
                "reg_GiB": round((gd.registered_bytes or 0) / 2**30, 2) if gd else "",
                "host_B": _or_blank(gd and gd.host_bytes),
                "pinned_seen": _or_blank(sd and sd.staging_is_pinned),
                "evidence": _evidence(gd.gds_evidence or "") if gd else "",
                "unreg_MiB": round(gd.unregistered_device_bytes / 2**20, 1)
                if gd and gd.unregistered_device_bytes is not None
                else "",
                "why_compat": "; ".join(gd.compat_reasons or [])[:70] if gd else "",
            }
        )
    return pd.DataFrame(out)


def merged_env(runs: list[Path]) -> dict:
    """The first run's env.json, with the ceilings of the first run that measured them (the
    check measures them in its second stage)."""
    envs = [json.loads((r / "env.json").read_text()) for r in runs if (r / "env.json").exists()]
    if not envs:
        return {}
    env = dict(envs[0])
    for e in envs:
        if e.get("ceilings") or e.get("ceilings_error"):
            env["ceilings"], env["ceilings_error"] = e.get("ceilings"), e.get("ceilings_error")
            break
    return env


def rows(runs: list[Path]) -> pd.DataFrame:
    """Every stage's rows, in stage order (a stage cut short may hold none)."""
    frames = [results.read_rows(str(r)) for r in runs if (r / "results.csv").exists()]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="the check's run folders, in order")
    ap.add_argument("--notes", type=Path, help="the check's notes, one line each")
    args = ap.parse_args(argv)
    print(f"== GPU check: {', '.join(r.name for r in args.runs)}")
    for line in env_lines(merged_env(args.runs)):
        print(line)
    if args.notes and args.notes.exists():
        for line in args.notes.read_text().splitlines():
            if line.strip():
                print(line)
    df = rows(args.runs)
    if df.empty:
        print("no rows")
        return 1
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table(df).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
