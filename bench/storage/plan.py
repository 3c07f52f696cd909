"""A save plan: what saving a state of one layout needs besides its bytes, built once per layout.

A training loop saves the same layout again and again: the same keys, the same tensors' dtypes
and shapes, only the bytes (and a few scalars, such as a learning rate) change. Encoding the
tree, making an entry per tensor and rendering the manifest cost microseconds per tensor, which
a state of 20,000 tensors turns into a stall of hundreds of milliseconds (issue 32). So a save
walks the state cheaply (`walk`: the tensors in order, the containers' types, keys and lengths,
and the scalar values), and while that walk matches the plan of the last save (`SavePlan.fits`)
the plan is used again: the tree with holes for its scalars, the tensor entries as the engine
placed them, and their manifest text (bench.storage.manifest.EntryTable). The engine keeps its
own placement beside it (offsets in staging, pieces, views).

A walk that meets anything `tree.flatten` would refuse or treat otherwise (a dict subclass, an
unknown type, a sparse tensor) returns None, and the engine builds a new plan with `flatten`,
which raises the user's error where there is one.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.storage.manifest import EntryTable, TensorEntry, tensor_entry
from bench.storage.tree import HOLE, flatten

_SCALARS = (int, float, str, bool, type(None))
_SEP = (",", ":")  # the manifest's JSON separators


class _Other(Exception):
    """The walk met something only `flatten` knows how to handle (or refuse)."""


@dataclass
class Walk:
    """One state, walked: its tensors in `flatten`'s order, what the tree's shape is made of
    (container types, keys and their types, lengths, scalar types) and its scalar values."""

    tensors: list[torch.Tensor]
    structure: list[Any]
    scalars: list[Any]
    dtypes: list[torch.dtype] = field(default_factory=list)
    shapes: list[torch.Size] = field(default_factory=list)
    cuda: list[bool] = field(default_factory=list)  # which tensors are in device memory


def walk(state: Any) -> Walk | None:
    """The state walked (about 0.6 us a tensor), or None where `flatten` must look at it."""
    w = Walk([], [], [])
    try:
        _walk(state, w)
    except (_Other, RecursionError):
        return None
    ts = w.tensors
    layouts = {t.layout for t in ts}
    if layouts and layouts != {torch.strided}:
        return None
    w.dtypes = [t.dtype for t in ts]
    w.shapes = [t.shape for t in ts]
    w.cuda = [t.is_cuda for t in ts]
    return w


def _walk(obj: Any, w: Walk) -> None:
    if isinstance(obj, torch.Tensor):
        w.tensors.append(obj)
        return
    t = type(obj)
    if t is dict or t is OrderedDict:
        keys = tuple(obj)
        kinds = tuple(map(type, keys))
        if tuple in kinds:  # a tuple key: its items' types too (1 and True are equal keys)
            kinds = tuple(_key_kind(k) for k in keys)
        w.structure.append((t, keys, kinds))
        for v in obj.values():
            _walk(v, w)
    elif t is list or t is tuple:
        w.structure.append((t, len(obj)))
        for v in obj:
            _walk(v, w)
    elif t in _SCALARS:
        w.structure.append(t)
        w.scalars.append(obj)
    else:
        raise _Other


def _key_kind(k: Any) -> Any:
    return (tuple, tuple(_key_kind(x) for x in k)) if type(k) is tuple else type(k)


_MARK = "\x00ckptbench-scalar\x00"


def _hole_text(o: Any) -> str:
    if o is HOLE:
        return _MARK
    raise TypeError(f"{type(o).__name__} in an encoded tree")


class SavePlan:
    """The layout-level half of a save of states shaped like `w`: the tree (with its scalars
    apart), the tensor entries (extents filled by the engine's placement, checksums empty) and
    their manifest text, the bytes. Built from the state itself with `flatten`."""

    def __init__(
        self, tree: Any, entries: list[TensorEntry], n_scalars: int, w: Walk | None
    ) -> None:
        self.tree = tree
        self.entries = entries
        self.nbytes = sum(e.nbytes for e in entries)
        # Without a walk there is nothing to match a later one against: the plan serves one save.
        self.structure = w.structure if w is not None else None
        self.dtypes = w.dtypes if w is not None else []
        self.shapes = w.shapes if w is not None else []
        self.cuda = w.cuda if w is not None else []
        text = json.dumps(tree, separators=_SEP, default=_hole_text)
        parts = text.split(json.dumps(_MARK))
        # A key or string that happened to hold the mark would cut the tree wrongly: then the
        # tree is encoded whole at every save.
        self._tree_parts = parts if len(parts) == n_scalars + 1 else None
        self._last: tuple[str, str] | None = None  # (scalars as JSON, tree text) last rendered
        self.table: EntryTable | None = None

    @classmethod
    def build(cls, state: Any, w: Walk | None) -> tuple[SavePlan, list[torch.Tensor], list[Any]]:
        """A plan for `state` (walked as `w`, or None), encoded with `flatten` (which raises the
        user's error, if any); with the state's tensors and scalar values, for this save."""
        scalars: list[Any] = []
        tree, tensors = flatten(state, scalars)
        entries = [tensor_entry(p, t) for p, t in tensors]
        return cls(tree, entries, len(scalars), w), [t for _, t in tensors], scalars

    def fits(self, w: Walk | None) -> bool:
        """The walk of a new state has this plan's layout (keys, types, dtypes, shapes, which
        tensors are in device memory)."""
        return (
            w is not None
            and self.structure is not None
            and w.structure == self.structure
            and w.dtypes == self.dtypes
            and w.shapes == self.shapes
            and w.cuda == self.cuda
        )

    def placed(self) -> None:
        """The engine filled the entries' extents: render their manifest text once."""
        self.table = EntryTable(self.entries)

    def tree_json(self, scalars: list[Any]) -> str:
        """The tree's JSON text with these scalar values (as `json.dumps` writes the tree)."""
        if self._tree_parts is None:
            return json.dumps(_fill(self.tree, iter(scalars)), separators=_SEP)
        key = json.dumps(scalars, separators=_SEP)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        parts = self._tree_parts
        out = [parts[0]]
        for v, p in zip(scalars, parts[1:], strict=True):
            out.append(json.dumps(v))
            out.append(p)
        text = "".join(out)
        self._last = (key, text)
        return text

    def tree_with(self, scalars: list[Any]) -> Any:
        """The tree as JSON nodes with these scalar values (for a reader of the manifest)."""
        return _fill(self.tree, iter(scalars))


def _fill(node: Any, values: Any) -> Any:
    if isinstance(node, dict):
        if node.keys() == {"v"} and node["v"] is HOLE:
            return {"v": next(values)}
        return {k: _fill(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, values) for v in node]
    return node
