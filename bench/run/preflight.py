"""Preflight: what every case of a sweep will hold at its peak, held against what the machine
has, before anything runs (before the first ceiling, before a state is built).

A case is a workload's state checkpointed by one engine over N targets. Within a workload and a
group of targets the sweep builds the state once and warms every engine on it, so their staging
is held at once: the peak of a case is

  the state (host memory when emulated, device memory on CUDA)
  + the staging every engine of the group holds (its `MemoryPlan`: pinned or not, the whole
    state or `staging_chunks` chunks, DCP's cached copy, DeepSpeed's buffer)
  + the larger of what its save and its restore add (a restart into the state's own
    tensors, or a fresh restore into new memory)
  + the copy probe's buffers, kept through the sweep, and fio's write buffers.

The page cache that buffered writes fill is said but not counted: the kernel reclaims it. Host
memory is held against MemAvailable (and the cgroup's limit, where one is set), device memory
against the GPU's free memory. RLIMIT_MEMLOCK is recorded: no engine here locks memory with
mlock (CUDA's cudaHostRegister pins through the driver), so it refuses nothing. Disk space is
checked by `bench.run.plan.check_space`.

A case restores as a restart (`restore: restart`, the default: into the state's own tensors,
scrubbed, no second copy; an engine that loads then copies holds its loader's memory beside them)
or fresh (into new memory); `restore: auto` takes fresh where it fits, else the restart. A case
that fits neither way it may take is refused, in one line naming the resource, what it
needs and what is there, and the way out.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from bench.common import sizes
from bench.common.schema import Strict
from bench.engines import REGISTRY
from bench.engines.base import MemoryPlan, StateSize, build_options

if TYPE_CHECKING:
    from bench.common.devices import Device

# Memory left for the interpreter, torch and the libraries beside the state and the engines'
# buffers, and a margin on what the plans add up to (allocator rounding, per-tensor overhead).
HEADROOM = 1 << 30
MARGIN = 0.05


@dataclass(frozen=True)
class Verdict:
    """What one case of the sweep will do: run (restoring as a restart or fresh) or be refused."""

    engine: str
    restore: str | None  # "restart" or "fresh"; None: refused
    why: str = ""  # the refusal, one line
    host_need: int = 0  # its peak host memory, in bytes
    parts: dict[str, int] = field(default_factory=dict)  # what the peak is made of


def cgroup_available(root: str = "/sys/fs/cgroup") -> int | None:
    """Memory this process's cgroup (v2) may still take (its `memory.max` less what it holds
    that the kernel cannot reclaim), or None where no limit is set: inside a container
    MemAvailable is the host's figure."""
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((ln.split("::", 1)[1].strip() for ln in f if ln.startswith("0::")), None)
        if rel is None:
            return None
        d = os.path.join(root, rel.lstrip("/"))
        with open(os.path.join(d, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(d, "memory.current")) as f:
            current = int(f.read())
        with open(os.path.join(d, "memory.stat")) as f:
            stat = dict(ln.split() for ln in f if len(ln.split()) == 2)
        reclaimable = int(stat.get("inactive_file", 0)) + int(stat.get("active_file", 0))
        return max(0, int(limit) - current + reclaimable)
    except (OSError, ValueError, StopIteration):
        return None


def host_available() -> int:
    """Host memory a sweep may take now: MemAvailable, or the cgroup's room if smaller."""
    avail = psutil.virtual_memory().available
    group = cgroup_available()
    return min(avail, group) if group is not None else avail


def device_free(device: Device) -> int | None:
    """Free memory of the CUDA device (None on host-emulated)."""
    if not device.is_cuda:
        return None
    import torch

    free, _ = torch.cuda.mem_get_info(device.torch_device)
    return int(free)


def memlock_limit() -> int | None:
    """RLIMIT_MEMLOCK's soft limit in bytes (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _model(engine: str, options: Any) -> Any:
    """An engine's options model: as the run resolved it, or built from a mapping."""
    return options if isinstance(options, Strict) else build_options(engine, options)


def plan_of(engine: str, size: StateSize, options: Any) -> MemoryPlan:
    """What `engine` holds for a state of `size` with `options` (the run's options model, or a
    mapping of its options)."""
    return REGISTRY[engine].memory_plan(size, _model(engine, options))


def _gib(n: int) -> str:
    return sizes.format_size(n)


def _sum(parts: dict[str, int]) -> int:
    return int(sum(parts.values()) * (1 + MARGIN))


def _line(parts: dict[str, int]) -> str:
    return ", ".join(f"{k} {_gib(v)}" for k, v in parts.items() if v)


def ways_out(
    engine: str,
    plan: MemoryPlan,
    size: StateSize,
    options: Any,
    held: dict[str, int],
    over: int,
) -> str:
    """What would make the case fit, in config terms (`held`: the staging of the engines before
    it, held beside it; `over`: by how much it does not fit)."""
    out = []
    bounded = getattr(_model(engine, options), "staging_chunks", None)
    if bounded == 0 and plan.staging > size.nbytes // 2:
        out.append(f"bound the staging (engine_options.{engine}.staging_chunks: 4)")
    if plan.in_place_host is None:
        out.append(f"an engine that restarts in place ({engine}: {plan.in_place_why})")
    if sum(held.values()) >= over:  # leaving the others out would make room
        names = [k.split()[0] for k, v in held.items() if v]
        out.append(f"fewer engines at once (the staging of {', '.join(names)} is held too)")
    out.append("a smaller total_sizes" + (", or more ranks to shard it" if size.cuda else ""))
    return "; ".join(out)


def _device_need(plan: MemoryPlan, size: StateSize, restore: str) -> int:
    """Device memory a case holds on CUDA: the state, the engine's device buffers, and a
    fresh restore beside it."""
    return size.nbytes + plan.staging_device + (plan.restore_device if restore == "fresh" else 0)


def _choose(
    plan: MemoryPlan,
    base: dict[str, int],
    staging: dict[str, int],
    restore: str,
    avail: int,
    size: StateSize,
    gpu_free: int | None,
) -> tuple[str | None, dict[str, int], dict[str, int] | None, str]:
    """(the restore that fits in host and device memory, or None; its parts; the host parts a
    refusal names, or None where a restart is asked for and impossible; the device shortfall a
    refusal names, or "")."""
    fresh = {**base, **staging, "save or restore": max(plan.save, plan.restore_host)}
    place = None
    if plan.in_place_host is not None:
        place = {**base, **staging, "save or restore": max(plan.save, plan.in_place_host)}
    choices = {"fresh": fresh, "restart": place}
    order = ["fresh", "restart"] if restore == "auto" else [restore]
    device = ""
    for r in order:
        parts = choices[r]
        if parts is None or _sum(parts) > avail:
            continue
        dev = _device_need(plan, size, r)
        if gpu_free is not None and int(dev * (1 + MARGIN)) > gpu_free:
            device = device or (
                f"device memory: needs {_gib(dev)} (state {_gib(size.nbytes)}"
                + (f", buffers {_gib(plan.staging_device)}" if plan.staging_device else "")
                + (f", restore {_gib(plan.restore_device)}" if r == "fresh" else "")
                + f"), {_gib(gpu_free)} free on the GPU; way out: a smaller total_sizes, or "
                "more ranks to shard it"
            )
            continue
        return r, parts, None, ""
    want = choices[restore] if restore != "auto" else (place if place is not None else fresh)
    return None, fresh, want, device


def _least(
    plan: MemoryPlan, base: dict[str, int], staging: dict[str, int], restore: str
) -> dict[str, int]:
    """The smallest of the peaks `restore` allows (for a refusal's numbers)."""
    options = []
    if restore in ("auto", "fresh"):
        options.append({**base, **staging, "save or restore": max(plan.save, plan.restore_host)})
    if restore in ("auto", "restart") and plan.in_place_host is not None:
        options.append({**base, **staging, "save or restore": max(plan.save, plan.in_place_host)})
    return min(options, key=_sum) if options else {**base, **staging}


def judge(
    case: str,
    engines: list[str],
    size: StateSize,
    options: dict[str, Any],
    host_avail: int,
    gpu_free: int | None,
    extra: dict[str, int] | None = None,
    restore: str = "auto",
) -> list[Verdict]:
    """The verdict on every engine of one workload and group of targets, in order. Every engine
    admitted is warmed on the state at once, so their staging is held together all through the
    workload, while their saves and restores run one at a time: an engine is admitted if, with
    its staging added to that of the engines admitted before it, each of them still fits with
    its own save or restore (and `extra`, the probes' buffers). `restore` is restart, fresh or
    auto (fresh where that fits, else the restart); under auto an engine admitted earlier may
    turn to the restart to make room."""
    base = {"state": 0 if size.cuda else size.nbytes, **(extra or {})}
    plans = {e: plan_of(e, size, options.get(e, {})) for e in engines}
    admitted: dict[str, tuple[str, dict[str, int]]] = {}
    refused: dict[str, str] = {}
    for e in engines:
        plan = plans[e]
        staging = {f"{a} staging": plans[a].staging for a in [*admitted, e]}
        trial: dict[str, tuple[str, dict[str, int]]] = {}
        why = ""
        for a in [*admitted, e]:
            chosen, parts, want, device = _choose(
                plans[a], base, staging, restore, host_avail, size, gpu_free
            )
            if chosen is None:
                if device and a == e:
                    why = f"{case} {e}: {device}"
                elif want is None:
                    why = (
                        f"{case} {e}: restore: restart is not possible "
                        f"({plans[e].in_place_why}); way out: restore: auto or fresh"
                    )
                else:
                    held = {k: v for k, v in staging.items() if k != f"{e} staging"}
                    if a != e:  # it is another's restore that no longer fits: say e's
                        want = _least(plan, base, staging, restore)
                    why = (
                        f"{case} {e}: host memory: needs {_gib(_sum(want))} "
                        f"({_line(want)}), {_gib(host_avail)} available; way out: "
                        + ways_out(e, plan, size, options.get(e, {}), held, _sum(want) - host_avail)
                    )
                break
            trial[a] = (chosen, parts)
        if len(trial) == len(admitted) + 1:
            admitted = trial
        else:
            refused[e] = why
    out = []
    for e in engines:
        if e in admitted:
            chosen, parts = admitted[e]
            out.append(Verdict(e, chosen, "", _sum(parts), parts))
        else:
            out.append(Verdict(e, None, refused[e]))
    return out
