"""The job's process group as the run core's world (it satisfies bench.run.core.World): barriers
that name lost ranks, gathers, and agreement on setup steps, over a gloo group with timeouts."""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from bench.common import log
from bench.common.errors import UserError

T = TypeVar("T")

SETUP_TIMEOUT_S = 600.0  # barriers around setup steps that only some ranks do (ceilings)
_STOP = threading.Event()  # torchrun sent SIGTERM: another rank failed, or the job is stopped


# --- the process group -------------------------------------------------------------------------


class RankLost(Exception):
    """A rank did not reach a synchronisation point: killed, crashed, hung, or torchrun is
    stopping the job. `ranks` names the lost ranks where rank 0's monitored barrier knows them."""

    def __init__(
        self, where: str, ranks: list[int], detail: str, hosts: dict[int, str] | None = None
    ) -> None:
        self.where, self.ranks, self.detail = where, ranks, detail
        self.hosts = hosts or {}  # rank -> host, where the job spans hosts
        if ranks:
            on: dict[str, list[int]] = {}
            for r in ranks:
                on.setdefault(self.hosts.get(r, ""), []).append(r)
            who = "; ".join(
                ", ".join(str(r) for r in rs) + (f" on {h}" if h else "") for h, rs in on.items()
            )
            msg = (
                f"rank{'s' if len(ranks) > 1 else ''} {who} lost before {where} "
                "(killed, crashed, or not there within the timeout)"
            )
        else:
            msg = f"lost contact before {where}: {detail}"
        super().__init__(msg)

    def on_hosts(self, table: list[dict[str, Any]]) -> RankLost:
        """The same loss, its ranks' hosts named, when the job's ranks (`table`, the ranks'
        table) span more than one host."""
        hosts = {t["rank"]: str(t["host"]) for t in table}
        if len(set(hosts.values())) < 2 or not self.ranks:
            return self
        return RankLost(self.where, self.ranks, self.detail, hosts)


def _lost_ranks(text: str) -> list[int]:
    """The ranks a gloo monitored_barrier error names ('Ranks 1, 3 failed to pass ...')."""
    m = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    return [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []


@dataclass
class TorchrunWorld:
    """This rank's place in the job and the control collectives (gloo, with timeouts)."""

    rank: int
    size: int
    local_rank: int
    node_rank: int
    host: str
    timeout_s: float
    group: Any = None  # the gloo group for control; None: the default group is gloo
    store: Any = None  # the job's key-value store (torchrun's agent holds it)

    def _mark(self, where: str) -> None:
        """Leave in the job's store where this rank is, so that rank 0 can tell which ranks
        never reached a barrier when gloo only says a connection closed."""
        if self.store is not None:
            try:
                self.store.set(f"ckptbench/at/{self.rank}", where)
            except Exception:  # only helps to name a lost rank
                pass

    def _behind(self, where: str) -> list[int]:
        """The ranks whose last mark is not `where` (they died, or never got there)."""
        if self.store is None:
            return []
        out = []
        try:
            for r in range(self.size):
                key = f"ckptbench/at/{r}"
                if not self.store.check([key]) or self.store.get(key).decode() != where:
                    out.append(r)
        except Exception:  # the store is gone: torchrun is ending the job
            return []
        return out

    def barrier(self, where: str, timeout_s: float | None = None) -> None:
        """Every rank reaches `where`, else RankLost on every rank, naming the lost ranks:
        those gloo's monitored barrier names, else those that never marked `where` in the
        job's store (gloo may report only a closed connection, when the rank died before
        this one entered the barrier)."""
        import torch.distributed as dist

        self._mark(where)
        # Even after torchrun's SIGTERM, pass the barrier first: it names a lost rank.
        t = dt.timedelta(seconds=timeout_s or self.timeout_s)
        try:
            dist.monitored_barrier(group=self.group, timeout=t, wait_all_ranks=True)
        except RuntimeError as e:
            ranks = _lost_ranks(str(e)) or self._behind(where)
            raise RankLost(where, ranks, str(e).splitlines()[0]) from None
        if _STOP.is_set():
            raise RankLost(where, [], "torchrun is stopping the job (SIGTERM)")

    def all_gather(self, obj: T, where: str) -> list[T]:
        """Every rank's `obj`, in rank order (call right after a barrier)."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as e:
            raise RankLost(where, [], str(e).splitlines()[0]) from None
        return cast("list[T]", out)

    def agree(self, where: str, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run `fn()` on every rank; if it raised on any, raise UserError on every rank naming
        the first such rank (so no rank goes on alone and waits for the others)."""
        from bench.run.rows import error_text

        result: T | None = None
        err = ""
        try:
            result = fn()
        except UserError as e:
            err = str(e)
        except Exception as e:  # reported on every rank
            err = error_text(e)
            log.for_rank(self.rank).error(traceback.format_exc())
        self.barrier(where, timeout_s)
        errs = self.all_gather((self.host, err), where)
        bad = [(r, h, m) for r, (h, m) in enumerate(errs) if m]
        if bad:
            r, h, m = bad[0]
            # across hosts, the host is what the user goes to fix
            on = f"rank {r} ({h})" if len({x[0] for x in errs}) > 1 else f"rank {r}"
            more = f" (and on {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
            raise UserError(f"{where} failed on {on}{more}: {m}")
        return cast(T, result)  # fn() returned it: no rank failed


def init_world(timeout_s: float, cuda: bool) -> TorchrunWorld:
    """Join torchrun's process group: gloo on CPU; on CUDA NCCL for device tensors and a gloo
    group for the control collectives."""
    import torch.distributed as dist

    t = dt.timedelta(seconds=timeout_s)
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=t)
    group = dist.new_group(backend="gloo", timeout=t) if cuda else None
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # a torch without it: lost ranks are named by gloo alone
        store = None
    return TorchrunWorld(
        store=store,
        rank=dist.get_rank(),
        size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        node_rank=int(os.environ.get("GROUP_RANK", "0")),
        host=socket.gethostname(),
        timeout_s=timeout_s,
        group=group,
    )
