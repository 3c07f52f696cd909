"""The report's figure captions, by file stem, and the five figures every report shows (each
stands in the section whose question it answers: Figure 4 in the answer, Figures 1, 2 and 5 in
the summary, Figure 3 in the host's section). Imports nothing.
"""

from __future__ import annotations

FIGURES = ("bandwidth_vs_tensor_size", "stall_vs_ssds", "host_memory", "feasibility", "timeline")

CAPTIONS = {
    "bandwidth_vs_tensor_size": "Figure 1. Bandwidth against tensor size, one line per engine: "
    "(a) write bandwidth to durability = checkpoint bytes / total_s, (b) restore = bytes / "
    "restore_s; GB/s = 1e9 B/s; median of repetitions, error bars the interquartile range.",
    "stall_vs_ssds": "Figure 2. Stall (training waits) against the number of SSDs (targets), "
    "one panel per checkpoint, one colour per engine; markers measured (IQR bars), dashed lines "
    "the model calibrated from this run.",
    "host_memory": "Figure 3. Host memory per engine as multiples of the checkpoint size S: "
    "pinned staging and the page-cache peak (growth of Cached during the save), with the model's "
    "estimate.",
    "feasibility": "Figure 4. Feasibility: (a) GDS stall / CPU-centric stall against SSDs per GPU "
    "for each hardware profile (model), with the break-even SSD count and today's ~1 data SSD per "
    "GPU; (b) the same for loading a checkpoint: CPU-centric restore time / GDS restore time, "
    "from each profile's SSD read and host-to-device figures (cited; 'assumed' where the profile "
    "has none), a dot where GDS starts to load faster. This figure answers 'is GDS worth it'.",
    "timeline": "Figure 5. One checkpoint per engine on a time axis: the stall (training waits) "
    "and the background persist phase, with checksum time inside persist (its position "
    "indicative); from the median repetition.",
    "host_cpu": "Figure 9. What each path costs the host: CPU-seconds per GB made durable "
    "against write bandwidth to durability, one line per engine through the tensor sizes of the "
    "largest checkpoint, (a) in the stall and (b) while persisting, (c) the whole save per engine "
    "beside its CPU floor (the black mark: what its work costs done by the best tools, "
    "measured in the same run); filled markers the whole "
    "host (/proc/stat busy time less other processes' CPU and the run's idle baseline: kernel "
    "writeback and interrupts count), hollow this process and its children; medians of "
    "repetitions.",
    "restore": "Figure 12. Restore bandwidth = checkpoint bytes / restore_s (read back from a "
    "cold page cache into the device), one line per engine: (a) against tensor size (the largest "
    "checkpoint, the fewest SSDs), (b) against the number of SSDs (targets) for one workload; "
    "median of repetitions, error bars the interquartile range; grey, dashed or dotted, the read "
    "ceiling that judges the engines it names (O_DIRECT read, or a buffered read of a cold file "
    "for the page-cache paths) where the run measured one.",
    "lost_fraction": "Figure 8. What checkpointing costs training on this machine: the expected "
    "fraction of training time lost (stalls plus rework after a failure) against the mean time "
    "between failures, each engine at its best interval (Young/Daly with its stall as the cost; "
    "a failure costs the work since the last durable checkpoint and the path's restore as this "
    "run measured it, at the largest checkpoint and fewest SSDs; "
    "`ckptbench model PROFILE --mtbf HOURS`).",
    "contention": "Figure 7. Many ranks at once (a multi-rank run): (a) the stall of the slowest "
    "rank and (b) the aggregate write bandwidth (every rank's bytes / the slowest rank's total_s) "
    "against the number of ranks checkpointing at once, solid for shared targets and dashed "
    "(hollow markers) for dedicated ones; dotted: the model's fair share of the host's SSDs and "
    "memory bandwidth, calibrated from the one-rank cases of the same run.",
    "training_stall": "Figure 6. Stall in a real training loop. (a) Wall time of every training "
    "step (forward, backward, AdamW step, and the save() call in the marked steps) against the "
    "step number, one panel per engine; shaded: the checkpoint persisting in the background; "
    "dashed: the median step of the same loop without checkpoints (none). (b) Per engine, per "
    "checkpoint: the step-time inflation against none (sum of its step times - sum of none's over "
    "the same steps); against the engine's own quiet steps (no save, no persist beside them), "
    "split into the step with the save() call and the contention in the steps beside the "
    "background persist; and the engine's median stall_s.",
}
