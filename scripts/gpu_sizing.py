"""The GPU check's sizing: what the check can save in the time it has left, on the disk it finds.

    python scripts/gpu_sizing.py --seconds LEFT --out DIR [--without gds] [--set key=value ...]
    python scripts/gpu_sizing.py --seconds LEFT --out DIR --first-took SECONDS [...]

It reads configs/gpu-check.yaml with the run's own `--set` overrides, so it sees what the run
will see: the targets, their write caps, the device, the engines, the sizes, the ceilings. Then,
in a few seconds, it measures what the first target takes, with the ceilings' own probe
(bench.measure.ceilings.builtin.builtin_write, paced by the target's cap as the engines pace it):
O_DIRECT write where the target's folder accepts O_DIRECT (bench.storage.odirect.probe), else
buffered write + fsync; and, on the run's device, what the rest of a case costs per byte: a
memory copy, building a synthetic state, making staging, comparing a restore and a checksum.

The check runs in stages, most valuable first, each its own `ckptbench run` and run folder, so
that a check cut short by its limit keeps every finished stage's rows and the rows so far of
the stage it cut:

1. `first`: gds and cpu-single on the synthetic state, no ceilings (the rows the check is for);
2. `engines`: the other engines on the same state, with the device ceilings;
3. `model`: every engine on the config's model workloads.

The sizing picks, in this order of priority: every stage at one timed repetition with the
cheapest ceilings, at the largest synthetic size that fits (the config's, halved down to
MIN_TOTAL; at most a quarter of the target's free space); then the config's repetitions; then
the config's full ceiling search. When nothing fits even at MIN_TOTAL, the model stage is
dropped first (it costs the most, and the synthetic stages hold every engine's rows), then the
ceilings, and the sizing says so; the size is then searched again from the top. "Fits": the
estimate (`Costs` and the measured rates) within (1 - MARGIN) of the seconds left. The ceilings'
probes inside the sweep are off in every stage: the check's table does not read them, and each
costs five storage runs per workload.

After the first stage, `--first-took` sizes the stages left again: the estimates scaled by how
long the first stage took against its own estimate (the rates measured in a few seconds are not
the whole story, e.g. on a busy host), the size at most the first stage's, so that the other
engines' rows sit beside gds's.

It prints the sizing and why, and writes DIR/gpu_sizing.json (the measurements and the plan),
DIR/gpu_stages.tsv (one stage a line: name, estimated seconds, its `--set` arguments, for
scripts/gpu_check.sh) and a line `sizing: ...` into DIR/gpu_notes.txt for the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.common import devices  # noqa: E402
from bench.common.errors import UserError  # noqa: E402
from bench.common.sizes import format_size, parse_size  # noqa: E402
from bench.config import sweep as config_mod  # noqa: E402
from bench.engines import REGISTRY  # noqa: E402
from bench.measure.ceilings.builtin import builtin_write  # noqa: E402
from bench.measure.ceilings.measure import PROBE_COPY_BYTES, probe_bytes  # noqa: E402
from bench.run import plan as plan_mod  # noqa: E402
from bench.storage import checksums, odirect, staging, verify  # noqa: E402
from bench.workloads import synthetic_state  # noqa: E402

CONFIG = "configs/gpu-check.yaml"
# The stage that runs first: the rows the check is for (nixl with GDS_MT beside gds)
FIRST = ("gds", "nixl", "cpu-single")
# The engines that make staging (or register the state, gds on CUDA) for each state: pinned or
# pre-faulted memory of the state's size, made before the saves.
STAGED = ("gds", "cpu-single", "cpu-double", "dcp")
MARGIN = 0.25  # the share of the seconds left that the plan leaves unused
MIN_TOTAL = 64 << 20  # the smallest synthetic state the sizing picks
PROBE_S = 3.0  # how long the write probe issues writes
PROBE_BYTES = 2 << 30  # the most it writes (O_DIRECT)
BUFFERED_BYTES = 512 << 20  # the most the buffered probe writes
SAMPLE_BYTES = 64 << 20  # the state, staging and copies the per-byte costs are measured on
MIN_SCALE = 0.75  # the most the first stage's pace may lower the estimates of the stages left


@dataclass(frozen=True)
class Costs:
    """What the estimate counts besides what `measure` measures. Deliberately on the slow side:
    the restore is assumed to read no faster than the target writes (reads are faster on most
    disks, and a write cap paces writes only), and the baselines, which are never paced, as if
    they were."""

    # one `ckptbench run` besides its states and saves: interpreter, torch and CUDA, env.json,
    # the host at rest (5 s on a 2-core VM without a GPU)
    stage_s: float = 12.0
    save_s: float = 0.5  # one save besides its bytes: files, eviction, deletion
    # memory copies per byte per save besides the verification: into staging (or the
    # baselines' serialisation), and the restore's out of it
    copies: float = 2.0


@dataclass(frozen=True)
class Disk:
    """What the sizing measured: the first target, and the host and device the run uses."""

    target: str
    write_Bps: float
    write_mode: str  # "O_DIRECT" or "buffered+fsync"
    odirect: str | None  # None, or why the target refuses O_DIRECT
    cap_Bps: int | None  # the target's write cap, paced in the probe as in the run
    probe_s: float
    buffered_Bps: float  # buffered write + fsync, one writer (the page-cache engines' way)
    memory_Bps: float  # a memory copy on the host
    build_Bps: float = 1e9  # building a synthetic state on the run's device
    staging_Bps: float = 4e9  # making an engine's staging (pre-faulted, pinned on CUDA)
    verify_Bps: float = 2e9  # a restore's comparison with the source, and a checksum pass
    free_bytes: int = 1 << 40


@dataclass
class Stage:
    """One `ckptbench run` of the check: its engines and workload, and its `--set` arguments."""

    name: str
    engines: list[str]
    workload: str
    saves_per_engine: int
    estimate_s: float
    sets: list[str] = field(default_factory=list)


def _best_s(fn, runs: int = 3) -> float:
    """The shortest of `runs` calls of `fn`, in seconds."""
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return max(best, 1e-6)


def measure(cfg: config_mod.Config, seconds: float = PROBE_S) -> Disk:
    """The first target's write rate (O_DIRECT where it accepts it, paced by its cap), and the
    per-byte costs of a case on the run's device, in a few seconds."""
    target = cfg.resolved_targets()[0]
    os.makedirs(target, exist_ok=True)
    refused = odirect.probe(target)
    cap = cfg.target_caps()[0]
    free = shutil.disk_usage(target).free
    block = 16 << 20
    nbytes = max(block, min(PROBE_BYTES, free // 4) // block * block)
    direct = refused is None
    t0 = time.perf_counter()
    bw = builtin_write(
        [target],
        nbytes,
        block,
        direct,
        jobs=4 if direct else 1,
        depth=4 if direct else 1,
        caps=[cap],
        seconds=seconds,
    )
    probe_s = time.perf_counter() - t0
    # One writer through the page cache, then fsync: what torch.save and the other page-cache
    # paths do. Its file is small: the fsync drains whatever the page cache took.
    buffered = builtin_write(
        [target], min(nbytes, BUFFERED_BYTES), block, False, 1, 1, [cap], seconds / 2
    )
    n = SAMPLE_BYTES
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    copy_s = _best_s(lambda: np.copyto(dst, src))
    dev = devices.detect(cfg.device)
    where = dev.torch_device
    synthetic_state(1 << 20, 1 << 20, torch.float32, where)  # allocator, RNG, CUDA: once
    build_s = _best_s(lambda: synthetic_state(n, n // 4, torch.float32, where), runs=1)
    state = synthetic_state(n, n // 4, torch.float32, where)
    twin = {k: v.clone() for k, v in state.items()}

    def stage_buffer() -> None:
        (staging.PinnedBuffer(n) if dev.is_cuda else odirect.HostBuffer(n)).close()

    staging_s = _best_s(stage_buffer, runs=1)
    verify_s = _best_s(lambda: verify.first_tensor_difference(state, twin), runs=2)
    verify_s += _best_s(lambda: checksums.checksum(memoryview(src)), runs=2)
    if dev.is_cuda:
        torch.cuda.synchronize()
    return Disk(
        target,
        bw,
        "O_DIRECT" if direct else "buffered+fsync",
        refused,
        cap,
        round(probe_s, 2),
        buffered,
        n / copy_s,
        n / build_s,
        n / staging_s,
        n / verify_s,
        free,
    )


def save_s(engine: str, nbytes: int, disk: Disk, c: Costs) -> float:
    """One save by `engine`, its restore and its verification: written at the rate of its kind
    of write (O_DIRECT or through the page cache), read back at the O_DIRECT write rate."""
    write = disk.buffered_Bps if REGISTRY[engine].traits.page_cache else disk.write_Bps
    per_byte = 1 / write + 1 / disk.write_Bps + c.copies / disk.memory_Bps + 1 / disk.verify_Bps
    return c.save_s + nbytes * per_byte


def stage_s(engines: list[str], nbytes: int, saves: int, disk: Disk, c: Costs) -> float:
    """A stage: the run itself, the state built, the engines' staging made, the saves."""
    staged = sum(e in STAGED for e in engines)
    return (
        c.stage_s
        + nbytes / disk.build_Bps
        + staged * nbytes / disk.staging_Bps
        + saves * sum(save_s(e, nbytes, disk, c) for e in engines)
    )


def ceilings_s(spec: config_mod.CeilingSpec, ceil: dict, nbytes: int, disk: Disk) -> float:
    """The ceilings before a sweep with the grids of `ceil`: each O_DIRECT run stops issuing
    writes after max_seconds; a buffered run's fsync then drains what the page cache took (all
    of it, at the disk's rate); with the reads, the same runs again (a read taken as no faster
    than the write) and their files written once; the copy (5 runs and a warm-up) and
    serialisation (3) besides."""
    if not ceil:
        return 0.0
    total = probe_bytes(nbytes, spec.min_bytes, spec.max_bytes)
    reps = ceil["repetitions"]
    direct = (len(ceil["direct_search"]) if len(ceil["direct_search"]) > 1 else 0) + reps
    buffered = (len(ceil["buffered_jobs"]) if len(ceil["buffered_jobs"]) > 1 else 0) + reps
    one = total / disk.write_Bps
    copies = 6 * min(nbytes, PROBE_COPY_BYTES) + 6 * min(nbytes, 256 << 20)
    storage = direct * (min(one, spec.max_seconds) + 0.5) + buffered * (one + 0.5)
    reads = storage + one if ceil.get("reads", True) else 0.0
    return storage + reads + copies / disk.memory_Bps + 2


def ceiling_choices(spec: config_mod.CeilingSpec) -> list[tuple[str, dict]]:
    """The ceilings the sizing may pick, cheapest first: none, one configuration each (the
    grid's most writers for O_DIRECT, one writer buffered, once), the config's search."""
    if not spec.enabled:
        return [("off in the config", {})]
    grid = {
        "direct_search": [list(c) for c in spec.direct_search],
        "buffered_jobs": list(spec.buffered_jobs),
        "repetitions": spec.repetitions,
        "reads": spec.reads,
    }
    one = {
        "direct_search": [max((list(c) for c in spec.direct_search), key=lambda c: c[0])],
        "buffered_jobs": [min(spec.buffered_jobs)],
        "repetitions": 1,
        "reads": spec.reads,
    }
    return [("none", {}), ("one configuration each", one), ("the config's search", grid)]


def _size_text(n: int) -> str:
    """`n` as the config reads it: "256MiB", or bytes where no short form is exact."""
    text = format_size(n)
    return text if parse_size(text) == n else str(n)


def _sizes(cfg: config_mod.Config, disk: Disk, at_most: int | None) -> list[int]:
    """The synthetic sizes to try, largest first: the config's largest (or `at_most`), halved
    down to MIN_TOTAL (or the config's own, if smaller), none above a quarter of the free
    space."""
    top = min(max(cfg.total_sizes), at_most or max(cfg.total_sizes))
    low = min(MIN_TOTAL, top)
    out = []
    s = top
    while s >= low:
        if s <= disk.free_bytes // 4 or s == low:
            out.append(s)
        s //= 2
    return out


@dataclass
class Sizing:
    """The plan: what each stage runs, and why."""

    seconds_left: float
    budget_s: float
    scale: float  # the estimates' factor (after the first stage: its time over its estimate)
    config_total_bytes: int
    total_bytes: int
    tensor_bytes: int
    repetitions: int
    warmups: int
    ceilings: str
    model: bool
    estimate_s: float
    stages: list[Stage]
    why: list[str]


def size(
    cfg: config_mod.Config,
    disk: Disk,
    seconds_left: float,
    without: tuple[str, ...] = (),
    costs: Costs = Costs(),
    scale: float = 1.0,
    after_first: int | None = None,
) -> Sizing:
    """The stages and their sizes for `seconds_left` (see the module's docstring);
    `after_first`: the size the first stage ran, when sizing the stages left after it."""
    engines = [e for e in cfg.engines if e not in without]
    first = [e for e in engines if e in FIRST]
    rest = [e for e in engines if e not in FIRST]
    model_wls = [w for w in plan_mod.workloads(cfg) if w.kind == "model"]
    model_bytes = sum(w.size(cfg, False, 1).nbytes for w in model_wls)
    budget = max(0.0, seconds_left * (1 - MARGIN))
    choices = ceiling_choices(cfg.ceilings)
    cheapest = choices[1] if len(choices) > 1 else choices[0]
    warm = cfg.warmups
    why: list[str] = []
    run_first = bool(cfg.total_sizes and first and after_first is None)

    def est(engines: list[str], nbytes: int, reps: int) -> float:
        return scale * stage_s(engines, nbytes, warm + reps, disk, costs)

    def total(s: int, reps: int, ceil: dict, model: bool) -> float:
        t = 0.0
        if cfg.total_sizes:
            t += est(first, s, reps) if run_first else 0.0
            t += est(rest, s, reps) if rest else 0.0
            t += scale * ceilings_s(cfg.ceilings, ceil, s, disk) if rest else 0.0
        if model and model_wls:
            t += est(engines, model_bytes, reps)
        return t

    sizes = _sizes(cfg, disk, after_first) if cfg.total_sizes else [0]
    none = cheapest if not cheapest[1] else ("none", {})
    levels = [(cheapest, bool(model_wls)), (cheapest, False), (none, False)]
    for level in levels:
        (ceil_name, ceil), model = level
        fit = [x for x in sizes if total(x, 1, ceil, model) <= budget]
        if fit:
            s = fit[0]
            break
    else:
        s = sizes[-1]
        why.append(
            f"even {format_size(s)} at one repetition, without the model stage and the "
            f"ceilings, needs ~{total(s, 1, ceil, model):.0f} s, {budget:.0f} s planned: "
            "run anyway, the most valuable stage first"
        )
    if cfg.total_sizes and s < sizes[0]:
        bigger = min(x for x in sizes if x > s)
        why.append(
            f"total_sizes=[{format_size(s)}] (config {format_size(max(cfg.total_sizes))}): "
            f"{format_size(bigger)} would need ~{total(bigger, 1, ceil, model):.0f} s"
        )
    if model_wls and not model:
        why.append(
            f"model stage dropped: {', '.join(w.id for w in model_wls)} "
            f"({format_size(model_bytes)}) x {len(engines)} engines needs "
            f"~{est(engines, model_bytes, 1):.0f} s"
        )
    if cheapest[1] and not ceil and rest:
        why.append(
            f"ceilings dropped: with them {format_size(s)} needs "
            f"~{total(s, 1, cheapest[1], model):.0f} s"
        )
    reps = 1
    for r in range(cfg.repetitions, 1, -1):
        if total(s, r, ceil, model) <= budget:
            reps = r
            break
    if reps < cfg.repetitions:
        why.append(
            f"repetitions={reps} (config {cfg.repetitions}): {cfg.repetitions} would need "
            f"~{total(s, cfg.repetitions, ceil, model):.0f} s"
        )
    if ceil and ceil != choices[-1][1] and rest:
        if total(s, reps, choices[-1][1], model) <= budget:
            ceil_name, ceil = choices[-1]
        else:
            why.append(
                f"ceilings: {ceil_name} (the config's search would need "
                f"~{total(s, reps, choices[-1][1], model):.0f} s in all)"
            )
    tensor = min(max(cfg.tensor_sizes), s // 4) if cfg.total_sizes else 0
    common = [f"repetitions={reps}", f"warmups={warm}", "ceilings.probes=false"]
    synthetic = [
        f"total_sizes=[{_size_text(s)}]",
        f"tensor_sizes=[{_size_text(tensor)}]",
        "models=[]",
    ]
    wid = f"synthetic-{format_size(s)}-{format_size(tensor)}" if cfg.total_sizes else ""
    stages = []
    if run_first:
        stages.append(
            Stage(
                "first",
                first,
                wid,
                warm + reps,
                est(first, s, reps),
                [f"name={cfg.name}-1-first", f"engines=[{','.join(first)}]", *synthetic]
                + common
                + ["ceilings.enabled=false"],
            )
        )
    if cfg.total_sizes and rest:
        ceil_sets = ["ceilings.enabled=false"]
        if ceil:
            grids = {k: json.dumps(ceil[k], separators=(",", ":")) for k in ceil}
            ceil_sets = ["ceilings.enabled=true"] + [f"ceilings.{k}={v}" for k, v in grids.items()]
        stages.append(
            Stage(
                "engines",
                rest,
                wid,
                warm + reps,
                est(rest, s, reps) + scale * ceilings_s(cfg.ceilings, ceil, s, disk),
                [f"name={cfg.name}-2-engines", f"engines=[{','.join(rest)}]", *synthetic]
                + common
                + ceil_sets,
            )
        )
    if model:
        stages.append(
            Stage(
                "model",
                engines,
                ", ".join(w.id for w in model_wls),
                warm + reps,
                est(engines, model_bytes, reps),
                [f"name={cfg.name}-3-model", f"engines=[{','.join(engines)}]"]
                + ["total_sizes=[]", "tensor_sizes=[]", *common, "ceilings.enabled=false"],
            )
        )
    return Sizing(
        seconds_left=round(seconds_left, 1),
        budget_s=round(budget, 1),
        scale=round(scale, 2),
        config_total_bytes=max(cfg.total_sizes, default=0),
        total_bytes=s,
        tensor_bytes=tensor,
        repetitions=reps,
        warmups=warm,
        ceilings=ceil_name if rest else "none (no stage runs the other engines)",
        model=model,
        estimate_s=round(sum(st.estimate_s for st in stages), 1),
        stages=stages,
        why=why,
    )


def describe(disk: Disk, sz: Sizing) -> list[str]:
    """The sizing in a few lines, for the log."""
    cap = f", capped at {disk.cap_Bps / 1e6:.0f} MB/s as the run paces it" if disk.cap_Bps else ""
    refused = f" ({disk.odirect})" if disk.odirect else ""
    lines = [
        f"target {disk.target}: {disk.write_mode} write {disk.write_Bps / 1e9:.2f} GB/s in "
        f"{disk.probe_s:.1f} s{cap}{refused}, buffered + fsync {disk.buffered_Bps / 1e9:.2f} "
        f"GB/s; {format_size(disk.free_bytes)} free",
        f"per byte on the run's device: copy {disk.memory_Bps / 1e9:.1f} GB/s, state built "
        f"{disk.build_Bps / 1e9:.2f} GB/s, staging made {disk.staging_Bps / 1e9:.1f} GB/s, "
        f"restore compared and summed {disk.verify_Bps / 1e9:.2f} GB/s",
        f"{sz.seconds_left:.0f} s left for the run; the plan takes ~{sz.estimate_s:.0f} s of "
        f"{sz.budget_s:.0f} s ({MARGIN:.0%} kept as margin)"
        + (f", estimates x{sz.scale:.2f} from the first stage" if sz.scale != 1 else ""),
    ]
    if sz.total_bytes:
        lines.append(
            f"synthetic {format_size(sz.total_bytes)} in {format_size(sz.tensor_bytes)} tensors,"
            f" {sz.warmups} warm-up + {sz.repetitions} timed save(s) per engine; ceilings: "
            f"{sz.ceilings}; model stage: {'yes' if sz.model else 'no'}"
        )
    lines += sz.why
    for st in sz.stages:
        lines.append(
            f"stage {st.name}: {', '.join(st.engines)} on {st.workload}, "
            f"{st.saves_per_engine} saves each, ~{st.estimate_s:.0f} s"
        )
    return lines


def summary(disk: Disk, sz: Sizing, again: bool = False) -> str:
    """One line for the table."""
    cap = f" (capped {disk.cap_Bps / 1e6:.0f} MB/s)" if disk.cap_Bps else ""
    what = (
        f"{format_size(sz.total_bytes)} (config {format_size(sz.config_total_bytes)})"
        if sz.total_bytes
        else "no synthetic state"
    )
    head = f"sizing again after the first stage (estimates x{sz.scale:.2f})" if again else "sizing"
    return (
        f"{head}: {what}, {sz.warmups}+{sz.repetitions} saves per engine, ceilings "
        f"{sz.ceilings}, model stage {'yes' if sz.model else 'no'}; for {disk.write_mode} "
        f"{disk.write_Bps / 1e9:.2f} GB/s{cap} and {sz.seconds_left:.0f} s left"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, required=True, help="seconds left for the run")
    ap.add_argument("--out", type=Path, required=True, help="where the plan goes")
    ap.add_argument("--without", action="append", default=[], help="an engine not to run")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", action="append", default=[], help="the run's own overrides")
    ap.add_argument(
        "--first-took", type=float, help="size the stages left after the first, which took this"
    )
    args = ap.parse_args(argv)
    start = time.monotonic()
    try:
        cfg = config_mod.load(args.config, args.set)
    except UserError as e:
        print(f"gpu_sizing: {e}", file=sys.stderr)
        return 2
    # An engine of the first stage that cannot run here (nixl without its wheel, or its GDS_MT
    # without CUDA) is skipped by the run with a note: no time is planned for it, and the table
    # says why. (The first stage's alone: asking dcp would import torch.distributed.checkpoint,
    # 2 s of the check's time, for an engine that runs wherever torch does.)
    without = list(args.without)
    cannot = []
    for e in cfg.engines:
        if e in without or e not in FIRST:
            continue
        why = REGISTRY[e].unavailable(cfg.engine_options.get(e))
        if why:
            without.append(e)
            cannot.append(f"{e} not run: {why}")
    args.without = without
    plan_file = args.out / "gpu_sizing.json"
    if args.first_took is not None:
        doc = json.loads(plan_file.read_text())
        disk = Disk(**doc["disk"])
        first = next(st for st in doc["stages"] if st["name"] == "first")
        # Slower than estimated counts in full; faster only in part: a small first stage is
        # mostly fixed costs, which say little about the bytes of the stages left.
        took = args.first_took / max(first["estimate_s"], 1.0)
        scale = doc["scale"] * max(took, MIN_SCALE)
        sz = size(
            cfg,
            disk,
            args.seconds - (time.monotonic() - start),
            tuple(args.without),
            scale=scale,
            after_first=doc["total_bytes"],
        )
        doc["again"] = asdict(sz)
    else:
        disk = measure(cfg)
        sz = size(cfg, disk, args.seconds - (time.monotonic() - start), tuple(args.without))
        doc = {"disk": asdict(disk), **asdict(sz)}
    again = args.first_took is not None
    for line in describe(disk, sz)[2 if again else 0 :]:
        print(f"sizing: {line}")
    args.out.mkdir(parents=True, exist_ok=True)
    plan_file.write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "gpu_stages.tsv").write_text(
        "".join(f"{st.name}\t{st.estimate_s:.0f}\t{' '.join(st.sets)}\n" for st in sz.stages)
    )
    with open(args.out / "gpu_notes.txt", "a") as f:
        f.write(summary(disk, sz, again) + "\n")
        if not again:
            f.writelines(line + "\n" for line in cannot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
