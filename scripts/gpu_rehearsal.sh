#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.sh) run here, without a GPU, the way the GPU machine runs it:
# wheels fetched by scripts/gpu_wheels.sh for this CPython, a base python holding only the
# image's documented packages (scripts/gpu-base.txt, linked from .venv; the gpu-only ones left
# out), the check offline over that base, on host-emulated at a small size, table included.
# A wheel the check needs and gpu_wheels.sh does not fetch fails here, not on the GPU machine.
#
#   bash scripts/gpu_rehearsal.sh [DIR]     # wheels, base and $OUT under DIR (default: a temp dir)
#
# Environment: REHEARSAL_WHEELS (use these wheels instead of fetching them), REHEARSAL_PYTHON
# (the python whose packages the base links, default .venv/bin/python).
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
# No GPU here: the state on the host, gds through its emulation (kvikio has no libcuda here),
# a small state, no ceilings; everything else as on the GPU machine.
OUT=$dir/out PYTHON=$dir/base/bin/python WHEELS=$wheels bash scripts/gpu_check.sh \
    --set device=host-emulated --set engine_options.gds.io=auto \
    --set 'total_sizes=[32MiB]' --set 'tensor_sizes=[8MiB]' --set 'models=[]' \
    --set repetitions=1 --set warmups=0 --set ceilings.enabled=false
echo "gpu_rehearsal: passed; wheels, base and output in $dir"
