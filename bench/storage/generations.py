"""The lifecycle of a checkpoint name on its targets: the claim of a target list (`.targets`),
the marker of a save in progress (`.saving-SAVEID`, naming its process), and leftovers: files of
interrupted saves, recognised by their save id and removed by the next save of that name or by
`ckptbench clean` (see bench.storage.manifest for the layout they live in)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid

from bench.common.errors import UserError
from bench.storage.manifest import (
    MANIFEST,
    Manifest,
    checkpoint_dir,
    committed,
    fsync_dir,
    manifest_path,
)


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
            # Durable before its name: a power cut after the commit made the name durable
            # must not leave an empty record, which refuses every later save of NAME.
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _is_claim(filename: str) -> bool:
    """The target-list record, or the temporary file of one that a kill or a power cut left
    before its rename: neither is part of a save."""
    return filename == TARGETS_RECORD or filename.startswith(TARGETS_RECORD + ".tmp-")


def release(targets: list[str], name: str) -> None:
    """Drop the target-list record (and any temporary one a cut-short claim left) where that is
    all `Ti/NAME/` holds (a first save of NAME that failed): the name is free again for any list."""
    for t in targets:
        d = checkpoint_dir(t, name)
        try:
            files = os.listdir(d)
            if files and all(_is_claim(f) for f in files):
                for f in files:
                    os.unlink(os.path.join(d, f))
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
                with open(os.path.join(d, MANIFEST)) as mf:
                    keep_ids.add(Manifest.from_json(mf.read(), d).save_id)
            except (OSError, UserError):
                return []
        if "current" in listing[d]:
            with open(os.path.join(d, "current")) as cur:
                keep_ids.add(cur.read().strip())
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
        and not all(_is_claim(f) for f in os.listdir(checkpoint_dir(t, name)))
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
