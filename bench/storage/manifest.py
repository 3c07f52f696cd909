"""The checkpoint manifest: the state's structure, every tensor's place on disk, checksums.

A checkpoint named NAME saved over targets T0..Tn-1 is:
- `Ti/NAME/data-i.SAVEID.bin` for every target that holds data (the striped tensor bytes), where
  SAVEID is new for every save, and
- `T0/NAME/manifest.json`, written last and atomically (temp file, fsync, rename, fsync of the
  directory), ending in a line with its own xxh3 checksum. Without a manifest there is no
  checkpoint: a save that died before its commit is never taken for a complete one. The order of
  targets matters: the manifest lives in the first target, and extents name targets by index; the
  manifest records the list it was saved with and loading with another list is refused.
- `Ti/NAME/.targets` in every target: the target list that claimed NAME there, written before
  any data. An engine over another list that overlaps it may not save, delete or clean NAME
  there (its files would be taken for leftovers of its own).

Saving under an existing name writes the new generation beside the old one and switches by the
manifest's rename, so readers see the old checkpoint or the new one, never a mix; the old
generation's files are removed after the switch. While a save runs, each `Ti/NAME/` holds a
marker `.saving-SAVEID` naming its process. Files of a save whose process is gone (killed) are
leftovers: recognisable by their SAVEID, reported by `leftovers()`, and removed by the next save
of that name or by `clean()`.

The state tree is stored as tagged JSON nodes (bench.storage.tree); checksums are
bench.storage.checksums'; the lifecycle of a name on its targets (claims, markers, leftovers,
and reading its committed manifest: `generations.read`) is bench.storage.generations.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.common.errors import UserError
from bench.storage.checksums import checksum
from bench.storage.tree import dtype_name

FORMAT = "ckptbench-1"
MANIFEST = "manifest.json"
# The manifest ends with its own checksum, over the JSON text before it (plus the closing brace),
# so that a damaged manifest is refused even when the damage still parses as JSON.
SUM_KEY = ',"manifest_xxh3":"'


@dataclass
class TensorEntry:
    """One tensor: where it sits in the tree, its type, and its extents (target, offset, length)."""

    path: str
    dtype: str
    shape: list[int]
    nbytes: int
    extents: list[list[int]] = field(default_factory=list)
    xxh3: str | None = None  # xxh3-64 of the bytes, hashed on the host
    wsum64: str | None = None  # device_checksum of the bytes, computed where they were (GPU)


def tensor_entry(path: str, t: torch.Tensor) -> TensorEntry:
    return TensorEntry(
        path=path,
        dtype=dtype_name(t.dtype),
        shape=list(t.shape),
        nbytes=t.numel() * t.element_size(),
    )


_SEP = (",", ":")


class EntryTable:
    """The manifest text of a list of tensor entries whose place on disk is fixed, rendered once:
    a save adds only its checksums (`render`). The text is what `Manifest.to_json` writes for the
    same entries, so a reader cannot tell the two apart."""

    def __init__(self, entries: list[TensorEntry]) -> None:
        self.entries = entries
        self._heads = [self._head(e) for e in entries]

    @staticmethod
    def _head(e: TensorEntry) -> str:
        d = dict(e.__dict__)
        if list(d)[-2:] != ["xxh3", "wsum64"]:
            raise AssertionError("TensorEntry's checksum fields moved: EntryTable follows them")
        del d["xxh3"], d["wsum64"]
        return json.dumps(d, separators=_SEP)[:-1] + ',"xxh3":'

    def update(self, indices: list[int]) -> None:
        """Render these entries again (their extents changed)."""
        for i in indices:
            self._heads[i] = self._head(self.entries[i])

    def render(self, xxh3: list[str | None], wsum64: list[str | None]) -> str:
        """The JSON list of the entries with these checksums (hex digests, or None)."""
        return (
            "["
            + ",".join(
                f'{h}{_jstr(x)},"wsum64":{_jstr(w)}}}'
                for h, x, w in zip(self._heads, xxh3, wsum64, strict=True)
            )
            + "]"
        )


def _jstr(v: str | None) -> str:
    """A checksum as JSON: its digits, hex and '-' only, need no escaping."""
    return "null" if v is None else f'"{v}"'


@dataclass
class Manifest:
    """Everything needed to find, load and verify a checkpoint."""

    name: str
    engine: str
    targets: list[str]
    files: dict[int, dict[str, Any]]  # target index -> {"file": relative name, "bytes": size}
    tensors: list[TensorEntry]
    tree: Any
    checksums: bool
    payload_bytes: int
    save_id: str = ""
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)
    # The tree's and the tensors' JSON text, where a save plan rendered them already
    # (bench.storage.plan): written as they are instead of `tree` and `tensors`.
    tree_json: str | None = field(default=None, repr=False, compare=False)
    tensors_json: str | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> str:
        d = {
            "format": self.format,
            "name": self.name,
            "engine": self.engine,
            "targets": self.targets,
            "files": {str(k): v for k, v in self.files.items()},
            "checksums": "xxh3_64" if self.checksums else None,
            "payload_bytes": self.payload_bytes,
            "save_id": self.save_id,
            "extra": self.extra,
        }
        head = json.dumps(d, separators=_SEP)
        tree = self.tree_json
        if tree is None:
            tree = json.dumps(self.tree, separators=_SEP)
        tensors = self.tensors_json
        if tensors is None:
            tensors = json.dumps([t.__dict__ for t in self.tensors], separators=_SEP)
        body = f'{head[:-1]},"tree":{tree},"tensors":{tensors}}}'
        return f'{body[:-1]}{SUM_KEY}{checksum(body.encode())}"}}\n'

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        head, sep, tail = text.rstrip("\n").rpartition(SUM_KEY)
        if not sep or checksum((head + "}").encode()) + '"}' != tail:
            raise UserError(f"{where}: manifest is damaged (its checksum is missing or wrong)")
        try:
            d = json.loads(head + "}")
            if d.get("format") != FORMAT:
                raise UserError(f"{where}: not a {FORMAT} manifest (format {d.get('format')!r})")
            return cls(
                name=d["name"],
                engine=d["engine"],
                targets=list(d["targets"]),
                files={int(k): v for k, v in d["files"].items()},
                tensors=[TensorEntry(**t) for t in d["tensors"]],
                tree=d["tree"],
                checksums=d["checksums"] is not None,
                payload_bytes=int(d["payload_bytes"]),
                save_id=str(d["save_id"]),
                extra=d.get("extra", {}),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{where}: manifest is damaged ({type(e).__name__}: {e})") from None


def checkpoint_dir(target: str, name: str) -> str:
    return os.path.join(target, name)


def manifest_path(targets: list[str], name: str) -> str:
    return os.path.join(checkpoint_dir(targets[0], name), MANIFEST)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(targets: list[str], manifest: Manifest, text: str | None = None) -> None:
    """Write the manifest atomically: temp file, fsync, rename, fsync the directory. `text`: its
    `to_json()`, where the caller rendered it already (while its data files were written)."""
    final = manifest_path(targets, manifest.name)
    tmp = f"{final}.tmp-{manifest.save_id or uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        f.write(manifest.to_json() if text is None else text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(final))


def uncommit(targets: list[str], name: str) -> None:
    """Remove an existing manifest (durably) before its data files are overwritten."""
    path = manifest_path(targets, name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(path))


def new_save_id() -> str:
    return uuid.uuid4().hex[:16]


def data_file_name(t: int, save_id: str) -> str:
    return f"data-{t}.{save_id}.bin"


def committed(targets: list[str], name: str) -> Manifest | None:
    """The committed manifest of `name` if there is a readable one, else None (no checks)."""
    try:
        with open(manifest_path(targets, name)) as f:
            return Manifest.from_json(f.read(), manifest_path(targets, name))
    except (OSError, UserError):
        return None
