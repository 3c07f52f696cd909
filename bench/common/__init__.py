"""Common: the data types and rules every layer shares. User errors (`errors`), human sizes
(`sizes`), strict validation of config mappings (`schema`), the device a run uses (`devices`),
and what an engine is (`traits`: how it stalls, writes and holds memory), which configs,
measurement and analysis read without importing an engine.

Imports: nothing of bench.
"""
