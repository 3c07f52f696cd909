"""Analysis of results files (reports, model, comparisons); reads results, never runs an engine."""
