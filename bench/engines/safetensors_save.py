"""`safetensors` baseline: the format most users already have.

`safetensors.torch.save_file` of the state's tensors (flattened by bench.storage.tree; the structure and
the non-tensor values go into the file's metadata as JSON) into one file `state.safetensors` in
the first target (a new generation directory committed atomically, see bench.engines.baseline),
then fsync of the file and the directory. Synchronous: the stall is the whole durable write.
"""

from __future__ import annotations

import inspect
import json
import os
from functools import cache
from typing import Any

import torch

from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, PendingSave, StateSize
from bench.engines.baseline import BaselineEngine
from bench.storage.tree import flatten, unflatten

FILE = "state.safetensors"
TREE_KEY = "ckptbench_tree"


class Safetensors(BaselineEngine):
    name = "safetensors"
    traits = Traits(
        stall="durable",
        from_device=False,
        o_direct=False,
        page_cache=True,
        stripes=False,
        host_copies=1,
        baseline=True,
        single_writer=True,
        summary="safetensors.torch.save_file to one file in the first target, fsync",
    )

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        try:
            import safetensors.torch  # noqa: F401
        except ImportError as e:
            return f"safetensors is not installed ({e}); pip install safetensors"
        return None

    def save(self, state: Any, name: str) -> PendingSave:
        from safetensors.torch import save_file

        def write(gen: str) -> None:
            tree, tensors = flatten(state)
            flat = {f"t{i}": t.detach().contiguous() for i, (_, t) in enumerate(tensors)}
            path = os.path.join(gen, FILE)
            save_file(flat, path, metadata={TREE_KEY: json.dumps(tree)})
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        return self._sync_save(state, name, write)

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """save_file writes from the tensors' memory (measured: no copy of the state on the
        host); the restore reads the file into the new tensors (to a GPU through the mapped
        file, a tensor at a time: its pages are page cache, which the kernel reclaims); in
        place, each tensor is taken from the mapped file (safe_open) and copied into the
        state's."""
        base = super().memory_plan(size, options)
        return MemoryPlan(
            save=size.nbytes if size.cuda else 0,  # not measured on CUDA: the whole state
            page_cache=base.page_cache,
            restore_host=size.largest if size.cuda else size.nbytes,
            restore_device=base.restore_device,
            in_place_host=size.largest,
        )

    def load(self, name: str, device: str = "cpu", checksums: bool = True, into: Any = None) -> Any:
        """safetensors' own `load_file(path, device=...)`, fully read before it returns: to a
        GPU the library copies every tensor from the mapped file onto the device (the reads
        happen inside those copies); to the host with `backend="pread"`, which reads the bytes
        into the tensors' own memory, where the default mapping would leave the reading to
        whoever touches the tensors later, outside the timed restore (measured against reading
        the whole file and `load(bytes)`, and against the mapping copied out:
        scripts/peer_loaders.py). `into`: each tensor taken from the mapped file and copied
        into the state's at once, inside the timed restore."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        if into is not None:
            return self._load_into(name, into)

        path = os.path.join(self.current_dir(name), FILE)
        with safe_open(path, framework="pt", device="cpu") as f:
            tree = json.loads(f.metadata()[TREE_KEY])
        if torch.device(device).type != "cpu":
            flat = load_file(path, device=device)
        elif _has_pread():
            flat = load_file(path, device="cpu", backend="pread")
        else:  # an older safetensors: the mapping's tensors copied out, every byte read
            flat = {k: t.clone() for k, t in load_file(path, device="cpu").items()}
        return unflatten(tree, [flat[f"t{i}"] for i in range(len(flat))])

    def _load_into(self, name: str, into: Any) -> Any:
        from safetensors import safe_open

        from bench.engines.baseline import load_into

        path = os.path.join(self.current_dir(name), FILE)
        with safe_open(path, framework="pt", device="cpu") as f:
            keys = sorted(f.keys(), key=lambda k: int(k[1:]))
            return load_into(into, (f.get_tensor(k) for k in keys), len(keys))


@cache
def _has_pread() -> bool:
    """safetensors' loaders take `backend="pread"` (newer releases)."""
    from safetensors.torch import load_file

    return "backend" in inspect.signature(load_file).parameters
