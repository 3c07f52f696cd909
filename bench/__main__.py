"""`python -m bench ...` is the same as the `ckptbench` command."""

from bench.cli import main

raise SystemExit(main())
