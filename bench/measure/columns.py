"""Columns of the results files, read back with their types.

Imports pandas only for its types: the runs themselves never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def as_bool(s: pd.Series) -> pd.Series:
    """A true/false column as bools, whether pandas read it as bools or as text."""
    if s.dtype == bool:
        return s
    return s.astype(str).str.strip().str.lower().isin(["true", "1", "yes"])


def as_text(s: pd.Series, missing: str) -> pd.Series:
    """A text column with `missing` for empty cells (pandas reads an all-empty column as NaN)."""
    return s.astype(object).where(s.notna(), missing).astype(str)
