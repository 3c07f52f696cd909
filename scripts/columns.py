"""Write the columns tables of docs/results.md again from the row types (bench.measure.results):
`make columns` after adding or changing a column. `--check` only says whether they differ
(exit 1), as tests/test_results.py does."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.measure import columns, results

PAGE = Path(__file__).resolve().parent.parent / "docs" / "results.md"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if a table differs, write nothing")
    args = ap.parse_args()
    text = PAGE.read_text()
    new = columns.render_docs(text, results.DOCS)
    if new == text:
        return 0
    if args.check:
        print(f"docs/{PAGE.name}: a columns table differs from its row type; run make columns")
        return 1
    PAGE.write_text(new)
    print(f"docs/{PAGE.name}: columns tables written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
