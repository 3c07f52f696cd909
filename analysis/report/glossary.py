"""The report's glossary: what every column of its tables means, said once.

Each table header the report prints is a `Term`: its definition, and the columns of the results
files it is computed from. The glossary at the end of a report lists the terms of the tables it
holds, then the docs of those results columns, taken from the row types themselves
(bench.measure.results, as README's columns tables are): a definition lives here or on the row
type, never in a section's prose and never twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from analysis.report.doc import Doc
from bench.measure import columns, results


@dataclass(frozen=True)
class Term:
    """A column of a report table: what it shows (`text`) and the results columns it is
    computed from (`of`: `name` for results.csv, `FILE:name` for another results file)."""

    text: str
    of: tuple[str, ...] = ()


MEDIAN = "the median over the case's timed repetitions"

TERMS: dict[str, Term] = {
    # the case
    "workload": Term("The state saved.", ("workload",)),
    "SSDs": Term("Target directories (SSDs) of the case.", ("n_targets",)),
    "targets": Term("Target directories (SSDs) of the case.", ("n_targets",)),
    "engine": Term("The engine (data path), or a profile's path in the host table.", ("engine",)),
    "mode": Term(
        "EMULATED = host-emulated device (and for gds the O_DIRECT emulation of GDS), COMPAT = "
        "kvikio compat mode (not GPUDirect Storage); '-' a real device.",
        ("gds_mode", "emulated"),
    ),
    "n": Term(
        "Timed repetitions behind the medians (warm-ups and failed rows left out).", ("rep",)
    ),
    "IQR": Term(
        "Interquartile range (75th - 25th percentile) over the repetitions of the column to its "
        "left."
    ),
    # the summary
    "write GB/s": Term(
        f"Write bandwidth to durability: checkpoint bytes / total_s, {MEDIAN}; GB/s = 1e9 B/s.",
        ("total_bytes", "total_s"),
    ),
    "stall s": Term(
        f"How long training waits: stall_s, {MEDIAN} (MLPerf's table: the slowest rank's).",
        ("stall_s",),
    ),
    "durable s": Term(
        f"Time to durability: total_s, {MEDIAN} (MLPerf's table: the slowest rank's).",
        ("total_s",),
    ),
    "tensors": Term("The state's tensor count.", ("n_tensors",)),
    "stall us/tensor": Term(
        "Median stall_s over the tensor count, in microseconds: what a save costs per tensor "
        "beside what it costs per byte.",
        ("stall_s", "n_tensors"),
    ),
    "persist us/tensor": Term(
        "Median persist_s over the tensor count, in microseconds (persist: what wait() still "
        "blocked after save() returned; a few microseconds a save for the engines whose save() "
        "returns durable).",
        ("persist_s", "n_tensors"),
    ),
    "restore GB/s": Term(
        "Restore bandwidth: checkpoint bytes / restore_s, the read from a cold page cache (the "
        f"checkpoint's pages evicted first) into the requested device, {MEDIAN}.",
        ("total_bytes", "restore_s"),
    ),
    "pinned xS": Term(
        "Host staging memory the engine holds, in multiples of the checkpoint size S.",
        ("pinned_bytes",),
    ),
    "page cache xS": Term(
        "Peak page-cache growth during the save, in multiples of the checkpoint size S.",
        ("page_cache_peak_bytes",),
    ),
    "x torch-save stall": Term(
        "torch-save's median stall (same workload, its one SSD) over this engine's: > 1, this "
        "engine holds training for less time than what users do today.",
        ("stall_s",),
    ),
    "x torch-save durable": Term(
        "torch-save's median time to durability (same workload, its one SSD) over this engine's.",
        ("total_s",),
    ),
    "x best baseline stall": Term(
        "The best baseline's median stall on the workload over this engine's: the best of the "
        "libraries users would otherwise pick (torch.save, DCP, safetensors, FastPersist: "
        "whichever ran), each by its shortest median on the workload.",
        ("stall_s",),
    ),
    "x best baseline durable": Term(
        "The best baseline's median time to durability on the workload over this engine's.",
        ("total_s",),
    ),
    "write eff": Term(
        "Median write efficiency: bytes / (save() called until durable) over the ceiling of "
        "the engine's kind of write for the targets it wrote, against the best ceilings "
        "measured before and after the sweep (env.json); 'ceiling beaten' marks a median above "
        "1.05: the ceiling, not the engine, is then in question.",
        ("write_efficiency",),
    ),
    "snapshot eff": Term(
        "Median snapshot efficiency: bytes / stall over the copy (device-to-host) ceiling, the "
        "best measured before and after the sweep; 'ceiling beaten' as for write eff.",
        ("snapshot_efficiency",),
    ),
    # restores
    "restore s": Term(
        f"The read back into the requested device, {MEDIAN} (MLPerf's table: the slowest "
        "rank's); without the engine's own checksum check.",
        ("restore_s",),
    ),
    "read ceiling GB/s": Term(
        "The read the engine is judged against, for the targets it read: O_DIRECT for the "
        "engines without page cache, a buffered read of a cold file for the page-cache paths "
        "(the run's best).",
    ),
    "restore eff": Term(
        "restore GB/s over the read ceiling ('ceiling beaten' above 1.05: the ceiling, not the "
        "engine, is then in question).",
        ("restore_efficiency",),
    ),
    "x best baseline restore": Term(
        "The shortest median restore of the libraries users would otherwise pick, on the same "
        "workload, over this engine's (> 1: this engine loads faster).",
        ("restore_s",),
    ),
    "page cache left xS": Term(
        "The checkpoint's bytes still in the page cache right after the restore, in multiples "
        "of S: memory the restore took from training that the kernel must reclaim (0 for an "
        "O_DIRECT read); n/a for a run made before it was recorded.",
        ("restore_cached_bytes",),
    ),
    # what each path costs the host
    "CPU s/GB, process": Term(
        "CPU seconds of this process (every thread and the children it ran) per GB made "
        "durable (1e9 B), median over every timed repetition.",
        ("cpu_user_s", "cpu_sys_s"),
    ),
    "CPU s/GB, host": Term(
        "CPU seconds of the whole host per GB made durable: /proc/stat busy time less other "
        "processes' CPU time and the run's idle baseline, so kernel writeback, journal threads "
        "and interrupts count.",
        ("host_cpu_s", "host_busy_s", "host_others_cpu_s", "host_baseline_cores"),
    ),
    "host: stall": Term("The host's CPU seconds per GB inside the stall.", ("stall_host_cpu_s",)),
    "CPU s/GB": Term(
        "The path's CPU seconds per GB made durable: the whole host's where the run measured "
        "it, else this process's.",
        ("host_cpu_s", "cpu_user_s", "cpu_sys_s"),
    ),
    "floor s/GB": Term(
        "What the path's work must cost the CPUs at least, per GB, measured in the same run "
        "(env.json `cpu_floor`, bench/measure/floor.py): fio's own job CPU for an O_DIRECT "
        "io_uring write of the bytes, plus a single-thread copy into warm memory for a "
        "snapshot path, xxh3 over the bytes where it checksums, torch.save (into a sink that "
        "keeps nothing) where it serialises."
    ),
    "x floor": Term("CPU s/GB over floor s/GB: how much CPU the path spends beyond its work."),
    "floor =": Term("The parts the path's floor adds up (fio: fio's write)."),
    "its own parts, s/GB": Term(
        "The parts of a save the engine timed itself, wall seconds per GB (median): the copy "
        "into staging or its buffer, the hash, I/O submission and completion, fsync; `-` where "
        "it says none.",
        ("hash_s", "io_detail"),
    ),
    "host: persist": Term(
        "The host's CPU seconds per GB while persisting (after save() returned).",
        ("host_cpu_s", "stall_host_cpu_s"),
    ),
    "cores busy persisting": Term(
        "Cores the host kept busy while persisting (a path that persists inside its stall: "
        "over the whole save).",
    ),
    "DRAM B/B": Term(
        "Host DRAM bytes moved per checkpoint byte, measured from the memory controllers' "
        "counters where the run read them, else derived from the path's copies (`derived`, on "
        "this run's device).",
        ("dram_bytes",),
    ),
    "DRAM B/B on a GPU (derived)": Term(
        "The same derived from the path's copies on a GPU server (the state in device memory)."
    ),
    "profile": Term(
        "A hardware profile (configs/hardware/*.yaml; this-machine: calibrated from this run)."
    ),
    "cores needed (host has)": Term(
        "Cores to checkpoint every GPU of the profile at its SSDs' aggregate rate = CPU-s/GB x "
        "GB/s, charged this run's CPU-seconds per GB (servers) or the profile's own (this "
        "machine); in brackets the host's cores as the profile cites them."
    ),
    "DRAM GB/s (host peak)": Term(
        "DRAM bandwidth the same takes = derived bytes per byte x GB/s; in brackets the host's "
        "DRAM peak as the profile cites it (`unknown` where it cites none)."
    ),
    "DRAM % lost persisting": Term(
        "The share of the DRAM peak the path takes beside training while it persists."
    ),
    "verdict": Term("Whether the host affords the path, and if not which resource it lacks."),
    # the answer's profile table
    "b: D2H GB/s": Term("The profile's device-to-host link b, GB/s."),
    "w: SSD write GB/s": Term("One SSD's write bandwidth w, GB/s."),
    "SSDs per GPU today": Term("The SSDs per GPU the profile's server carries."),
    "GDS / CPU-centric stall at that count": Term(
        "The model's GDS stall over the CPU-centric (snapshot) stall at that SSD count: > 1, "
        "GDS holds training longer."
    ),
    "break-even SSDs per GPU (n*)": Term(
        "The SSDs per GPU from which GDS stalls no longer than a CPU-centric snapshot (n* = d "
        "/ w, in brackets); never where adding targets adds no bandwidth."
    ),
    "r: SSD read GB/s": Term("One SSD's read bandwidth r, GB/s ('assumed' where not cited)."),
    "CPU-centric / GDS restore at that count": Term(
        "The model's CPU-centric O_DIRECT restore time over GDS's at that SSD count (a restart, "
        "all GPUs at once): > 1, GDS loads faster."
    ),
    # the model
    "write rate r": Term("The rate the engine writes at in the model (its formula)."),
    "stall": Term("The model's stall of one GPU's checkpoint."),
    "time to durability": Term("The model's time from save() until durable."),
    "host memory": Term("The host memory the path holds, in multiples of S."),
    "input": Term("An input of the model."),
    "value": Term("Its value (the environment table: what the run recorded)."),
    "kind": Term(
        "Where the input comes from: measured, from run, vendor rating, spec, derived or assumed."
    ),
    "source": Term("Where the value is cited from."),
    "stall s: model": Term("The model's stall of the case, from this run's device ceilings alone."),
    "durable s: model": Term("The model's time to durability of the case."),
    "restore s: model": Term(
        "The model's restore of the case ('-' where the run measured no read ceilings)."
    ),
    "measured": Term("The measured median (or published figure) beside the model's."),
    "error %": Term("(model - measured) / measured, in percent."),
    "point": Term("A published measurement (configs/published.yaml)."),
    "test": Term(
        "independent: predicted from figures of other experiments; a consistency check otherwise."
    ),
    "hardware": Term("The hardware the published point was measured on."),
    "path": Term("The data path the point measured (and the tool that drove it)."),
    "predicted": Term("The model's prediction of the point."),
    "error": Term(
        "(predicted - measured) / measured; * a miss of more than 25 %, (fig.) a value read "
        "off a figure."
    ),
    "rests on assumed": Term("The profile inputs of the prediction that are assumed, not cited."),
    # many ranks at once
    "mapping": Term(
        "How the ranks' files map onto the targets (shared, dedicated-subfolders...); (one rank) "
        "stands for every mapping.",
        ("target_map",),
    ),
    "ranks": Term("Ranks that checkpointed at once.", ("ranks_active",)),
    "stall s (max over ranks)": Term(
        "Median stall of the aggregate row: the slowest rank's.", ("stall_s", "aggregate")
    ),
    "model": Term("The model's fair share of the host's SSDs and memory bandwidth beside it."),
    "aggregate GB/s": Term(
        "Every rank's bytes / the slowest rank's total_s, median.", ("total_bytes", "total_s")
    ),
    # how the cost grows
    "stall slope": Term(
        "Stall fitted as a power law of the checkpoint size (log-log least squares over the "
        "per-size medians): its slope +- its standard error; 1 a linear cost."
    ),
    "durable slope": Term("The slope of the time to durability, fitted as the stall slope."),
    "sizes": Term("Checkpoint sizes fitted (smallest-largest)."),
    "faster than linear": Term(
        "Which costs grow faster than linear: a slope above 1 by more than 0.1 and twice its error."
    ),
    # MLPerf
    "ckpts": Term("Checkpoints the engine wrote (MLPerf) or saved in the loop (training)."),
    "write GiB/s (slowest rank, durable)": Term(
        "Every rank's bytes of a checkpoint, on every host / 1024^3 / its duration as MLPerf's "
        "rules define it (the maximum over the ranks of every host), the mean over the "
        "checkpoints, as DLIO computes it (it prints GB); a write whose device said no is left "
        "out."
    ),
    "write GiB/s (DLIO: rank 0, durable)": Term(
        "The same bytes over rank 0's own duration, as DLIO v2.0 computes its summary; durable "
        "for every engine here."
    ),
    "write GiB/s (DLIO v2.0 as run: rank 0, not durable)": Term(
        "Rank 0's torch.save without fsync (dlio-style's stall): what DLIO v2.0 times and "
        "reports, NOT durable."
    ),
    "read GiB/s (slowest rank)": Term("The read (the restore, from storage), as the write."),
    "read GiB/s (DLIO: rank 0)": Term("The read over rank 0's own duration."),
    "x DLIO-style write": Term(
        "An engine's slowest-rank write throughput over dlio-style's (durable)."
    ),
    "x DLIO-style read": Term("An engine's slowest-rank read throughput over dlio-style's."),
    "device: durable": Term(
        "What the targets' block devices counted: whether every rank's bytes and a cache flush "
        "reached them by the time ckptbench timed it durable. The ranks share the host's "
        "devices, so in one rank's interval the others' writes count too: a 'no' is "
        "conclusive, a 'yes' only necessary.",
        ("durable_witness",),
    ),
    # stragglers, a row per case, engine and time (analysis.stragglers)
    "time": Term(
        "Which time of every rank's rows: stall (save() returns), durable (save() until "
        "durable) or restore.",
        ("stall_s", "total_s", "restore_s"),
    ),
    "p50 s": Term("The median of that time over ranks x timed repetitions."),
    "p99 s": Term("Its 99th percentile over ranks x timed repetitions."),
    "max/p50": Term("The largest of them over the p50."),
    "slowest": Term(
        "The rank whose median is largest, its host, and that median over the p50; a "
        "straggler above 1.5x.",
        ("rank", "node"),
    ),
    # MLPerf across hosts, a row per engine and host
    "host": Term("The host (its name), node rank order.", ("node", "node_rank")),
    "its ranks": Term(
        "The host's ranks, first-last (consecutive, as DLIO lays them out).", ("rank",)
    ),
    "share GiB": Term("The host's ranks' bytes of a checkpoint / 1024^3.", ("total_bytes",)),
    "write s (its slowest rank)": Term(
        "The host's slowest rank's time to durability, the mean over the checkpoints.",
        ("total_s",),
    ),
    "read s (its slowest rank)": Term(
        "The host's slowest rank's restore, the mean over the checkpoints.", ("restore_s",)
    ),
    "its share's write GiB/s": Term(
        "The host's share over its slowest rank's write, the mean over the checkpoints: what "
        "the host alone would have reported."
    ),
    "its share's read GiB/s": Term("The same for the read."),
    "sets the job's write duration": Term(
        "In how many checkpoints the host's slowest rank was the slowest of the job (a tie "
        "counts for each host): the host that MLPerf's duration waits for."
    ),
    "device: DLIO v2.0 as run": Term(
        "The same at the moment DLIO v2.0 stops its clock (dlio-style's return).",
        ("return_witness",),
    ),
    # a training loop
    "step s (median)": Term("Median wall time of a training step.", ("training_steps.csv:step_s",)),
    "step s during persist": Term(
        "Median step time while a checkpoint persists in the background.",
        ("training_steps.csv:during_persist",),
    ),
    "inflation s / ckpt vs none": Term(
        "Step-time inflation a checkpoint: sum of the engine's step times - sum of none's over "
        "the same steps (the loop without checkpoints)."
    ),
    "vs quiet steps": Term(
        "The same against the engine's own quiet steps (neither a save nor beside a persist), "
        "which the drift of the machine's speed between the engines' runs does not reach."
    ),
    "of it contention": Term(
        "The part of it in the steps beside the background persist (GIL, memory bandwidth, the "
        "writer threads' CPU time), not in the step with the save() call."
    ),
    "stall_s (median)": Term(
        "Median stall of the timed saves.", ("training_checkpoints.csv:stall_s",)
    ),
    "durable s (median)": Term(
        "Median time to durability of the timed saves.", ("training_checkpoints.csv:total_s",)
    ),
    "restart s": Term(
        "From a failure to the first training step after the load: the last checkpoint loaded "
        "with the page cache dropped, load_state_dict into a fresh model and optimizer (built "
        "before the clock starts), and one training step, device synchronised; one restart per "
        "engine.",
        ("training_checkpoints.csv:restart_s",),
    ),
    "of it load s": Term("The load.", ("training_checkpoints.csv:restart_load_s",)),
    "load_state_dict s": Term("restart s - the load - the first step."),
    "first step s": Term(
        "The first training step after it.", ("training_checkpoints.csv:restart_first_step_s",)
    ),
    "losses match": Term(
        "The first steps after the restart had the uninterrupted run's losses, bit for bit.",
        ("training_checkpoints.csv:restart_loss_match",),
    ),
    # a tuned run (ckptbench run --tuned; docs/tune.md)
    "tuned on SSDs": Term("The SSD count of the tune's search whose knobs the run applied."),
    "run SSDs": Term("The SSD count of this run's rows beside them (the nearest it has)."),
    "knobs": Term("The engine options the tuned profile set (the rest as the config has them)."),
    "default GB/s (tune)": Term(
        "The tune's median durable GB/s with the engine's default knobs (bytes / save() until "
        "durable)."
    ),
    "tuned GB/s (tune)": Term("The tune's median durable GB/s with the knobs it found."),
    "this run GB/s": Term(
        f"This run's write bandwidth to durability with them: bytes / total_s, {MEDIAN}.",
        ("total_bytes", "total_s"),
    ),
    "ceiling GB/s": Term(
        "The run's ceiling for the engine's kind of write on those targets (this run GB/s "
        "over its write efficiency); empty without ceilings.",
        ("write_efficiency",),
    ),
}


def _row_docs() -> dict[str, str]:
    """`FILE:name` (plain `name` for results.csv) -> the column's doc, from the row types."""
    out = {}
    for file, kind in results.DOCS.items():
        for c in columns.columns(kind):
            out[c.name if kind is results.Row else f"{file}:{c.name}"] = c.doc
    return out


