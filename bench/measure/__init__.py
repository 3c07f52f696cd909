"""Measurement: what a run observes and keeps. Timers and samplers around a save (`timers`), the
host's CPU and DRAM cost (`hostcost`), the environment block (`env`), the device ceilings (the
`ceilings` package: every kind and what a measurement keeps, typed, and how each kind is
measured, one module per job), the one definition of efficiency (`efficiency`), the results
files (`results`: one typed row per file) and what a row type derives (`columns`: header,
reader, docs table). A new kind of ceiling or a new result column goes here.

Imports: bench.common, bench.storage.
"""
