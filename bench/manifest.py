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

The state tree (nested dicts, OrderedDicts, lists, tuples; tensors; ints, floats, bools, strings
and None, also as keys) is stored as tagged JSON nodes so that keys and container types round-trip.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

from bench.errors import UserError

FORMAT = "ckptbench-1"
MANIFEST = "manifest.json"
# The manifest ends with its own checksum, over the JSON text before it (plus the closing brace),
# so that a damaged manifest is refused even when the damage still parses as JSON.
SUM_KEY = ',"manifest_xxh3":"'


def checksum(view: Any) -> str:
    """xxh3-64 of a bytes-like object, as 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(view)


WSUM_PIECE = 1 << 24  # words per step of device_checksum (bounds its temporary memory)


def device_checksum(mem: torch.Tensor) -> str:
    """A checksum of a flat uint8 tensor computed by torch kernels where the bytes are (on the
    GPU for a CUDA tensor), so that checking device memory needs no copy to the host.

    Algorithm `wsum64`: the bytes as little-endian 32-bit words w_1..w_n (the last one
    zero-padded), S1 = sum of w_i and S2 = sum of i * w_i, both modulo 2^64, and the byte count.
    Like Fletcher's checksum it catches any change of one word and any swap of two different
    words; it is not a cryptographic hash. Modular sums do not depend on the order of the
    reduction, so CPU and GPU give the same digest.
    """
    nbytes = mem.numel()
    if mem.data_ptr() % 4:
        mem = mem.clone()  # a 32-bit view needs 4-byte alignment
    full = nbytes // 4 * 4
    if nbytes > full:
        tail = torch.zeros(4, dtype=torch.uint8, device=mem.device)
        tail[: nbytes - full] = mem[full:]
        words = torch.cat([mem[:full], tail]).view(torch.int32)
    else:
        words = mem[:full].view(torch.int32)
    s1 = torch.zeros((), dtype=torch.int64, device=mem.device)
    s2 = torch.zeros((), dtype=torch.int64, device=mem.device)
    for lo in range(0, words.numel(), WSUM_PIECE):
        w = words[lo : lo + WSUM_PIECE].to(torch.int64) & 0xFFFFFFFF
        i = torch.arange(lo + 1, lo + 1 + w.numel(), dtype=torch.int64, device=mem.device)
        s1 += w.sum()
        s2 += (w * i).sum()  # int64 arithmetic wraps modulo 2^64 on CPU and GPU alike
    mask = (1 << 64) - 1
    return f"{int(s1) & mask:016x}{int(s2) & mask:016x}-{nbytes:x}"


def entry_matches(e: TensorEntry, mem: Any) -> bool:
    """Whether the bytes of tensor `e` (a flat uint8 numpy array or tensor) match its
    checksum; True when it has none."""
    if e.xxh3 is not None:
        host = mem.numpy() if isinstance(mem, torch.Tensor) else mem
        return checksum(host) == e.xxh3
    if e.wsum64 is not None:
        t = torch.from_numpy(mem) if not isinstance(mem, torch.Tensor) else mem
        return device_checksum(t) == e.wsum64
    return True


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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise UserError(f"manifest: unknown dtype {name!r}")
    return dt


_SCALARS = (int, float, str, bool, type(None))


def flatten(state: Any) -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    """Encode a state tree as JSON nodes; tensors are replaced by indexes into the list returned."""
    tensors: list[tuple[str, torch.Tensor]] = []

    def enc_key(k: Any, path: str) -> Any:
        if isinstance(k, _SCALARS):
            return {"v": k}
        if isinstance(k, tuple):
            return {"tuple": [enc_key(x, path) for x in k]}
        raise UserError(f"state{path}: cannot store a key of type {type(k).__name__}")

    def enc(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.is_sparse or obj.layout != torch.strided:
                raise UserError(f"state{path}: only dense (strided) tensors can be stored")
            tensors.append((path, obj))
            return {"T": len(tensors) - 1}
        if isinstance(obj, dict):
            tag = "odict" if isinstance(obj, OrderedDict) else "dict"
            if type(obj) not in (dict, OrderedDict):
                raise UserError(f"state{path}: cannot store a {type(obj).__name__}")
            return {tag: [[enc_key(k, path), enc(v, f"{path}[{k!r}]")] for k, v in obj.items()]}
        if type(obj) in (list, tuple):
            tag = "list" if isinstance(obj, list) else "tuple"
            return {tag: [enc(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
        if isinstance(obj, _SCALARS):
            return {"v": obj}
        raise UserError(
            f"state{path}: cannot store a value of type {type(obj).__name__} "
            "(tensors, dicts, lists, tuples, ints, floats, bools, strings and None can)"
        )

    return enc(state, ""), tensors


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
            "tree": self.tree,
            "tensors": [t.__dict__ for t in self.tensors],
        }
        body = json.dumps(d, separators=(",", ":"))
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


def commit(targets: list[str], manifest: Manifest) -> None:
    """Write the manifest atomically: temp file, fsync, rename, fsync the directory."""
    final = manifest_path(targets, manifest.name)
    tmp = f"{final}.tmp-{manifest.save_id or uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        f.write(manifest.to_json())
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


def _marker(save_id: str) -> str:
    return f".saving-{save_id}"


TARGETS_RECORD = ".targets"


def _record_path(target: str, name: str) -> str:
    return os.path.join(checkpoint_dir(target, name), TARGETS_RECORD)


def _recorded(target: str, name: str) -> list[str] | None:
    """The target list that claimed `target/name` (see `claim`), or None if none did."""
    path = _record_path(target, name)
    try:
        with open(path) as f:
            got = json.load(f)["targets"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"checkpoint {name!r}: cannot read {path} ({e}); remove it by hand"
        ) from None
    return [str(t) for t in got]


def check_claim(targets: list[str], name: str) -> None:
    """Refuse (UserError) when a folder `Ti/NAME` belongs to a checkpoint of another target list:
    saving or deleting there would destroy that checkpoint's stripe."""
    mine = [os.path.realpath(t) for t in targets]
    for t in targets:
        theirs = _recorded(t, name)
        if theirs is not None and theirs != mine:
            raise UserError(
                f"target {t}: already holds checkpoint {name!r} of the targets {theirs}; with "
                f"{list(targets)} it would be destroyed: use another name, or the same targets "
                "in the same order"
            )


