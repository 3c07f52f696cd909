"""What the `make perf` files share: their scratch directories and the tables they print after
pytest-benchmark's own. A module of its own, not a tests/perf/conftest.py: a second module named
`conftest` would shadow tests/conftest.py for the tests that `from conftest import ...`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def scratch_dir(prefix: str) -> Path:
    """A fresh directory under `$CKPTBENCH_SCRATCH/perf`, else `<repo>/scratch/perf`, never /tmp
    (often tmpfs, which refuses O_DIRECT); the caller removes it."""
    env = os.environ.get("CKPTBENCH_SCRATCH")
    base = Path(env) / "perf" if env else REPO / "scratch" / "perf"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class SummaryTable:
    """A plugin that prints its rows after pytest-benchmark's tables (`write`, by subclasses),
    even when its regression check (--benchmark-compare-fail) raises from its own summary.
    Registered while the session runs (`register`), its hook is still called at the end."""

    def __init__(self) -> None:
        # (group, name, a count: bytes or tensors, median and min seconds per round), in run order
        self.rows: list[tuple[str, str, int, float, float]] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Any:
        try:
            return (yield)
        finally:
            if self.rows:
                self.write(terminalreporter)

    def write(self, tr: Any) -> None:
        raise NotImplementedError

    def register(self, config: pytest.Config, name: str) -> SummaryTable:
        config.pluginmanager.register(self, name)
        return self
