"""ckptbench: storage-bandwidth benchmarks for deep-learning checkpointing.

The packages are floors, each importing only the floors below it (tests/test_layers.py):

    common     errors, sizes, strict config models, devices, engines' traits
    storage    O_DIRECT, staging, the state tree, checksums, layout, manifest, generations
    measure    timers and samplers, host cost, the environment block, ceilings, efficiency,
               results files
    workloads  the states to save
    engines    the registry and one module per data path
    config     sweep and training configs
    analysis/  (beside bench/) reads results files: statistics, the model, figures, reports
    run        the run core, cases, preflight, rows, the case loop, torchrun ranks, training
    cli        the `ckptbench` command
"""

__version__ = "0.2.0"
