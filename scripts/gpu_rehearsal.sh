#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.sh) run here, without a GPU, the way the GPU machine runs it:
# wheels fetched by scripts/gpu_wheels.sh for this CPython, a base python holding only the
# image's documented packages (scripts/gpu-base.txt, linked from .venv; the gpu-only ones left
# out), the check offline over that base, on host-emulated, table included. A wheel the check
# needs and gpu_wheels.sh does not fetch fails here, not on the GPU machine. The target is
# capped (REHEARSAL_CAP, default 300MB/s; empty: uncapped) and the limit shorter
# (REHEARSAL_LIMIT, default 150 s): the check's sizing (scripts/gpu_sizing.py) must see the cap
# and size the state to fit.
#
#   bash scripts/gpu_rehearsal.sh [DIR] [ckptbench run options]   # wheels, base and $OUT under DIR
#
# Environment: REHEARSAL_WHEELS (use these wheels instead of fetching them), REHEARSAL_PYTHON
# (the python whose packages the base links, default .venv/bin/python), REHEARSAL_CAP,
# REHEARSAL_LIMIT.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-$(mktemp -d "${TMPDIR:-/tmp}/ckptbench-rehearsal.XXXXXX")}
mkdir -p "$dir"
PY=${REHEARSAL_PYTHON:-.venv/bin/python}
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
wheels=${REHEARSAL_WHEELS:-$dir/wheels}
if [[ -z ${REHEARSAL_WHEELS:-} ]]; then
    WHEELS=$wheels PYVER=$pyver bash scripts/gpu_wheels.sh
fi
rm -rf "$dir/base"
"$PY" scripts/gpu_env.py base "$dir/base"
# No GPU here: the state on the host, gds through its emulation (kvikio has no libcuda here), a
# capped target; the sizing and everything else as on the GPU machine.
OUT=$dir/out PYTHON=$dir/base/bin/python WHEELS=$wheels GPU_CHECK_LIMIT=${REHEARSAL_LIMIT:-150} \
    bash scripts/gpu_check.sh --set device=host-emulated --set engine_options.gds.io=auto \
    --set "max_write_bw=${REHEARSAL_CAP-300MB/s}" "${@:2}"
echo "gpu_rehearsal: passed; wheels, base and output in $dir"