def claim(targets: list[str], name: str) -> None:
    """Record in every `Ti/NAME/` which target list the checkpoint `name` there belongs to, after
    checking (`check_claim`) that no other list holds it; nothing is written on a refusal."""
    check_claim(targets, name)
    body = json.dumps({"targets": [os.path.realpath(t) for t in targets]})
    for t in targets:
        path = _record_path(t, name)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, path)


def release(targets: list[str], name: str) -> None:
    """Drop the target-list record where it is all that `Ti/NAME/` holds (a first save of NAME
    that failed): the name is free again for any list."""
    for t in targets:
        d = checkpoint_dir(t, name)
        try:
            if os.listdir(d) == [TARGETS_RECORD]:
                os.unlink(os.path.join(d, TARGETS_RECORD))
        except FileNotFoundError:
            pass


def begin(targets: list[str], name: str, save_id: str) -> None:
    """Create the checkpoint directories and mark this save as running (for leftover checks)."""
    info = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    for t in targets:
        d = checkpoint_dir(t, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, _marker(save_id)), "w") as f:
            f.write(info)


def _save_id_of(filename: str) -> str | None:
    """The save a file in a checkpoint directory belongs to, or None if it is not one of ours."""
    if filename.startswith(".saving-"):
        return filename[len(".saving-") :]
    for prefix in (MANIFEST + ".tmp-", "gen-", "current.tmp-"):
        if filename.startswith(prefix):
            return filename[len(prefix) :]
    if filename.startswith("data-") and filename.endswith(".bin") and filename.count(".") == 2:
        return filename.split(".")[1]
    return None


def _alive(marker_path: str) -> bool:
    """Whether the process that wrote this marker still runs (on this host)."""
    try:
        with open(marker_path) as f:
            info = json.load(f)
        if info.get("host") != socket.gethostname():
            return True  # cannot tell: leave another host's save alone
        os.kill(int(info["pid"]), 0)
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def committed(targets: list[str], name: str) -> Manifest | None:
    """The committed manifest of `name` if there is a readable one, else None (no checks)."""
    try:
        with open(manifest_path(targets, name)) as f:
            return Manifest.from_json(f.read(), manifest_path(targets, name))
    except (OSError, UserError):
        return None


