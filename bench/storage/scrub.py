"""The scrub of a restore's destination: every byte of every tensor replaced by its bitwise
complement (x ^ 0xFF), in place, where the tensor lives (host or device memory).

A restarting job restores into a model and optimizer it has just built: their memory exists and
holds what initialisation wrote there, not the checkpoint. The harness gives the destination that
state before the timed load, untimed. The complement is the content chosen because no byte of
the scrubbed destination then equals the checkpoint's byte at the same place, whatever the
tensor holds (a constant fill could match a tensor that holds that constant: a zero bias, a -1
index): any byte the load leaves unwritten, or writes from the wrong place, fails the check that
follows (bench.storage.verify). It costs one read and one write of the state, and no second copy
(a non-contiguous tensor is complemented through its own strides).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.storage.tree import flatten


@torch.no_grad()
def scrub(state: Any) -> int:
    """Complement every byte of every tensor of `state` in place; the bytes scrubbed."""
    done = 0
    for _, t in flatten(state)[1]:
        if not t.numel():
            continue
        d = t.detach()
        d = d.reshape(1) if d.dim() == 0 else d  # a view of the same memory
        if d.stride(-1) == 1:
            # the same memory as uint8: the last dimension widened by the element size
            d.view(torch.uint8).bitwise_not_()
        else:  # a view whose last dimension is strided: through a copy of that tensor alone
            c = d.contiguous()
            c.view(torch.uint8).bitwise_not_()
            d.copy_(c)
        done += t.numel() * t.element_size()
    return done
