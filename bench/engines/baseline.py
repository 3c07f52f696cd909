"""Shared housekeeping of the baselines: one checkpoint directory in the first target."""

from __future__ import annotations

import os
import shutil
from typing import Any

from bench import manifest
from bench.engines.base import build_options, check_name, check_targets


class BaselineEngine:
    """A baseline writes where its library writes: a directory `NAME` in the first target."""

    name: str
    Options: type
    stripes = False  # writes into the first target only

    def __init__(self, targets: list[str], **options: Any) -> None:
        self.options = build_options(self.Options, self.name, options)
        self.targets = check_targets(self.name, targets)
        self.pinned_bytes = 0

    @classmethod
    def unavailable(cls) -> str | None:
        return None

    def ckpt_dir(self, name: str) -> str:
        return manifest.checkpoint_dir(self.targets[0], check_name(name))

    def warm(self, state: Any) -> None:
        """Nothing to pre-allocate: the library allocates as it goes."""

    def cached_files(self, name: str) -> list[str]:
        d = self.ckpt_dir(name)
        if not os.path.isdir(d):
            return []
        return [
            os.path.join(d, f) for f in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, f))
        ]

    def delete(self, name: str) -> None:
        shutil.rmtree(self.ckpt_dir(name), ignore_errors=True)

    def close(self) -> None:
        pass
