"""Where the state lives: a CUDA GPU when torch sees one, else `host-emulated`.

On `host-emulated` the state lives in ordinary host memory and stands in for GPU memory; every
result row carries `emulated=True` so such numbers are never read as GPU numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.common.errors import UserError


@dataclass(frozen=True)
class Device:
    """The device the state is placed on before a checkpoint."""

    kind: str  # "cuda" or "host-emulated"
    torch_device: torch.device

    @property
    def emulated(self) -> bool:
        return self.kind != "cuda"

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def synchronize(self) -> None:
        """Wait for queued device work (copies) to finish; a no-op on the host. The waiting
        thread sleeps rather than spins where blocking-sync scheduling is in force
        (bench.common.cudasync)."""
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)

    def wait_current_stream(self) -> None:
        """Wait for what is queued on the current stream (the work that produced the state),
        through an event with cudaEventBlockingSync: waiting on an event without it busy-waits
        whatever the context's scheduling (CUDA's cudaEventSynchronize). A no-op on the host."""
        if self.torch_device.type == "cuda":
            done = torch.cuda.Event(blocking=True)
            done.record(torch.cuda.current_stream(self.torch_device))
            done.synchronize()


def detect(requested: str = "auto") -> Device:
    """The device to use: `auto` (cuda if available), `cuda` or `host-emulated`."""
    if requested not in ("auto", "cuda", "host-emulated"):
        raise UserError(f"device: expected auto, cuda or host-emulated, got {requested!r}")
    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise UserError("device: cuda was asked for but torch sees no GPU here")
    if requested == "cuda" or (requested == "auto" and has_cuda):
        return Device("cuda", torch.device("cuda", torch.cuda.current_device()))
    return Device("host-emulated", torch.device("cpu"))


def for_tensor(t: torch.Tensor) -> Device:
    """The Device a tensor lives on."""
    if t.device.type == "cuda":
        return Device("cuda", t.device)
    return Device("host-emulated", torch.device("cpu"))