def leftovers(targets: list[str], name: str, keep: str | None = None) -> list[str]:
    """Files of interrupted saves of `name`: of no committed generation, and their writer gone.

    Committed generations are those named by a manifest or a baseline's pointer found in any of
    the targets (so a wrong target order never makes committed data look like leftovers), plus
    `keep`. If a manifest exists but cannot be read, nothing is called a leftover: its data may
    still be worth recovering by hand.
    """
    keep_ids = {keep} if keep else set()
    listing: dict[str, list[str]] = {}
    for t in targets:
        d = checkpoint_dir(t, name)
        try:
            listing[d] = sorted(os.listdir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if MANIFEST in listing[d]:
            try:
                with open(os.path.join(d, MANIFEST)) as f:
                    keep_ids.add(Manifest.from_json(f.read(), d).save_id)
            except (OSError, UserError):
                return []
        if "current" in listing[d]:
            with open(os.path.join(d, "current")) as f:
                keep_ids.add(f.read().strip())
    out = []
    mine = [os.path.realpath(t) for t in targets]
    for t in targets:
        d = checkpoint_dir(t, name)
        if d not in listing:
            continue
        files = listing[d]
        try:
            theirs = _recorded(t, name)
        except UserError:
            continue  # an unreadable claim: leave the folder alone
        # A folder that a checkpoint of another target list claimed: its data and manifest
        # files are that checkpoint's, however they look from here.
        foreign = theirs is not None and theirs != mine
        live = {
            _save_id_of(f) for f in files if f.startswith(".saving-") and _alive(os.path.join(d, f))
        }
        for f in files:
            if foreign and f.startswith(("data-", MANIFEST)):
                continue
            sid = _save_id_of(f)
            if sid is not None and sid not in keep_ids and sid not in live:
                out.append(os.path.join(d, f))
    return out


def remove_files(paths: list[str]) -> None:
    """Remove files or directories (missing ones are fine), durably."""
    dirs = set()
    for p in paths:
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
            dirs.add(os.path.dirname(p))
        except FileNotFoundError:
            pass
    for d in dirs:
        fsync_dir(d)


def generation_files(targets: list[str], name: str, save_id: str) -> list[str]:
    """Every file of one save of `name` (data, temp manifest, marker) on every target."""
    out = []
    for t in targets:
        d = checkpoint_dir(t, name)
        try:
            out += [os.path.join(d, f) for f in os.listdir(d) if _save_id_of(f) == save_id]
        except FileNotFoundError:
            pass
    return out


def status(targets: list[str], name: str) -> str:
    """`complete`, `incomplete` (an interrupted save left files and nothing is committed),
    or `absent`."""
    if committed(targets, name) is not None:
        return "complete"
    if leftovers(targets, name) or any(
        os.path.exists(checkpoint_dir(t, name))
        and set(os.listdir(checkpoint_dir(t, name))) - {TARGETS_RECORD}
        for t in targets
    ):
        return "incomplete"
    return "absent"


def read(targets: list[str], name: str) -> Manifest:
    """The committed manifest of checkpoint `name`; a clear error if missing or for other targets."""
    path = manifest_path(targets, name)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        if leftovers(targets, name):
            raise UserError(
                f"checkpoint {name!r} is incomplete: a save was interrupted before its commit "
                f"({path} does not exist; its leftover files are removed by the next save)"
            ) from None
        raise UserError(
            f"no complete checkpoint {name!r}: {path} does not exist "
            "(never saved, interrupted before its commit, or saved with another first target)"
        ) from None
    m = Manifest.from_json(text, path)
    saved = [os.path.realpath(t) for t in m.targets]
    given = [os.path.realpath(t) for t in targets]
    if saved != given:
        raise UserError(
            f"checkpoint {name!r} was saved on targets {m.targets}, "
            f"but the engine was created with {list(targets)}; use the same targets in the same order"
        )
    return m


def tensor_entry(path: str, t: torch.Tensor) -> TensorEntry:
    return TensorEntry(
        path=path,
        dtype=_dtype_name(t.dtype),
        shape=list(t.shape),
        nbytes=t.numel() * t.element_size(),
    )