def table_headers(markdown: str) -> list[str]:
    """The column headers of every table in `markdown` (a table's first line, the one above
    its `|---|` line), each once, in order; empty headers left out."""
    lines = markdown.splitlines()
    out: list[str] = []
    for above, line in zip(lines, lines[1:], strict=False):
        if line.startswith("|---"):
            out += [c.strip() for c in re.split(r"(?<!\\)\|", above.strip())[1:-1]]
    return [h for h in dict.fromkeys(out) if h]


def undefined(headers: list[str]) -> list[str]:
    """The headers (table columns) the glossary has no term for."""
    return [h for h in dict.fromkeys(headers) if h and h not in TERMS]


def glossary_section(d: Doc) -> None:
    """The glossary of every column of the tables `d` holds so far (those written by
    Doc.table and those inside a Markdown block alike), then the docs of the results columns
    they are computed from."""
    used = table_headers(d.markdown())
    d.h(2, "Glossary")
    d.p(
        f"The {len(used)} table columns above, in the order they first appear; medians are "
        "over a case's timed repetitions (warm-ups left out); GB/s = 1e9 B/s, GiB/s = 2^30 "
        "B/s; S = the checkpoint size."
    )
    d.ul([f"**{h}**: {TERMS[h].text}" if h in TERMS else f"**{h}**: (not defined)" for h in used])
    docs = _row_docs()
    named = dict.fromkeys(c for h in used if h in TERMS for c in TERMS[h].of)
    d.p("The results columns they are computed from, as the row types define them:")
    d.ul([f"`{c}`: {docs[c]}" for c in named])
