"""The files of a striped save, one object the three data paths hold: `StripeWriter`.

A save over N targets writes one data file per target that gets data (chunks dealt round-robin,
bench.storage.layout), then commits its manifest. The writer does every step of that which does
not depend on where the bytes come from: claim the name and mark the save running (`prepare`),
open the files and reserve their length (`open`), write pieces paced by each target's cap
(`write`, `submit`), wait for the writes, trim O_DIRECT's padding and fsync (`drain`; `finish`
for files written by another library, kvikio's), make the directories durable and switch the
manifest (`commit`), and remove a failed save's files (`abort`) or a checkpoint (`delete`).
cpu-single and cpu-double write from their staging through it; gds writes from device memory
through kvikio and uses it for the rest.

The unit of work is a `Job`: one save's result, its plan (bench.storage.plan), its tensors and
scalar values, and the checksums its persist records.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from bench.engines.base import SaveResult
from bench.storage import generations, layout, manifest, odirect, pacing
from bench.storage.plan import SavePlan


@dataclass
class Job:
    """One save on its way through an engine: its result, its plan, this save's tensors and
    scalar values, and the checksums its persist records (one slot per tensor)."""

    result: SaveResult
    plan: SavePlan
    tensors: list[torch.Tensor]
    scalars: list[Any]
    xxh3: list[str | None]
    wsum64: list[str | None]
    # The manifest and its text, rendered while the data is written (`prepare_manifest`)
    manifest: manifest.Manifest | None = None
    text: str | None = None


class StripeWriter:
    """Writes the files of striped saves to `targets` for engine `engine` (see the module):
    `threads` writer threads, O_DIRECT or buffered, each target paced by its cap in bytes/s
    (None: uncapped), each file's length reserved first when `fallocate`."""

    def __init__(
        self,
        engine: str,
        targets: list[str],
        *,
        o_direct: bool,
        fallocate: bool,
        chunk_bytes: int,
        checksums: bool,
        caps: list[int | None],
        threads: int,
    ) -> None:
        self.engine = engine
        self.targets = targets
        self.o_direct = o_direct
        self.fallocate = fallocate
        self.chunk_bytes = chunk_bytes
        self.checksums = checksums
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{engine}-io")
        self.buckets = [pacing.TokenBucket(c, chunk_bytes) if c else None for c in caps]

    # -- files ---------------------------------------------------------------------------------

    def prepare(self, result: SaveResult) -> None:
        """Claim the name for these targets (checked again: a list that claimed it since save()
        began is refused here, before any file of this save exists), remove what interrupted
        saves of the name left behind, then mark this save running. Called just before this
        save's first file is opened, so that claim and marker come before any data: on the
        snapshot engines that is in the background, after the stall (the claim creates the
        name's folders and writes a record, 0.3 ms here and 1-1.5 ms right after a cache drop;
        the leftover scan reads the committed manifest, ~1 ms for 256 tensors)."""
        generations.claim(self.targets, result.name)
        generations.remove_files(generations.leftovers(self.targets, result.name))
        generations.begin(self.targets, result.name, result.save_id)

    def paths(self, result: SaveResult, file_bytes: dict[int, int]) -> dict[int, str]:
        """The data file of this save on every target that gets data."""
        return {
            t: layout.data_file(self.targets, result.name, t, result.save_id) for t in file_bytes
        }

    def reserve(self, fd: int, nbytes: int) -> None:
        """Reserve a file's length before writing, where asked for: O_DIRECT writes inside the
        file's size run in parallel, appends that extend it are serialised (ext4)."""
        if self.fallocate and nbytes:
            odirect.preallocate(fd, nbytes)

    def open(self, result: SaveResult, file_bytes: dict[int, int]) -> dict[int, int]:
        """Mark this save running (`prepare`), then open its data file on every target that
        gets data, its length reserved."""
        self.prepare(result)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if self.o_direct else 0)
        fds: dict[int, int] = {}
        try:
            for t, path in self.paths(result, file_bytes).items():
                fds[t] = os.open(path, flags, 0o644)
                self.reserve(fds[t], file_bytes[t])
        except BaseException:
            self.close(fds, [])
            raise
        return fds

    def pace(self, target: int, nbytes: int) -> None:
        """Wait until target `target`'s cap lets `nbytes` more go (no wait when uncapped)."""
        bucket = self.buckets[target]
        if bucket is not None:
            bucket.take(nbytes)

    def write(self, fd: int, piece: layout.Piece) -> None:
        """One piece, paced when its target carries a write-bandwidth cap."""
        self.pace(piece.target, piece.length)
        layout.write_piece(fd, piece, self.o_direct)

    def submit(
        self,
        fds: dict[int, int],
        pieces: list[layout.Piece],
        write: Callable[[int, layout.Piece], None] | None = None,
    ) -> list[Future]:
        """Every piece handed to the writer threads (`write`, or the engine's own); their
        futures. The caller closes the files, after the futures, if this raises."""
        return [self.pool.submit(write or self.write, fds[p.target], p) for p in pieces]

    @staticmethod
    def close(fds: dict[int, int], futures: list[Future]) -> None:
        """Close the files once no write is in flight (a write on a reused descriptor could land
        in another file)."""
        for f in futures:
            if f is not None:
                try:
                    f.result()
                except BaseException:  # the first error is raised by the caller
                    pass
        for fd in fds.values():
            os.close(fd)

    def drain(
        self, job: Job, fds: dict[int, int], futures: list[Future], file_bytes: dict[int, int]
    ) -> None:
        """Wait for the writes, trim the padding, fsync, close, then commit the manifest."""
        try:
            for f in futures:
                if f is not None:
                    f.result()
            for t, fd in fds.items():
                # O_DIRECT pads the last block; the file keeps exactly its data.
                if os.fstat(fd).st_size != file_bytes[t]:
                    os.ftruncate(fd, file_bytes[t])
            list(self.pool.map(os.fsync, fds.values()))
        finally:
            self.close(fds, futures)
        self.commit(job, file_bytes)

    @staticmethod
    def finish(paths: dict[int, str], file_bytes: dict[int, int]) -> None:
        """Trim and fsync files another library wrote (cuFile has no fsync of its own: through
        a plain descriptor of the same file, which flushes its data whatever wrote it)."""
        for t, n in file_bytes.items():
            fd = os.open(paths[t], os.O_WRONLY)
            try:
                if os.fstat(fd).st_size != n:
                    os.ftruncate(fd, n)
                os.fsync(fd)
            finally:
                os.close(fd)

    # -- the manifest ------------------------------------------------------------------------

    def prepare_manifest(self, job: Job, file_bytes: dict[int, int]) -> None:
        """The manifest of this save and its text, once its checksums are known: rendered
        while its data is still being written, so that only writing it is left after the
        data is durable (3.3 MB and 12 ms of rendering for 20,000 tensors)."""
        result, plan = job.result, job.plan
        assert plan.table is not None
        job.manifest = manifest.Manifest(
            name=result.name,
            engine=self.engine,
            targets=self.targets,
            files={
                t: {"file": manifest.data_file_name(t, result.save_id), "bytes": n}
                for t, n in file_bytes.items()
            },
            tensors=plan.entries,  # their text, with this save's checksums, is tensors_json
            tree=None,  # its text, with this save's scalars, is tree_json
            checksums=self.checksums,
            payload_bytes=result.bytes,
            save_id=result.save_id,
            extra={"chunk_bytes": self.chunk_bytes, "o_direct": self.o_direct},
            tree_json=plan.tree_json(job.scalars),
            tensors_json=plan.table.render(job.xxh3, job.wsum64),
        )
        job.text = job.manifest.to_json()

    def commit(self, job: Job, file_bytes: dict[int, int]) -> None:
        """Make the new files durable, switch the manifest to them, then drop the old generation."""
        result = job.result
        name, save_id = result.name, result.save_id
        for t in self.targets:
            manifest.fsync_dir(manifest.checkpoint_dir(t, name))
            manifest.fsync_dir(t)
        if job.manifest is None:
            self.prepare_manifest(job, file_bytes)
        assert job.manifest is not None
        previous = manifest.committed(self.targets, name)
        damaged = previous is None and os.path.exists(manifest.manifest_path(self.targets, name))
        manifest.commit(self.targets, job.manifest, job.text)
        done = generations.generation_files(self.targets, name, save_id)
        old = []
        if previous is not None and previous.save_id != save_id:
            # Its data files, and its marker if a kill cut short the cleanup of its own commit.
            old = layout.files_of(previous.targets, previous)
            old += generations.generation_files(self.targets, name, previous.save_id)
        elif damaged:
            # The manifest replaced could not be read: its generation is unknown, but every
            # file of a dead save other than this one is now a leftover (the old generation's
            # data among them; a save still in flight is spared by its live marker).
            old = generations.leftovers(self.targets, name, keep=save_id)
        generations.remove_files(
            old + [p for p in done if os.path.basename(p).startswith(".saving-")]
        )
        result.targets_used = len(file_bytes)

    def abort(self, name: str, save_id: str) -> None:
        """A failed save removes its own files; the committed generation stays as it was."""
        generations.remove_files(generations.generation_files(self.targets, name, save_id))
        generations.release(self.targets, name)

    def delete(self, name: str) -> None:
        """Remove checkpoint `name` from every target: never another target list's."""
        generations.check_claim(self.targets, name)
        manifest.uncommit(self.targets, name)
        for t in self.targets:
            shutil.rmtree(manifest.checkpoint_dir(t, name), ignore_errors=True)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
