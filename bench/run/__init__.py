"""Running: the layer that puts the others to work. The run core every kind of run shares
(`core`), the cases of a sweep (`plan`), what fits in memory (`preflight`), a repetition
measured into rows (`rows`), the case loop (`sweep`), many ranks under torchrun
(`distributed`, launched by `launch`), a real training loop (`training`) and each engine's knobs
searched on the user's disks (`tune`).

Imports: every layer below it, analysis included (the summary a sweep prints).
"""
