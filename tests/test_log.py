"""bench.common.log: the lines ranks write carry their rank, on whatever stderr is now."""

from __future__ import annotations

import pytest

from bench.common import log


def test_a_ranks_lines_say_whose_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    log.for_rank(3).warning("the disk is full")
    log.for_rank(0).error("stopped")
    err = capsys.readouterr().err
    assert err.splitlines() == ["[rank 3] the disk is full", "[rank 0] stopped"]
