"""Byte-for-byte comparison of a restored state with the source state, and, for a state restored
in place (no second copy to compare with), of the fingerprints taken of the source before the
save with those of the restored state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """None if `b` equals `a` exactly (keys, key types, container types, values, tensor bits);
    else the path of the first difference."""
    if isinstance(a, torch.Tensor):
        return None if isinstance(b, torch.Tensor) and same_tensor(a, b) else path or "(root)"
    if type(a) is not type(b):
        return f"{path or '(root)'} (type {type(a).__name__} vs {type(b).__name__})"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path or '(root)'} (keys differ)"
        for k in a:
            d = first_difference(a[k], b[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return f"{path or '(root)'} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b or (a != a and b != b) else path or "(root)"  # NaN equals NaN here


def _tensors(
    obj: Any, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, (*path, str(k)))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _tensors(v, (*path, str(i)))


def first_tensor_difference(a: Any, b: Any) -> str | None:
    """Looser check for baselines whose libraries change key types (DCP: int keys -> str):
    the same tensors under the same key paths, compared bit for bit."""
    ta, tb = dict(_tensors(a)), dict(_tensors(b))
    if set(ta) != set(tb):
        missing = sorted(set(ta) ^ set(tb))[:1]
        return f"tensor set differs at {'/'.join(missing[0]) if missing else '?'}"
    for k, t in ta.items():
        if not same_tensor(t, tb[k]):
            return "/".join(k)
    return None


def fingerprint(state: Any) -> list[tuple[str, str]]:
    """(path, digest) of every tensor of `state`, computed where its bytes are: xxh3 of a host
    tensor's bytes, wsum64 of a CUDA tensor's on the device. No copy of the state is made (a
    non-contiguous tensor is copied alone, one at a time)."""
    from bench.storage import checksums
    from bench.storage.tree import flatten

    out = []
    for path, t in flatten(state)[1]:
        flat = t.detach().contiguous().reshape(-1)
        flat = flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
        if flat.is_cpu:
            digest = checksums.checksum(flat.numpy())
        else:
            digest = checksums.device_checksum(flat)
        out.append((path, f"{t.dtype}{tuple(t.shape)}:{digest}"))
    return out


def first_fingerprint_difference(
    before: list[tuple[str, str]], after: list[tuple[str, str]]
) -> str | None:
    """None if the two fingerprints agree tensor for tensor, else the first tensor's path that
    differs."""
    if len(before) != len(after):
        return f"(root) ({len(before)} tensors vs {len(after)})"
    for (path, a), (_, b) in zip(before, after, strict=True):
        if a != b:
            return path
    return None
