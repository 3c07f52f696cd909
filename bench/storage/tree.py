"""The state tree codec: a state (nested dicts, OrderedDicts, lists, tuples; tensors; ints,
floats, bools, strings and None, also as keys) as tagged JSON nodes, so that keys and container
types round-trip, with its tensors taken out in order."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from bench.common.errors import UserError


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise UserError(f"manifest: unknown dtype {name!r}")
    return dt


_SCALARS = (int, float, str, bool, type(None))


def flatten(
    state: Any, scalars: list[Any] | None = None
) -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    """Encode a state tree as JSON nodes; tensors are replaced by indexes into the list returned.
    With `scalars`, the scalar values of the tree (not its keys) are replaced by HOLE and listed
    there in order instead: the tree of a layout whose scalars (a learning rate) change between
    saves is encoded once (bench.storage.plan).

    Plain recursion over module functions, no closures: a recursive closure refers to itself
    through its cell, and that cycle kept the list of tensors (a whole restored state) alive
    until the cyclic collector ran, which then freed it inside a later save's stall (a 256 MiB
    state: 80-140 ms of a 17 ms snapshot; bench/PERF.md)."""
    tensors: list[tuple[str, torch.Tensor]] = []
    return _enc(state, "", tensors, scalars), tensors


def _enc_key(k: Any, path: str) -> Any:
    if isinstance(k, _SCALARS):
        return {"v": k}
    if isinstance(k, tuple):
        return {"tuple": [_enc_key(x, path) for x in k]}
    raise UserError(f"state{path}: cannot store a key of type {type(k).__name__}")


class _Hole:
    """Where a scalar value goes in a tree encoded with its scalars apart."""

    def __repr__(self) -> str:
        return "HOLE"


HOLE = _Hole()


def _enc(
    obj: Any, path: str, tensors: list[tuple[str, torch.Tensor]], scalars: list[Any] | None
) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.layout != torch.strided:
            raise UserError(f"state{path}: only dense (strided) tensors can be stored")
        tensors.append((path, obj))
        return {"T": len(tensors) - 1}
    if isinstance(obj, dict):
        tag = "odict" if isinstance(obj, OrderedDict) else "dict"
        if type(obj) not in (dict, OrderedDict):
            raise UserError(f"state{path}: cannot store a {type(obj).__name__}")
        return {
            tag: [
                [_enc_key(k, path), _enc(v, f"{path}[{k!r}]", tensors, scalars)]
                for k, v in obj.items()
            ]
        }
    if type(obj) in (list, tuple):
        tag = "list" if isinstance(obj, list) else "tuple"
        return {tag: [_enc(v, f"{path}[{i}]", tensors, scalars) for i, v in enumerate(obj)]}
    if isinstance(obj, _SCALARS):
        if scalars is not None:
            scalars.append(obj)
            return {"v": HOLE}
        return {"v": obj}
    raise UserError(
        f"state{path}: cannot store a value of type {type(obj).__name__} "
        "(tensors, dicts, lists, tuples, ints, floats, bools, strings and None can)"
    )


def unflatten(node: Any, tensors: list[torch.Tensor]) -> Any:
    """The inverse of `flatten`: rebuild the tree around loaded tensors."""
    if "T" in node:
        return tensors[node["T"]]
    if "v" in node:
        return node["v"]
    if "dict" in node or "odict" in node:
        items = node.get("dict", node.get("odict"))
        out = {} if "dict" in node else OrderedDict()
        for k, v in items:
            out[unflatten(k, tensors)] = unflatten(v, tensors)
        return out
    if "list" in node:
        return [unflatten(v, tensors) for v in node["list"]]
    if "tuple" in node:
        return tuple(unflatten(v, tensors) for v in node["tuple"])
    raise UserError(f"manifest: unknown node {sorted(node)}")
