"""gds's cuFile buffer registrations (kvikio's memory_register): made in `warm()`, outside the
timed region, as GDS users are told to for buffers used again and again; dropped by `release()`
with the views of the state they keep. Functions taking `self` are methods of the engine
(bench.engines.gds.engine.Gds), kept here by their job, typed by what they use of it
(bench.engines.gds.parts)."""

from __future__ import annotations

from typing import Any

import torch

from bench.engines.gds import cuda, kvikio_lib
from bench.engines.gds.parts import GdsEngine
from bench.storage.tree import flatten


def register(self: GdsEngine, state: Any) -> None:
    """Register the state's device memory, and the coalescing buffer, with cuFile (kvikio's
    memory_register): once per CUDA allocation, which kvikio registers whole and refuses
    to register twice; a failure is recorded with the tensors it left out, and the other
    allocations are still registered."""
    kv = self._kvikio
    if kv.defaults.is_compat_mode_preferred():
        self._register_note = "not registered: kvikio is in compat mode"
        return
    _, tensors = flatten(state)
    if self._cbuf is not None and cuda.on_device(self._cbuf):
        tensors = [*tensors, ("(the coalescing buffer)", self._cbuf)]
    groups: dict[int, tuple[int, torch.Tensor, list[str]]] = {}
    failed: list[tuple[str, str]] = []
    ptr_of = {path: t.data_ptr() for path, t in tensors}
    for path, t in tensors:
        # A non-contiguous tensor is copied at save time: its copy is not registered.
        if not (cuda.on_device(t) and t.numel() and t.is_contiguous()):
            continue
        mem = t.detach().reshape(-1).view(torch.uint8)
        try:
            base, size = cuda.allocation_of(mem)
        except Exception as e:  # kvikio's register would fail the same way
            failed.append((path, kvikio_lib._one_line(e)))
            continue
        if base in groups:
            groups[base][2].append(path)
        else:
            groups[base] = (size, mem, [path])
    register = kvikio_lib._memory_fn(kv, "memory_register")
    for base, (size, mem, paths) in groups.items():
        try:
            register(cuda.kvikio_buffer(mem, True))
        except Exception as e:  # registration only helps: go on without it, and say so
            failed.extend((p, kvikio_lib._one_line(e)) for p in paths)
            continue
        self._registered[base] = (mem, size)
        for p in paths:
            self._registered_ptrs[ptr_of[p]] = base
    self._register_failed = failed
    self._register_note = ""
    if failed:
        first = "; ".join(f"{p}: {why}" for p, why in failed[:3])
        self._register_note = f"{len(failed)} tensors not registered ({first})"[:400]


def deregister(self: GdsEngine) -> None:
    self._registered_ptrs.clear()
    self._register_failed = []
    if not self._registered:
        return
    deregister = kvikio_lib._memory_fn(self._kvikio, "memory_deregister")
    for mem, _ in self._registered.values():
        try:
            deregister(cuda.kvikio_buffer(mem, True))
        except Exception:  # the buffers are released with the engine anyway
            pass
    self._registered.clear()


def deregister_buffer(self: GdsEngine, buf: torch.Tensor) -> None:
    """Before the coalescing buffer is freed: its registration goes, and with it that of
    the tensors sharing its allocation (`warm()` registers them again)."""
    if buf.numel() and buf.data_ptr() in self._registered_ptrs:
        self._deregister()
