"""Ways the baselines' own libraries can restore a checkpoint, side by side (issue 35).

Each baseline engine (torch-save, safetensors, dcp) saves a state of random float32 tensors into
one target once; then every way of loading that file is timed in turn, round by round, the page
cache dropped before each (root) and the file's pages checked gone (mincore). A restore ends when
every byte of the state has been read into the process's own memory (or the library's lazily
mapped tensors have been copied out): a mapping left untouched would move the read outside the
clock. Each load is compared with the saved state afterwards, untimed. Prints the median per way
and its ratio to the engine's current loader (the first of its ways).

    .venv/bin/python scripts/peer_loaders.py [--size 256MiB] [--tensor 64MiB] [--reps 3]
        [--target DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from bench import engines
from bench.common import sizes
from bench.measure import timers
from bench.storage.tree import flatten

Way = Callable[[str, Any], Any]  # (checkpoint name, a state to restore into) -> the state


def _state(size: int, tensor: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = tensor // 4
    return {f"w{i}": torch.rand(n, generator=g) for i in range(max(1, size // tensor))}


def _private(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Lazily mapped tensors copied into anonymous memory: the read happens here."""
    return {k: v.clone() for k, v in tensors.items()}


def _touch(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One byte of every page of each tensor read: the file's pages faulted in (readahead), the
    tensors left on the (private, copy-on-write) file mapping."""
    for v in tensors.values():
        b = v.view(-1).view(torch.uint8)
        int(b[::4096].sum())
    return tensors


def ways(eng: Any, engine: str) -> dict[str, Way]:
    """The loaders of `engine`, its current one first (fresh, then in place)."""
    if engine == "torch-save":
        f = os.path.join(eng.current_dir("ckpt"), "state.pt")

        def load(mmap: bool) -> Any:
            return torch.load(f, map_location="cpu", weights_only=True, mmap=mmap)

        def into(src: Any, dst: Any) -> Any:
            for k, v in dst.items():
                v.copy_(src[k])
            return dst

        return {
            "fresh: load (current)": lambda n, s: eng.load(n),
            "fresh: load(mmap) + clone": lambda n, s: _private(load(True)),
            "fresh: load(mmap) + touch pages": lambda n, s: _touch(load(True)),
            "into: load(mmap) + copy_ (current)": lambda n, s: eng.load(n, into=s),
            "into: load() + copy_": lambda n, s: into(load(False), s),
        }
    if engine == "safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        f = os.path.join(eng.current_dir("ckpt"), "state.safetensors")

        def st_into(backend: str, dst: Any) -> Any:
            vals = list(dst.values())
            with safe_open(f, framework="pt", device="cpu", backend=backend) as h:
                for i, k in enumerate(sorted(h.keys(), key=lambda k: int(k[1:]))):
                    vals[i].copy_(h.get_tensor(k))
            return dst

        return {
            "fresh: read() + load(bytes) (current)": lambda n, s: eng.load(n),
            "fresh: load_file (mmap) + touch pages": lambda n, s: _touch(load_file(f)),
            "fresh: load_file (mmap) + clone": lambda n, s: _private(load_file(f)),
            "fresh: load_file(backend=pread)": lambda n, s: load_file(f, backend="pread"),
            "into: safe_open (mmap) + copy_ (current)": lambda n, s: eng.load(n, into=s),
            "into: safe_open(backend=pread) + copy_": lambda n, s: st_into("pread", s),
        }
    if engine == "dcp":
        import torch.distributed.checkpoint as dcp

        d = eng.current_dir("ckpt")

        def template(dst: Any) -> Any:
            empty = {k: torch.empty_like(v) for k, v in dst.items()}
            dcp.load(empty, storage_reader=dcp.FileSystemReader(d), no_dist=True)
            return empty

        return {
            "fresh: empty planner (current)": lambda n, s: eng.load(n),
            "fresh: dcp.load into torch.empty of the shapes": lambda n, s: template(s),
            "into: dcp.load (current)": lambda n, s: eng.load(n, into=s),
        }
    raise SystemExit(f"no ways for {engine}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--tensor", default="64MiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--target", default=None)
    ap.add_argument("--engines", default="torch-save,safetensors,dcp")
    a = ap.parse_args(argv)
    size, tensor = sizes.parse_size(a.size), sizes.parse_size(a.tensor)
    src = _state(size, tensor)
    why = timers.drop_page_cache()
    if why:
        print(f"warning: {why}; restores may read from memory", file=sys.stderr)
    root = a.target or tempfile.mkdtemp(prefix="peer-loaders-")
    print(f"{size >> 20} MiB in {len(src)} tensors of {tensor >> 20} MiB, {a.reps} rounds, {root}")
    for engine in a.engines.split(","):
        eng = engines.create(engine, [root])
        try:
            eng.save(src, "ckpt").wait()
            files = eng.cached_files("ckpt")
            w = ways(eng, engine)
            times: dict[str, list[float]] = {k: [] for k in w}
            for _ in range(a.reps):
                for label, fn in w.items():
                    into = {k: torch.zeros_like(v) for k, v in src.items()}
                    timers.drop_page_cache()
                    timers.evict_files(files)
                    left = timers.resident_bytes(files)
                    t0 = time.perf_counter_ns()
                    out = fn("ckpt", into)
                    times[label].append((time.perf_counter_ns() - t0) / 1e9)
                    # safetensors' dicts come keyed t0, t1, ...: in the order of the index
                    got = dict(out) if engine == "safetensors" else dict(flatten(out)[1])
                    if all(k[1:].isdigit() for k in got):
                        got = {k: got[k] for k in sorted(got, key=lambda k: int(k[1:]))}
                    else:
                        got = dict(flatten(out)[1])
                    ok = len(got) == len(src) and all(
                        torch.equal(a, b) for a, b in zip(got.values(), src.values(), strict=True)
                    )
                    if not ok or left > 0:
                        print(f"  {engine} {label}: equal={ok} resident_before={left}")
                    del out, got, into
            base = statistics.median(next(iter(times.values())))
            base_into = None
            for label, ts in times.items():
                m = statistics.median(ts)
                if label.startswith("into") and base_into is None:
                    base_into = m
                ref = base_into if label.startswith("into") else base
                spread = f"{min(ts):.3f}-{max(ts):.3f}"
                print(
                    f"{engine:12} {label:48} median {m:.3f} s ({spread}) "
                    f"{size / m / 2**30:5.2f} GiB/s  x{m / (ref or m):.2f}"
                )
        finally:
            eng.delete("ckpt")
            eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
