"""Running: the layer that puts the others to work. The run core every kind of run shares
(`core`: the run directory, the rows' writers, the `World` of ranks), a sweep's plan and its
cases (`plan`), the plan decided whole before anything runs (`decide`), what fits in memory
(`preflight`), the measurement of one repetition (`protocol`) into rows (`rows`), the case
loop (`cases`) and the sweep that strings the steps together (`sweep`), many ranks under
torchrun (`distributed`, launched by `launch`), a real training loop (`training`) and each
engine's knobs searched on the user's disks (`tune`).

Imports: every layer below it, analysis included (the summary a sweep prints).
"""
