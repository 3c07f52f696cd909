"""The project's log for what ranks say: `logging` to stderr, each line prefixed with the rank
that wrote it ("[rank N] "), so that the lines of torchrun's processes, interleaved on one
terminal, say whose they are. What the CLI prints as its answer (tables, a run's summary, one
error line) is its output, not the log."""

from __future__ import annotations

import logging
import sys
from typing import Any

LOGGER = "ckptbench"


class _Stderr(logging.StreamHandler):
    """To whatever sys.stderr is when a line is written (a test's capture, a redirect)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class RankLog(logging.LoggerAdapter):
    """The log of one rank: every line prefixed with it."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.extra is not None  # for_rank() gives it {"rank": N}
        return f"[rank {self.extra['rank']}] {msg}", kwargs


def _logger() -> logging.Logger:
    log = logging.getLogger(LOGGER)
    if not log.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def for_rank(rank: int) -> RankLog:
    """The log lines of rank `rank`."""
    return RankLog(_logger(), {"rank": rank})
