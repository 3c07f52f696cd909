"""A power cut for tests: what a tree of files holds after a crash that loses every write not
made durable.

A killed process loses nothing that reached the page cache; a power cut (or a kernel crash)
loses every write that no fsync made durable. `PowerCut(root)` records, process-wide, the
syscalls through which Python code changes the files under `root` and makes them durable, and
afterwards writes out (`materialise`) the tree that a cut at any recorded step would leave. It
follows the recorded-syscall approach of ALICE ("All File Systems Are Not Created Equal",
OSDI 2014) with one persistence model, the strictest that POSIX allows:

- a file's content is durable as it was at its last fsync (or fdatasync); a file never fsync'd
  since it was created is empty after the cut;
- a directory's entries (names created, renamed in, renamed away, unlinked) are durable as they
  were at the directory's last fsync: a name never made durable vanishes, a removal never made
  durable is undone (the name comes back with the durable content of its file);
- a directory named nowhere durable vanishes with everything under it;
- everything under `root` when the recording starts is durable (the old checkpoint was).

Why recorded syscalls and not a FUSE filesystem that forgets (LazyFS): a FUSE mount needs
libfuse3, fusermount3 and a /dev/fuse open to the user (root-only on the machines these tests
run on), and O_DIRECT through FUSE depends on the mount's direct_io mode; the recording needs
none of that, runs the real engines on the real disk, and is deterministic.

Nothing else becomes durable by itself: no writeback after a delay, no rename that carries its
file's data with it. Between two fsyncs the durable tree does not change, so a cut after any
recorded syscall (open, write, rename, unlink, ...) leaves the tree of the last fsync before it:
`cuts()` lists every recorded step and which durable tree it leaves; the distinct trees are the
states to check.

How it works: `os.fsync`, `os.fdatasync`, `os.sync` and the calls that create, rename and remove
names (`os.replace`, `os.rename`, `os.unlink`, `os.remove`, `os.rmdir`, `os.mkdir`, `os.open`)
are wrapped for the duration of the recording, for every thread (one lock orders them). At an
fsync of a file the layer reads the file's content through a fresh descriptor (an O_DIRECT
descriptor cannot read into unaligned memory; a buffered read after O_DIRECT writes reads what
they wrote) and keeps it as that inode's durable content; at an fsync of a directory it keeps the
directory's entries (name -> inode). Inode numbers that the filesystem reuses after a removal are
told apart by counting removals. Writes themselves are not recorded: the content at the fsync is
what the fsync made durable, whoever wrote it.

Where it cannot follow:
- Writes and renames made by C or C++ code (torch.save's writer, safetensors' Rust, kvikio's
  C++) are not seen one by one; their fsyncs are seen only when they go through Python's `os`
  module. A library that fsyncs in C would look like one that never fsyncs (the checks would
  then fail, not pass). The libraries used here fsync through Python (or not at all, and the
  engines fsync their files).
- O_DIRECT writes are modelled like any other write: not durable until fsync. That is right
  for their metadata (the file's size, its block map) and for a device's volatile write cache;
  a device without one might keep some of them earlier.
- A disk that acknowledges a cache flush it has not done (a lying write cache) loses what any
  fsync "made durable"; no layer above the disk can model that.
- Real filesystems are kinder than this model: ext4 commits directory changes with its journal
  every few seconds, orders data before metadata (data=ordered) and, with auto_da_alloc, flushes
  a file's data when it replaces another by rename. A save that passes here passes on them; a
  save that fails here may still survive most real cuts, by luck.
- Only cuts between syscalls: a write torn inside one syscall (part of a block) is not modelled;
  neither is a file holding garbage or zeros for blocks its size covers (after a cut a file holds
  exactly its content at its last fsync).
- Extended attributes, permissions, timestamps and hard links are not modelled (a name is a
  file's content or a directory's entries).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Key = tuple[int, int]  # (inode number, how many times that number was freed before)
SMALL = 64 << 20  # files renamed are read to tell whether their content was durable, to here


@dataclass
class Event:
    """One recorded syscall: what it was, on which path, and how many durable changes came before
    it and with it (`version`: the durable tree a cut right after it leaves)."""

    index: int
    what: str
    path: str
    version: int
    note: str = ""

    def __str__(self) -> str:
        extra = f" ({self.note})" if self.note else ""
        return f"#{self.index} {self.what} {self.path}{extra}"


@dataclass
class Durable:
    """The durable tree: each file inode's content, each directory inode's entries."""

    content: dict[Key, bytes] = field(default_factory=dict)
    entries: dict[Key, dict[str, tuple[Key, bool]]] = field(
        default_factory=dict
    )  # name -> key, dir


class PowerCut:
    """Records what becomes durable under `root` while it is entered (see the module)."""

    _WRAPPED = (
        "fsync",
        "fdatasync",
        "sync",
        "replace",
        "rename",
        "unlink",
        "remove",
        "rmdir",
        "mkdir",
        "open",
        "close",
        "pwrite",
        "write",
        "ftruncate",
    )

    def __init__(self, root: str | Path) -> None:
        self.root = os.path.realpath(root)
        self.events: list[Event] = []
        self.changes: list[
            tuple[str, Key, Any]
        ] = []  # ("file", key, bytes) | ("dir", key, entries)
        self.start = Durable()
        self.final = Durable()  # what the process saw when the recording ended (for diagnoses)
        self._freed: dict[int, int] = {}
        self._lock = threading.RLock()
        self._real: dict[str, Callable[..., Any]] = {}
        self._root_key: Key = (0, 0)
        self._marks: dict[str, int] = {}

    # -- recording --------------------------------------------------------------------------------

    def __enter__(self) -> PowerCut:
        self.start = self._scan()
        self._root_key = self._key(os.stat(self.root).st_ino)
        for name in self._WRAPPED:
            self._real[name] = getattr(os, name)
            setattr(os, name, getattr(self, f"_{name}"))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._real.items():
            setattr(os, name, fn)
        self.final = self._scan()

    def mark(self, label: str) -> None:
        """Note that `label` happened here (e.g. the save returned): `after(label, cut)` tells
        whether a cut came after it."""
        with self._lock:
            self._marks[label] = len(self.events)
            self.events.append(Event(len(self.events), "mark", label, len(self.changes)))

    def after(self, label: str, event: Event) -> bool:
        return label in self._marks and event.index >= self._marks[label]

    def _key(self, ino: int) -> Key:
        return (ino, self._freed.get(ino, 0))

    def _under(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def _fd_path(self, fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def _abs(self, path: Any, dir_fd: int | None) -> str:
        p = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(p):
            p = os.path.join(self._fd_path(dir_fd), p)
        return os.path.abspath(p)

    def _event(self, what: str, path: str, note: str = "") -> None:
        """Record a step on `path` (absolute; 'SRC -> DST' for a rename), named from the root."""
        if self._under(path.split(" -> ")[-1]):
            rel = " -> ".join(os.path.relpath(p, self.root) for p in path.split(" -> "))
            self.events.append(Event(len(self.events), what, rel, len(self.changes), note))

    def _read(self, path: str) -> bytes:
        with open(path, "rb") as f:  # a buffered descriptor of its own (see the module)
            return f.read()

    def _entries(self, path: str) -> dict[str, tuple[Key, bool]]:
        out = {}
        for name in os.listdir(path):
            st = os.lstat(os.path.join(path, name))
            out[name] = (self._key(st.st_ino), stat.S_ISDIR(st.st_mode))
        return out

    def _scan(self) -> Durable:
        """Every file and directory under the root as it is now."""
        d = Durable()
        for dirpath, _, filenames in os.walk(self.root):
            d.entries[self._key(os.stat(dirpath).st_ino)] = self._entries(dirpath)
            for f in filenames:
                p = os.path.join(dirpath, f)
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    d.content[self._key(st.st_ino)] = self._read(p)
        return d

    def _durable_fd(self, fd: int, what: str) -> None:
        """An fsync of `fd`: its inode's content (a file) or entries (a directory) are durable."""
        path = self._fd_path(fd)
        if not self._under(path):
            return
        st = os.fstat(fd)
        key = self._key(st.st_ino)
        if stat.S_ISDIR(st.st_mode):
            self.changes.append(("dir", key, self._entries(f"/proc/self/fd/{fd}")))
        elif stat.S_ISREG(st.st_mode):
            self.changes.append(("file", key, self._read(f"/proc/self/fd/{fd}")))
        self._event(what, path, "directory" if stat.S_ISDIR(st.st_mode) else "")

    def _fsync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        with self._lock:
            self._real["fsync"](fd)
            self._durable_fd(fd, "fsync")

    def _fdatasync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        with self._lock:
            self._real["fdatasync"](fd)
            self._durable_fd(fd, "fdatasync")

    def _sync(self) -> None:
        with self._lock:
            self._real["sync"]()
            now = self._scan()
            self.changes += [("file", k, v) for k, v in now.content.items()]
            self.changes += [("dir", k, v) for k, v in now.entries.items()]
            self._event("sync", self.root)

    def _freeing(self, path: str) -> Callable[[], None]:
        """Before `path` is removed or replaced: after that, a function that counts its inode as
        freed if that was its last name (its number may come back for a new file)."""
        try:
            st = os.lstat(path)
        except OSError:
            return lambda: None

        def done() -> None:
            if stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
                self._freed[st.st_ino] = self._freed.get(st.st_ino, 0) + 1

        return done

    def _unsynced(self, path: str) -> str:
        """'its content not durable' when the file at `path` differs from its durable content."""
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > SMALL:
                return ""
            now = self._read(path)
        except OSError:
            return ""
        if self._durable_now().content.get(self._key(st.st_ino)) == now:
            return ""
        return "unsynced"

    def _move(self, what: str, src: Any, dst: Any, **kw: Any) -> None:
        with self._lock:
            s = self._abs(src, kw.get("src_dir_fd"))
            d = self._abs(dst, kw.get("dst_dir_fd"))
            note = self._unsynced(s) if self._under(s) else ""
            if note:
                note = "its content was not yet fsync'd"
            try:
                same = os.lstat(s).st_ino == os.lstat(d).st_ino
            except OSError:
                same = False
            freed = (lambda: None) if same else self._freeing(d)
            self._real[what](src, dst, **kw)
            freed()
            self._event(what, f"{s} -> {d}", note)

    def _replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("replace", src, dst, **kw)

    def _rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._move("rename", src, dst, **kw)

    def _remove_name(self, what: str, path: Any, **kw: Any) -> None:
        with self._lock:
            p = self._abs(path, kw.get("dir_fd"))
            freed = self._freeing(p)
            self._real[what](path, **kw)
            freed()
            self._event(what, p)

    def _unlink(self, path: Any, **kw: Any) -> None:
        self._remove_name("unlink", path, **kw)

    def _remove(self, path: Any, **kw: Any) -> None:
        self._remove_name("remove", path, **kw)

    def _rmdir(self, path: Any, **kw: Any) -> None:
        self._remove_name("rmdir", path, **kw)

    def _mkdir(self, path: Any, *args: Any, **kw: Any) -> None:
        with self._lock:
            self._real["mkdir"](path, *args, **kw)
            self._event("mkdir", self._abs(path, kw.get("dir_fd")))

    def _open(self, path: Any, flags: int, *args: Any, **kw: Any) -> int:
        fd = self._real["open"](path, flags, *args, **kw)
        if flags & os.O_CREAT:
            with self._lock:
                self._event("open (create)", self._abs(path, kw.get("dir_fd")))
        return fd

    def _close(self, fd: int) -> None:
        path = self._fd_path(fd)
        self._real["close"](fd)
        if self._under(path):
            with self._lock:
                self._event("close", path)

    def _pwrite(self, fd: int, data: Any, offset: int) -> int:
        n: int = self._real["pwrite"](fd, data, offset)
        path = self._fd_path(fd)
        if self._under(path):
            with self._lock:
                self._event("pwrite", path, f"{n} bytes at {offset}")
        return n

    def _write(self, fd: int, data: Any) -> int:
        n: int = self._real["write"](fd, data)
        path = self._fd_path(fd)
        if self._under(path):
            with self._lock:
                self._event("write", path, f"{n} bytes")
        return n

    def _ftruncate(self, fd: int, length: int) -> None:
        self._real["ftruncate"](fd, length)
        path = self._fd_path(fd)
        if self._under(path):
            with self._lock:
                self._event("ftruncate", path, f"to {length} bytes")

    # -- cuts --------------------------------------------------------------------------------------

    def cuts(self) -> list[Event]:
        """A cut after every recorded step, and one before the first."""
        return [Event(-1, "start", ".", 0), *self.events]

    def versions(self) -> list[Event]:
        """The cuts that leave distinct trees: the first cut after each durable change, and
        the first after each mark (a check may expect more of a tree after a mark)."""
        seen: set[tuple[int, tuple[str, ...]]] = set()
        out = []
        for e in self.cuts():
            marks = tuple(m for m in self._marks if self.after(m, e))
            if (e.version, marks) not in seen:
                seen.add((e.version, marks))
                out.append(e)
        return out

    def _durable_now(self) -> Durable:
        return self.durable(len(self.changes))

    def durable(self, version: int) -> Durable:
        """The durable tree after the first `version` durable changes."""
        d = Durable(dict(self.start.content), dict(self.start.entries))
        for kind, key, value in self.changes[:version]:
            if kind == "file":
                d.content[key] = value
            else:
                d.entries[key] = value
        return d

    def materialise(self, cut: Event) -> None:
        """Replace what `root` holds by the tree a power cut right after `cut` leaves."""
        for name in os.listdir(self.root):
            p = os.path.join(self.root, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        d = self.durable(cut.version)

        def write(path: str, key: Key) -> None:
            for name, (k, is_dir) in d.entries.get(key, {}).items():
                p = os.path.join(path, name)
                if is_dir:
                    os.mkdir(p)
                    write(p, k)
                else:
                    with open(p, "wb") as f:
                        f.write(d.content.get(k, b""))

        write(self.root, self._root_key)

    # -- diagnoses --------------------------------------------------------------------------------

    def _last(self, path: str) -> Event | None:
        """The last recorded step that put something at `path` (a rename onto it, its creation)."""
        path = os.path.relpath(path, self.root)
        for e in reversed(self.events):
            if e.path.endswith(f" -> {path}") or (
                e.path == path and e.what in ("open (create)", "mkdir")
            ):
                return e
        return None

    def explain(self, cut: Event) -> str:
        """What the cut after `cut` lost of the tree the process saw at the end of the recording:
        each name never made durable, each rename not made durable, each file whose content was
        never fsync'd; and the steps that would have made them durable."""
        d = self.durable(cut.version)
        lines: list[str] = []

        def rel(p: str) -> str:
            return os.path.relpath(p, self.root)

        def walk(path: str, live: Key, kept: Key | None) -> None:
            now = self.final.entries.get(live, {})
            was = d.entries.get(kept, {}) if kept is not None else {}
            for name, (k, is_dir) in sorted(now.items()):
                p = os.path.join(path, name)
                how = self._last(p)
                step = f" at {how}" if how else ""
                if name not in was:
                    lines.append(
                        f"{rel(p)}: lost, its name in {rel(path) or '.'} was never made durable: "
                        f"no fsync of the directory {rel(path) or '.'} after it appeared there{step}"
                    )
                    continue
                k2, _ = was[name]
                if k2 != k:
                    lines.append(
                        f"{rel(p)}: the cut keeps an earlier file of that name: the rename onto it"
                        f"{step} was never made durable: no fsync of the directory "
                        f"{rel(path) or '.'} after it"
                    )
                elif is_dir:
                    walk(p, k, k2)
                else:
                    got, want = d.content.get(k, b""), self.final.content.get(k, b"")
                    if got != want:
                        why = (
                            f"; it was renamed onto {name} at #{how.index} while {how.note}"
                            if how is not None and how.note
                            else ""
                        )
                        # its fsyncs, under its name or the temporary name renamed onto it
                        names = {rel(p)}
                        if how is not None and " -> " in how.path:
                            names.add(how.path.split(" -> ")[0])
                        synced = [
                            e
                            for e in self.events[: cut.index + 1]
                            if e.what in ("fsync", "fdatasync") and e.path in names
                        ]
                        why += (
                            f"; its last fsync was #{synced[-1].index}, before its last write"
                            if synced
                            else f"; {name} was never fsync'd"
                        )
                        lines.append(
                            f"{rel(p)}: {len(got)} of its {len(want)} bytes survive the cut, "
                            f"{'other bytes than it held' if len(got) == len(want) else 'the rest lost'}: "
                            f"no fsync of its content before the cut{why}"
                        )

        walk(self.root, self._root_key, self._root_key)
        head = (
            f"power cut after {cut} (durable changes kept: {cut.version} of "
            f"{len(self.changes)}); lost of what the files held when the recording ended:"
        )
        return head + "".join(f"\n  - {line}" for line in lines or ["nothing lost"])
