"""ckptbench: storage-bandwidth benchmarks for deep-learning checkpointing.

Data flow, one module per step: config -> runner (cases) -> workloads (the state) ->
engines (save/load) -> measure (rows) -> results files -> analysis/.
"""

__version__ = "0.1.0"
