"""Where a restore lands, and how what it brought back is checked
(bench.run.protocol.restore_phase calls these around its timed load).

- `restart` (the default): into the destination a relaunched job holds, its model and optimizer
  built before the load. Here that is the saved state's own tensors, no second copy (what fits
  at any size): scrubbed first, untimed (bench.storage.scrub: every byte complemented, so that
  none still holds the checkpoint's), then filled by the timed load, then checked against the
  fingerprints of the source taken before the save (bench.storage.verify). A load that reads
  nothing, skips a piece or reads a tensor from the wrong place leaves scrubbed bytes, and the
  check names the first tensor that holds them. Each engine fills the destination as its best
  user restarts (its `restore_in_place` trait): in place, or its loader and then the copy
  into the destination, both inside the clock.
- `fresh`: into memory the load allocates (a process with no model yet: the first-touch case),
  compared byte for byte with the source, which it left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.measure.clock import clocked
from bench.storage import scrub, verify

RESTART = "restart"
FRESH = "fresh"


@dataclass(frozen=True)
class Destination:
    """What a restore loads into (`into`: None for fresh) and what it is checked against."""

    kind: str  # RESTART or FRESH: the row's restore_into
    into: Any = None
    fingerprint: list[tuple[str, str]] | None = None

    def load_kwargs(self) -> dict[str, Any]:
        """The engine load()'s `into` argument, where there is one."""
        return {"into": self.into} if self.kind == RESTART else {}

    def restored(self, loaded: Any) -> Any:
        """The state the restore left to check: the destination itself on a restart (what the
        load returned is not what a restarted job trains on), else what the load returned."""
        return self.into if self.kind == RESTART else loaded

    def first_difference(self, source: Any, loaded: Any, loose: bool) -> str | None:
        """None where the restore brought the source back, else the path of the first tensor
        (or node) that differs."""
        if self.kind == RESTART:
            assert self.fingerprint is not None
            return verify.first_fingerprint_difference(
                self.fingerprint, verify.fingerprint(self.into)
            )
        compare = verify.first_tensor_difference if loose else verify.first_difference
        return compare(source, loaded)


def fresh() -> Destination:
    return Destination(FRESH)


def restart(state: Any, fingerprint: list[tuple[str, str]] | None, eng: Any) -> Destination:
    """The state's own tensors as a restart's destination, scrubbed now (untimed), and the
    engine told to forget what it holds of its last checkpoint (a snapshot engine's staging,
    which its restore reuses as a ring): a restarted process holds neither."""
    scrub.scrub(state)
    clocked(eng).forget()
    return Destination(RESTART, state, fingerprint)
