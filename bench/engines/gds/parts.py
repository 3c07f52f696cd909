"""What gds's job modules (registration, kvikio_io, emulated, labels) use of the engine: its state
and the methods of the other jobs, as one Protocol. The functions of those modules take `self`
typed by it and are methods of bench.engines.gds.engine.Gds, which mypy holds to it where it binds
them; the modules never import the engine (no import circle), and a reader sees here, in one
place, everything a job may touch."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import torch

from bench.common.devices import Device
from bench.engines.gds.coalesce import Coalescing
from bench.engines.stripes import Job, StripeWriter
from bench.storage import layout
from bench.storage.staging import PinnedBuffer


class GdsEngine(Protocol):
    # -- the striped engine's -----------------------------------------------------------------
    options: Any  # bench.engines.options.GdsOptions, validated
    targets: list[str]
    device: Device
    writer: StripeWriter

    # -- gds's state (set in Gds.__init__) ----------------------------------------------------
    io: str  # "kvikio" or "emulated"
    restore_mode: str
    restore_detail: dict[str, Any]
    _kvikio: Any  # the kvikio module, on the kvikio path
    _fs_reasons: list[str]
    # CUDA allocation base -> (a tensor inside it, the allocation's bytes), as registered
    _registered: dict[int, tuple[torch.Tensor, int]]
    _registered_ptrs: dict[int, int]
    _register_failed: list[tuple[str, str]]
    _register_note: str
    _cbuf: torch.Tensor | None
    _kvikio_pinned: int
    _bounce: threading.local
    _bounces: list[PinnedBuffer]
    _bounce_lock: threading.Lock

    # -- the engine's own methods -------------------------------------------------------------
    def _settings(self) -> dict[str, Any]: ...
    def _ensure_settings(self) -> bool: ...
    def _derived_pinned(self) -> int: ...
    def _device_sync(self) -> None: ...
    def _side_stream(self) -> Any: ...
    def _hash_one(self, job: Job, i: int, view: Any) -> None: ...
    def _coalesced_rounds(self, job: Job, co: Coalescing, write_round: Any) -> None: ...
    # the striped engines' restore through host memory (StripedEngine.load)
    def _host_load(self, name: str, device: str, checksums: bool, into: Any) -> Any: ...

    # -- the jobs' methods, bound on the engine -----------------------------------------------
    def _deregister(self) -> None: ...
    def _label(
        self, reasons: list[str], device_bytes: int, nvfs_before: dict[str, int] | None, op: str
    ) -> tuple[str, str]: ...
    def _open_cufile(self, path: str, flags: str, reasons: list[str]) -> Any: ...
    def _hash_kvikio(
        self, job: Job, idx: list[int], mems: dict[int, torch.Tensor], dev: list[bool]
    ) -> None: ...
    def _write_piece(self, fd: int, piece: layout.Piece) -> None: ...
    def _bounce_buffer(self, span: int) -> PinnedBuffer: ...
