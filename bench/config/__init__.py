"""Configuration: the strict YAML configs a user writes. A sweep (`sweep`: workloads, engines
with their options, SSD counts, ceilings, ranks) and a training run (`training`), each loaded
into frozen models with errors that name the key path.

Imports: bench.common, bench.engines (names and option models), bench.workloads (presets).
"""
