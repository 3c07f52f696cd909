"""Shared housekeeping of the baselines: where their library writes, and an atomic switch.

A baseline writes into the first target only, into a fresh generation directory
`NAME/gen-SAVEID/`, and commits by replacing the pointer file `NAME/current` atomically (temp
file, fsync, rename, fsync of the directory). Readers see the old checkpoint or the new one;
a save killed midway leaves only a generation directory that `leftovers()` recognises and the
next save of that name removes (see bench.storage.manifest for the marker and leftover rules).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from typing import Any, ClassVar

from bench.common.errors import UserError
from bench.common.traits import Traits
from bench.engines.base import MemoryPlan, StateSize, build_options, check_name, check_targets
from bench.measure.detail import Detail
from bench.storage import generations, manifest

POINTER = "current"


class BaselineEngine:
    """Base of the baselines: subclasses write a generation directory in `save()`."""

    name: ClassVar[str]
    traits: ClassVar[Traits]
    restore_mode = "host"

    def __init__(self, targets: list[str], **options: Any) -> None:
        self.options = build_options(self.name, options)
        self.targets = check_targets(self.name, targets)

    @property
    def pinned_bytes(self) -> int:
        """Host staging memory the engine holds between saves."""
        return 0

    @classmethod
    def unavailable(cls, options: dict[str, Any] | None = None) -> str | None:
        return None

    @classmethod
    def memory_plan(cls, size: StateSize, options: Any) -> MemoryPlan:
        """A library that writes from the tensors and reads the state back into new host memory
        (then to the device on CUDA), its writes through the page cache; no restore in place
        unless the engine says how."""
        return MemoryPlan(
            save=size.largest if size.cuda else 0,  # a device tensor copied to the host to write
            page_cache=size.nbytes if cls.traits.page_cache else 0,
            restore_host=size.nbytes,
            restore_device=size.nbytes if size.cuda else 0,
            in_place_why="it restores only into new memory",
        )

    def ckpt_dir(self, name: str) -> str:
        return manifest.checkpoint_dir(self.targets[0], check_name(name))

    def _committed_id(self, name: str) -> str | None:
        try:
            with open(os.path.join(self.ckpt_dir(name), POINTER)) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def _begin(self, name: str, save_id: str) -> str:
        """Clean leftovers of `name`, mark this save running; returns its generation directory."""
        keep = self._committed_id(name) or ""
        generations.remove_files(generations.leftovers(self.targets[:1], name, keep))
        generations.begin(self.targets[:1], name, save_id)
        gen = os.path.join(self.ckpt_dir(name), f"gen-{save_id}")
        os.makedirs(gen)
        return gen

    def _commit(self, name: str, save_id: str) -> None:
        """Point `current` at the new generation atomically, then drop the old one."""
        d = self.ckpt_dir(name)
        manifest.fsync_dir(os.path.join(d, f"gen-{save_id}"))
        previous = self._committed_id(name)
        tmp = os.path.join(d, f"{POINTER}.tmp-{save_id}")
        with open(tmp, "w") as f:
            f.write(save_id)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(d, POINTER))
        manifest.fsync_dir(d)
        manifest.fsync_dir(self.targets[0])
        # The old generation, and its marker if a kill cut short the cleanup of its own commit.
        old = []
        if previous and previous != save_id:
            old = generations.generation_files(self.targets[:1], name, previous)
        generations.remove_files(old + [os.path.join(d, f".saving-{save_id}")])

    def _sync_save(self, state: Any, name: str, write: Any, detail: Detail | None = None) -> Any:
        """A synchronous save: `write(gen_dir)` writes and fsyncs the library's files into a new
        generation directory, committed atomically after: durable when save() returns, so the
        clock's stall is the whole durable write."""
        from bench.engines.base import PendingSave, SaveResult
        from bench.storage.tree import flatten

        _, tensors = flatten(state)
        result = SaveResult(
            name=name,
            bytes=sum(t.numel() * t.element_size() for _, t in tensors),
            targets_used=1,
            detail=detail,
        )
        result.save_id = manifest.new_save_id()
        gen = self._begin(name, result.save_id)
        try:
            write(gen)
            self._commit(name, result.save_id)
        except BaseException:
            self._abort(name, result.save_id)
            raise
        result.pinned_bytes = self.pinned_bytes
        pending = PendingSave(result)
        pending.finish_now()
        return pending

    def _abort(self, name: str, save_id: str) -> None:
        generations.remove_files(generations.generation_files(self.targets[:1], name, save_id))

    def current_dir(self, name: str) -> str:
        """The committed generation of `name`; a UserError if there is none."""
        sid = self._committed_id(name)
        if sid is None:
            pointer = os.path.join(self.ckpt_dir(name), POINTER)
            state = (
                "is incomplete: a save was interrupted before its commit"
                if self.status(name) == "incomplete"
                else "does not exist"
            )
            raise UserError(f"checkpoint {name!r} {state} ({pointer} is missing)")
        return os.path.join(self.ckpt_dir(name), f"gen-{sid}")

    def status(self, name: str) -> str:
        """`complete`, `incomplete` (an interrupted save left files) or `absent`."""
        if self._committed_id(name):
            return "complete"
        d = self.ckpt_dir(name)
        return "incomplete" if os.path.isdir(d) and os.listdir(d) else "absent"

    def check(self, name: str, state: Any) -> None:
        """The libraries keep no checksums of their own: the byte comparison is the check."""

    def warm(self, state: Any) -> None:
        """Nothing to pre-allocate: the library allocates as it goes."""

    def wait_idle(self) -> None:
        """Nothing persists in the background (dcp's own waits for its last save)."""

    def gds_mode(self) -> str:
        return "none"

    def cached_files(self, name: str) -> list[str]:
        sid = self._committed_id(name)
        if sid is None:
            return []
        gen = os.path.join(self.ckpt_dir(name), f"gen-{sid}")
        return [
            os.path.join(gen, f)
            for f in sorted(os.listdir(gen))
            if os.path.isfile(os.path.join(gen, f))
        ]

    def delete(self, name: str) -> None:
        shutil.rmtree(self.ckpt_dir(name), ignore_errors=True)

    def close(self) -> None:
        pass

    def release(self) -> None:
        """Drop what is held between saves (nothing here; the next `warm()` makes it again)."""


def fsync_files(directory: str) -> None:
    """fsync every file in `directory` (a library's files, whose own fsyncs are not enough)."""
    for f in sorted(os.listdir(directory)):
        p = os.path.join(directory, f)
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def load_into(into: Any, tensors: Iterable[Any], count: int) -> Any:
    """Copy `count` restored tensors, taken one at a time from `tensors` (mapped from their file,
    or read one by one), into `into`'s, in place, and return `into`: a restore that holds no
    second copy of the state."""
    from bench.storage.tree import flatten

    dst = [t for _, t in flatten(into)[1]]
    if len(dst) != count:
        raise UserError(
            f"the checkpoint holds {count} tensors; the state to restore into has {len(dst)}"
        )
    for d, t in zip(dst, tensors, strict=True):
        if d.shape != t.shape or d.dtype != t.dtype:
            raise UserError(
                f"the checkpoint's tensor of {tuple(t.shape)} {t.dtype} cannot be restored into "
                f"one of {tuple(d.shape)} {d.dtype}"
            )
        d.copy_(t)
    return into
