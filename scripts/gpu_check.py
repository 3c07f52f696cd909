"""One-shot GPU check: save, restore and verify one CUDA state with gds, cpu-double and cpu-single.

For each engine (through the library API, `bench.engines.create`): one warm-up and `--reps` timed
repetitions of save().wait(), a page-cache drop of the checkpoint's files, a restore onto the GPU
(timed), a bit-exact comparison with the source, and deletion. One row per repetition goes to
`<out>/results.csv`; the machine (GPU, driver, PCIe link, kvikio and cuFile versions, whether
kvikio runs in compat mode, the scratch filesystem) and a plain device-to-host copy of the state
into pinned memory go to `<out>/env.json`. A table of medians is printed at the end.

    python scripts/gpu_check.py --out results/gpu-check [--size 4GiB] [--targets 1]

Exit codes: 0 all engines ran and verified; 1 an engine failed or a restore did not verify (the
rows that were measured are still written); 2 a usage error, e.g. no CUDA device.
`--allow-host` (not in --help) runs the same flow on host memory with the gds engine's emulated
back end, to try the script on a machine without a GPU; its numbers are not GPU numbers.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any

import torch

from bench.engines import create
from bench.errors import UserError
from bench.sizes import format_size, parse_size

ENGINES = ("gds", "cpu-double", "cpu-single")
COMPAT_WARNING = "kvikio ran in compat mode: these gds numbers are NOT GPUDirect Storage"
FIELDS = [
    "engine",
    "io",
    "gds_mode",
    "device_kind",
    "rep",
    "warmup",
    "bytes",
    "stall_s",
    "persist_s",
    "total_s",
    "hash_s",
    "wait_prev_s",
    "restore_s",
    "pinned_bytes",
    "staging_grew",
    "targets",
    "verified",
]


def _now() -> int:
    return time.perf_counter_ns()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/gpu-check", help="folder for results.csv and env.json")
    p.add_argument("--size", default="4GiB", help="state size, e.g. 4GiB (default %(default)s)")
    p.add_argument("--tensors", type=int, default=64, help="tensors in the state (default 64)")
    p.add_argument("--targets", type=int, default=1, help="target directories (default 1)")
    p.add_argument("--scratch", default="./scratch/gpu-check", help="directory on local disk")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per engine (default 3)")
    p.add_argument(
        "--engines", default=",".join(ENGINES), help="comma-separated (default %(default)s)"
    )
    p.add_argument("--no-checksums", action="store_true", help="engines skip their xxh3 checksums")
    p.add_argument(
        "--max-s",
        type=float,
        default=200.0,
        help="start no new repetition after this many seconds (default %(default)s)",
    )
    p.add_argument("--allow-host", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- the state ------------------------------------------------------------------------------


def make_state(size: int, n_tensors: int, device: torch.device) -> dict[str, Any]:
    """A training-like state of `n_tensors` random float32 tensors totalling about `size` bytes."""
    if n_tensors < 1:
        raise UserError(f"--tensors must be at least 1, got {n_tensors}")
    per = size // n_tensors // 4
    if per == 0:
        raise UserError(f"--size {format_size(size)} is too small for {n_tensors} float32 tensors")
    g = torch.Generator(device=device)
    g.manual_seed(20240601)
    # Random normals: no zero pages for a filesystem or device to compress or skip.
    model = {
        f"layer{i:03d}.weight": torch.randn(per, generator=g, device=device)
        for i in range(n_tensors)
    }
    return {"model": model, "step": 100}


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state["model"].values())


def verify(source: dict[str, Any], restored: Any, device_type: str) -> str | None:
    """None if `restored` is bit-identical to `source` on the right device, else what differs."""
    if not isinstance(restored, dict) or restored.get("step") != source["step"]:
        return "the restored state does not have the saved structure"
    got = restored.get("model", {})
    if set(got) != set(source["model"]):
        return "the restored state has other tensor names"
    for key, src in source["model"].items():
        dst = got[key]
        if dst.device.type != device_type:
            return f"{key} was restored to {dst.device}, not {device_type}"
        if dst.dtype != src.dtype or dst.shape != src.shape:
            return f"{key} came back as {dst.dtype} {tuple(dst.shape)}"
        if not torch.equal(src.reshape(-1).view(torch.uint8), dst.reshape(-1).view(torch.uint8)):
            return f"{key} differs from the saved bytes"
    return None


def drop_page_cache(paths: list[str]) -> None:
    """Drop the (clean, fsync'd) pages of `paths` so the restore reads from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- reference copy -------------------------------------------------------------------------


def copy_reference(state: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Bandwidth of a plain copy of the state into one pinned host buffer, and back."""
    tensors = list(state["model"].values())
    total = state_bytes(state)
    pinned = device.type == "cuda"
    host = torch.empty(total, dtype=torch.uint8, pin_memory=pinned)
    views, pos = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        views.append(host[pos : pos + n].view(t.dtype))
        pos += n

    def d2h() -> float:
        sync(device)
        t0 = _now()
        for t, v in zip(tensors, views, strict=True):
            v.copy_(t, non_blocking=pinned)
        sync(device)
        return (_now() - t0) / 1e9

    def h2d() -> float:
        back = [torch.empty_like(t) for t in tensors]
        sync(device)
        t0 = _now()
        for b, v in zip(back, views, strict=True):
            b.copy_(v, non_blocking=pinned)
        sync(device)
        return (_now() - t0) / 1e9

    d2h()  # warm-up: first touch of the host pages and copy engine set-up
    d2h_s = d2h()
    h2d()
    h2d_s = h2d()
    kind = "pinned" if pinned else "pageable host memcpy (no GPU)"
    return {
        "host_buffer": kind,
        "bytes": total,
        "d2h_s": d2h_s,
        "d2h_GBps": total / d2h_s / 1e9,
        "h2d_s": h2d_s,
        "h2d_GBps": total / h2d_s / 1e9,
    }


# -- environment ----------------------------------------------------------------------------


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the environment block records what it cannot read
        return f"error: {type(e).__name__}: {e}"


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def nvidia_smi() -> dict[str, str]:
    keys = [
        "name",
        "driver_version",
        "pcie.link.gen.current",
        "pcie.link.gen.max",
        "pcie.link.width.current",
        "pcie.link.width.max",
        "memory.total",
    ]
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(keys)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    first = out.strip().splitlines()[0] if out.strip() else ""
    return dict(zip(keys, [v.strip() for v in first.split(",")], strict=False))


def kvikio_info() -> dict[str, Any]:
    """kvikio's version and settings, and cuFile's, as far as they can be read here."""
    try:
        import kvikio  # noqa: PLC0415 - optional, absent on machines without a GPU
        import kvikio.cufile_driver  # noqa: PLC0415
        import kvikio.defaults  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError when a library does not load
        return {"import_error": f"{type(e).__name__}: {e}"}
    info: dict[str, Any] = {"version": kvikio.__version__}
    for key in (
        "compat_mode",
        "num_threads",
        "task_size",
        "gds_threshold",
        "bounce_buffer_size",
        "auto_direct_io_read",
        "auto_direct_io_write",
    ):
        info[key] = _try(lambda key=key: _plain(kvikio.defaults.get(key)))
    info["is_compat_mode_preferred"] = _try(kvikio.defaults.is_compat_mode_preferred)
    if hasattr(kvikio.cufile_driver, "libcufile_version"):
        info["libcufile_version"] = _try(lambda: _plain(kvikio.cufile_driver.libcufile_version()))

    def props() -> dict[str, Any]:
        p = kvikio.cufile_driver.properties
        names = ("is_gds_available", "major_version", "minor_version", "allow_compat_mode")
        return {n: _try(lambda n=n: _plain(getattr(p, n))) for n in names}

    info["cufile_driver"] = _try(props)
    info["env"] = {k: v for k, v in os.environ.items() if k.startswith(("KVIKIO_", "CUFILE_"))}
    return info


def mount_of(path: str) -> dict[str, str]:
    """Filesystem type, source device and mount point holding `path`."""
    path = os.path.realpath(path)
    best = {"mount": "", "fstype": "?", "source": "?"}
    try:
        with open("/proc/mounts") as f:
            for line in f:
                source, mnt, fstype = line.split()[:3]
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > len(best["mount"]):
                    best = {"mount": mnt, "fstype": fstype, "source": source}
    except OSError:
        pass
    return best


def _first_line_with(path: str, prefix: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def environment(device: torch.device, scratch: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpu": _first_line_with("/proc/cpuinfo", "model name"),
        "cpu_count": os.cpu_count(),
        "mem_total": _first_line_with("/proc/meminfo", "MemTotal"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device_kind": "cuda" if device.type == "cuda" else "host-emulated",
        "scratch": os.path.realpath(scratch),
        "scratch_fs": mount_of(scratch),
        "git_commit": _try(
            lambda: subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        ),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_capability"] = list(torch.cuda.get_device_capability(device))
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        env["nvidia_smi"] = nvidia_smi()
    env["kvikio"] = kvikio_info()
    return env


def bench_environment(targets: list[str]) -> Any:
    """The project's own environment block (bench.env), if it can be collected here."""
    try:
        from bench import env  # noqa: PLC0415 - needs psutil, which this check can do without

        return env.collect(targets)
    except Exception as e:  # noqa: BLE001 - the check's own block above covers the essentials
        return f"error: {type(e).__name__}: {e}"


# -- the measurement ------------------------------------------------------------------------


class Budget:
    """Stops starting new repetitions once `max_s` seconds have passed since the start."""

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self.t0 = time.monotonic()
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def allows(self, what: str) -> bool:
        if self.elapsed() <= self.max_s:
            return True
        self.skipped.append(what)
        return False


def run_engine(
    name: str,
    options: dict[str, Any],
    targets: list[str],
    state: dict[str, Any],
    device: torch.device,
    reps: int,
    budget: Budget,
    failures: list[str],
) -> list[dict[str, Any]]:
    """Warm-up and `reps` timed save/drop/restore/verify/delete rounds of one engine."""
    rows: list[dict[str, Any]] = []
    eng = create(name, targets, **options)
    ck = ""
    try:
        eng.warm(state)  # staging allocation and pre-faulting stay outside the timed region
        for rep in range(reps + 1):
            warmup = rep == 0
            label = "warm-up" if warmup else f"rep {rep}/{reps}"
            if not warmup and not budget.allows(f"{name} {label}"):
                print(f"  {name} {label}: skipped, past --max-s {budget.max_s:g} s", flush=True)
                continue
            ck = f"gpu-check-{name}-{rep}"
            res = eng.save(state, ck).wait()
            drop_page_cache(eng.cached_files(ck))
            sync(device)
            t0 = _now()
            restored = eng.load(ck, device=str(device))
            sync(device)
            restore_s = (_now() - t0) / 1e9
            problem = verify(state, restored, device.type)
            del restored
            eng.delete(ck)
            if problem:
                failures.append(f"{name} {label}: not bit-exact: {problem}")
            rows.append(
                {
                    "engine": name,
                    "io": options.get("io", "n/a"),
                    "gds_mode": res.gds_mode,
                    "device_kind": "cuda" if device.type == "cuda" else "host-emulated",
                    "rep": rep,
                    "warmup": warmup,
                    "bytes": res.bytes,
                    "stall_s": res.stall_s,
                    "persist_s": res.persist_s,
                    "total_s": res.total_s,
                    "hash_s": res.hash_s,
                    "wait_prev_s": res.wait_prev_s,
                    "restore_s": restore_s,
                    "pinned_bytes": res.pinned_bytes,
                    "staging_grew": res.staging_grew,
                    "targets": len(targets),
                    "verified": problem is None,
                }
            )
            print(
                f"  {name:10} {label:8} mode={res.gds_mode:8} "
                f"save {res.bytes / res.total_s / 1e9:6.2f} GB/s "
                f"(stall {res.stall_s:.3f} s, total {res.total_s:.3f} s)  "
                f"restore {res.bytes / restore_s / 1e9:6.2f} GB/s  "
                f"{'verified' if problem is None else 'NOT VERIFIED: ' + problem}",
                flush=True,
            )
            if name == "gds" and options.get("io") == "kvikio":
                if res.gds_mode == "compat" and warmup:
                    print(f"!!! {COMPAT_WARNING} !!!", flush=True)
                elif res.gds_mode not in ("gds", "compat"):
                    raise RuntimeError(f"io=kvikio reported gds_mode {res.gds_mode!r}")
    finally:
        if ck:
            eng.delete(ck)  # a checkpoint a failed repetition left behind; no-op otherwise
        eng.close()
    return rows


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine, medians over the timed (non-warm-up) repetitions."""
    table = []
    for name in dict.fromkeys(r["engine"] for r in rows):
        timed = [r for r in rows if r["engine"] == name and not r["warmup"]]
        if not timed:
            continue
        table.append(
            {
                "engine": name,
                "gds_mode": ",".join(sorted({r["gds_mode"] for r in timed})),
                "n": len(timed),
                "save_GBps": statistics.median(r["bytes"] / r["total_s"] / 1e9 for r in timed),
                "stall_s": statistics.median(r["stall_s"] for r in timed),
                "total_s": statistics.median(r["total_s"] for r in timed),
                "restore_GBps": statistics.median(r["bytes"] / r["restore_s"] / 1e9 for r in timed),
                "pinned_bytes": max(r["pinned_bytes"] for r in timed),
                "verified": all(r["verified"] for r in timed),
            }
        )
    return table


def print_table(table: list[dict[str, Any]]) -> None:
    print(
        f"{'engine':11}{'gds_mode':10}{'n':>3}{'save GB/s':>11}{'stall_s':>10}{'total_s':>10}"
        f"{'restore GB/s':>14}{'pinned':>10}  verified"
    )
    for t in table:
        print(
            f"{t['engine']:11}{t['gds_mode']:10}{t['n']:>3}{t['save_GBps']:>11.2f}"
            f"{t['stall_s']:>10.3f}{t['total_s']:>10.3f}{t['restore_GBps']:>14.2f}"
            f"{format_size(t['pinned_bytes']):>10}  {'yes' if t['verified'] else 'NO'}"
        )
    print("(medians of the timed repetitions; GB/s = bytes / total_s / 1e9, decimal)")


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_results(out: str, rows: list[dict[str, Any]], env: dict[str, Any]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    _atomic_write(os.path.join(out, "results.csv"), buf.getvalue())
    _atomic_write(os.path.join(out, "env.json"), json.dumps(env, indent=2, default=str) + "\n")


def run(args: argparse.Namespace) -> int:
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    elif args.allow_host:
        device = torch.device("cpu")
    else:
        raise UserError(
            f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU "
            "here; run this on the GPU machine"
        )
    size = parse_size(args.size, "--size")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            raise UserError(f"--engines: {e!r} is not one of {', '.join(ENGINES)}")
    if args.targets < 1 or args.reps < 1:
        raise UserError("--targets and --reps must be at least 1")
    out = args.out
    if os.path.exists(os.path.join(out, "results.csv")):
        raise UserError(f"--out {out} already holds results.csv; pass another --out")
    os.makedirs(out, exist_ok=True)
    targets = [os.path.join(args.scratch, f"t{i}") for i in range(args.targets)]
    for t in targets:
        os.makedirs(t, exist_ok=True)
    free = shutil.disk_usage(args.scratch).free
    if free < size * 1.1:
        raise UserError(
            f"--scratch {args.scratch} has {format_size(free)} free; "
            f"a {format_size(size)} checkpoint needs more"
        )

    budget = Budget(args.max_s)
    env = environment(device, args.scratch)
    env["args"] = vars(args)
    env["bench_env"] = bench_environment([os.path.abspath(t) for t in targets])
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    kind = "cuda" if device.type == "cuda" else "HOST-EMULATED (not GPU numbers)"
    print(f"== state: {args.tensors} x float32, {format_size(size)} on {kind}", flush=True)
    try:
        state = make_state(size, args.tensors, device)
        sync(device)
        env["state_bytes"] = state_bytes(state)
        ref = copy_reference(state, device)
        env["reference_copy"] = ref
        print(
            f"== reference copy ({ref['host_buffer']}): "
            f"device->host {ref['d2h_GBps']:.2f} GB/s, host->device {ref['h2d_GBps']:.2f} GB/s",
            flush=True,
        )
        common: dict[str, Any] = {
            "device": "cuda" if device.type == "cuda" else "host-emulated",
            "checksums": not args.no_checksums,
        }
        for name in engines:
            options = dict(common)
            if name == "gds":
                options["io"] = "kvikio" if device.type == "cuda" else "emulated"
            print(f"== {name} {options}", flush=True)
            try:
                rows += run_engine(
                    name, options, targets, state, device, args.reps, budget, failures
                )
            except UserError as e:
                failures.append(f"{name}: {e}")
                print(f"!!! engine {name} failed: {e}", flush=True)
            except Exception as e:  # noqa: BLE001 - one engine's failure must not hide the others
                failures.append(f"{name}: {type(e).__name__}: {e}")
                print(f"!!! engine {name} failed: {type(e).__name__}: {e}", flush=True)
                traceback.print_exc()
    finally:
        env["failures"] = failures
        env["skipped_past_max_s"] = budget.skipped
        env["elapsed_s"] = budget.elapsed()
        write_results(out, rows, env)
        for t in targets:
            try:
                os.rmdir(t)
            except OSError:
                pass

    print("== medians")
    print_table(medians(rows))
    if any(r["engine"] == "gds" and r["gds_mode"] == "compat" for r in rows):
        print(f"!!! {COMPAT_WARNING} !!!")
    if device.type != "cuda":
        print("!!! host-emulated dry run: these are not GPU numbers !!!")
    for f in failures:
        print(f"FAILED: {f}")
    if budget.skipped:
        print(f"skipped past --max-s: {', '.join(budget.skipped)}")
    print(f"wrote {os.path.join(out, 'results.csv')} and env.json in {budget.elapsed():.0f} s")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except UserError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
