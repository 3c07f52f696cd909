"""Measurement: what a run observes and keeps. Timers and samplers around a save (`timers`), the
host's CPU and DRAM cost (`hostcost`), the environment block (`env`), the device ceilings
(`ceilings`: every kind and what a measurement keeps, typed; `ceiling`: how each kind is
measured), the one definition of efficiency (`efficiency`), the results files (`results`: one
typed row per file) and what a row type derives (`columns`: header, reader, docs table). A new
kind of ceiling or a new result column goes here.

Imports: bench.common, bench.storage.
"""
