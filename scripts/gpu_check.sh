#!/usr/bin/env bash
# One-shot GPU check, run from the repository root on a machine with one NVIDIA GPU and no
# package index: its python3 has torch (CUDA), cupy-cuda13x and nvidia-cufile, and the wheels
# for everything else were fetched beforehand into scripts/wheels/ by scripts/gpu_wheels.sh.
#
#   bash scripts/gpu_check.sh [ckptbench run options, e.g. --set total_sizes=[8GiB]]
#
# Makes a throwaway venv on top of the system python (--system-site-packages, so torch and cupy
# are the system's), installs kvikio and whatever the project needs that is missing, offline,
# then runs the harness on configs/gpu-check.yaml (gds with real kvikio, cpu-single, cpu-double,
# torch-save and dcp on a 4 GiB CUDA state and on a gpt2-small state with host `step` scalars,
# each restored into CUDA memory), writing <run-id>/results.csv and env.json under
# ${OUT:-results}; then the real-kvikio test and a table (scripts/gpu_table.py). Under 5 minutes.
# Environment: OUT (results folder), PYTHON (default python3), GPU_CHECK_VENV (keep the venv there
# instead of a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=scripts/wheels
OUT_DIR=${OUT:-results}
PYTHON=${PYTHON:-python3}
t_start=$SECONDS

echo "== GPU"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total \
        --format=csv || echo "gpu_check: nvidia-smi failed (continuing)"
else
    echo "gpu_check: nvidia-smi not found (continuing)"
fi

echo "== wheels"
if ! compgen -G "$WHEELS/kvikio_cu13-*.whl" >/dev/null; then
    echo "gpu_check: no kvikio wheel in $WHEELS; run 'make gpu-wheels' where PyPI is reachable" >&2
    exit 2
fi
(cd "$WHEELS" && sha256sum --quiet -c SHA256SUMS)
py_here=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
py_wheels=$(cat "$WHEELS/PYVER")
echo "$PYTHON is CPython $py_here; wheels are for CPython $py_wheels"
if [[ $py_here != "$py_wheels" ]]; then
    echo "gpu_check: WARNING: wheels were fetched for CPython $py_wheels but $PYTHON is $py_here;" \
        "binary wheels missing here will fail to install (rerun: PYVER=$py_here make gpu-wheels)" >&2
fi

echo "== venv"
if [[ -n ${GPU_CHECK_VENV:-} ]]; then
    venv=$GPU_CHECK_VENV
else
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptbench-gpu.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    venv=$tmp/venv
fi
# Without ensurepip (Debian's python3 without python3-venv) make it without pip and bootstrap pip
# from its wheel below.
"$PYTHON" -m venv --system-site-packages "$venv" 2>/dev/null ||
    "$PYTHON" -m venv --system-site-packages --without-pip "$venv"
py=$venv/bin/python
if ! "$py" -m pip --version >/dev/null 2>&1; then
    pip_whl=$(ls "$WHEELS"/pip-*.whl | head -1)
    "$py" "$pip_whl/pip" install --quiet --no-index "$pip_whl"
fi
pip_install=("$py" -m pip install --disable-pip-version-check --progress-bar off --no-index
    --find-links "$WHEELS")

echo "== install (offline)"
# kvikio's CUDA requirements (cupy-cuda13x[ctk], cuda-toolkit[cufile]) are the system's: no deps.
"${pip_install[@]}" --no-deps -r "$WHEELS/requirements-kvikio.txt"
# Resolved against what the system python already has: only what is missing comes from the wheels.
"${pip_install[@]}" -r "$WHEELS/requirements-runtime.txt"
"${pip_install[@]}" -r "$WHEELS/requirements-project.txt"
if ! "${pip_install[@]}" --no-deps --no-build-isolation --quiet -e .; then
    echo "gpu_check: WARNING: editable install failed; importing bench from $PWD instead" >&2
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
"$py" - <<'EOF' || true
from importlib import metadata
names = ["torch", "cupy-cuda13x", "nvidia-cufile", "cuda-pathfinder", "kvikio-cu13",
         "libkvikio-cu13", "rapids-logger", "numpy", "xxhash", "bitmath", "ckptbench"]
for n in names:
    try:
        print(f"  {n:16} {metadata.version(n)}")
    except metadata.PackageNotFoundError:
        print(f"  {n:16} (not installed)")
EOF
echo "setup took $((SECONDS - t_start)) s"

echo "== check"
rc=0
"$py" -m bench engines
mkdir -p "$OUT_DIR"
before=$(ls "$OUT_DIR")
"$py" -m bench run configs/gpu-check.yaml -q -o "$OUT_DIR" "$@" || rc=$?
run_dir=$(comm -13 <(echo "$before") <(ls "$OUT_DIR") | tail -1)
echo "== the real-kvikio test"
"$py" -m pytest -q -m gpu -p no:cacheprovider tests/test_gds_fake.py tests/test_engines.py || rc=1
if [[ -n $run_dir ]]; then
    "$py" scripts/gpu_table.py "$OUT_DIR/$run_dir" || rc=1
fi
echo "gpu_check: exit $rc after $((SECONDS - t_start)) s; results in $OUT_DIR/$run_dir"
exit $rc
