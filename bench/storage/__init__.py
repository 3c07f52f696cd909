"""Storage: how bytes reach the disk and come back, whichever engine moves them. O_DIRECT files
and aligned buffers (`odirect`), pinned staging (`staging`), rate caps (`pacing`), the state tree
(`tree`), checksums, the packed file layout (`layout`), the atomic manifest (`manifest`), a
name's lifecycle on its targets (`generations`) and the check of a restored state (`verify`).

Imports: bench.common.
"""
