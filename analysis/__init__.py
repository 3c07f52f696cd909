"""Analysis of results files (reports, model, comparisons); reads results, never runs an engine.
A new figure or report section goes here.

Imports: bench.common, bench.measure (the results files and the one definition of efficiency).
"""
