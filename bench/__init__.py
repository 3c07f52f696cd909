"""ckptbench: storage-bandwidth benchmarks for deep-learning checkpointing.

The data flows through one module per step:

    config (schema) -> plan (workloads x groups x engines x repetitions)
      -> workloads (the state) -> engines (save, load; their traits)
      -> rows (one repetition measured in phases) -> results (results.csv, env.json)
      -> analysis/ (stats, model, figures, report)

`core` is the run core every kind of run shares (preflight, engines, run directory, env.json,
writers, failures); `sweep` is the case loop of a sweep, in one process or as one rank of a
torchrun job (`distributed`); `training` checkpoints a real training loop on the same core.
"""

__version__ = "0.1.0"
