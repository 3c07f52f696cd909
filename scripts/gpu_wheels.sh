#!/usr/bin/env bash
# Download, on a machine that reaches PyPI, every wheel that scripts/gpu_check.sh installs offline
# on a GPU machine whose python3 already has torch (CUDA), cupy-cuda13x and nvidia-cufile but not
# kvikio, and may lack this project's own dependencies.
#
#   bash scripts/gpu_wheels.sh     # PYVER=3.11 for another CPython than the GPU machine's 3.12
#
# Wheels land in scripts/wheels/ (git-ignored) with three requirement files, a PYVER stamp and
# SHA256SUMS, which gpu_check.sh reads:
# - requirements-kvikio.txt: kvikio-cu13 and libkvikio-cu13, installed with --no-deps because
#   their CUDA dependencies (cupy-cuda13x[ctk], cuda-toolkit[cufile]) are already on the GPU
#   machine and are gigabytes of wheels;
# - requirements-runtime.txt: what the check itself needs (kvikio's pure and small runtime deps,
#   the project's numpy/bitmath/xxhash/psutil, setuptools for the editable install), resolved
#   offline;
# - requirements-project.txt: the rest of the project's dependencies, resolved offline too.
# The deps are downloaded with their own dependencies resolved for the target platform (pip
# download --only-binary=:all: may resolve), so pydantic-core, typing-extensions, tzdata and the
# like come along at versions that fit each other.
#
# Environment: PYVER (default 3.12: the lent H200 machine's python3), KVIKIO_VERSION (default 26.10.*; the newest release if that
# does not exist), PIP (default: the project venv's pip, else python3 -m pip).
set -euo pipefail
cd "$(dirname "$0")/.."

PYVER=${PYVER:-3.12}
KVIKIO_VERSION=${KVIKIO_VERSION:-26.10.*}
WHEELS=scripts/wheels
if [[ -z ${PIP:-} ]]; then
    if [[ -x .venv/bin/python ]]; then PIP=".venv/bin/python -m pip"; else PIP="python3 -m pip"; fi
fi
read -r -a pip <<<"$PIP"

if ! [[ $PYVER =~ ^3\.[0-9]+$ ]]; then
    echo "gpu_wheels: PYVER must look like 3.11, got '$PYVER'" >&2
    exit 2
fi

# pip takes --platform literally (a manylinux_2_28 tag does not imply the older ones), and wheels
# on PyPI carry various manylinux tags; a GPU machine with glibc >= 2.28 runs all of these.
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${p}_x86_64")
done
download=("${pip[@]}" download --disable-pip-version-check --progress-bar off --only-binary=:all:
    "${platforms[@]}" --implementation cp --python-version "$PYVER" -d "$WHEELS")

mkdir -p "$WHEELS"
rm -f "$WHEELS"/*.whl "$WHEELS"/requirements-*.txt "$WHEELS"/PYVER "$WHEELS"/SHA256SUMS

echo "== kvikio-cu13 ${KVIKIO_VERSION} for CPython ${PYVER}"
if ! "${download[@]}" --no-deps "kvikio-cu13==${KVIKIO_VERSION}"; then
    echo "gpu_wheels: no kvikio-cu13==${KVIKIO_VERSION} for CPython ${PYVER}; taking the newest" >&2
    "${download[@]}" --no-deps kvikio-cu13
fi
kv_whl=$(ls "$WHEELS"/kvikio_cu13-*.whl)
kv_version=$(basename "$kv_whl" | cut -d- -f2)
"${download[@]}" --no-deps "libkvikio-cu13==${kv_version}"
printf 'kvikio-cu13==%s\nlibkvikio-cu13==%s\n' "$kv_version" "$kv_version" \
    >"$WHEELS/requirements-kvikio.txt"

# kvikio's and libkvikio's runtime requirements minus the CUDA ones already on the GPU machine
# (cupy-cuda13x, cuda-toolkit[cufile] = nvidia-cufile). libkvikio loads librapids_logger.so
# through the rapids_logger package and libcufile through cuda.pathfinder: without either
# package it falls back to system paths and fails to load.
echo "== runtime requirements of kvikio ${kv_version}:"
unzip -p "$kv_whl" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' || true
unzip -p "$WHEELS"/libkvikio_cu13-*.whl '*.dist-info/METADATA' | grep '^Requires-Dist' || true
cat >"$WHEELS/requirements-runtime.txt" <<'EOF'
rapids-logger==0.3.*
cuda-pathfinder
packaging
numpy>=2.0,<3.0
bitmath>=1.3
xxhash>=3.0
psutil>=5.9
setuptools>=68
EOF
# The rest of what `ckptbench run` imports (torch is on the GPU machine; matplotlib is only
# used for figures, which are drawn elsewhere).
cat >"$WHEELS/requirements-project.txt" <<'EOF'
pandas>=2.0
pyyaml>=6.0
pydantic>=2.5
tqdm>=4.60
EOF
echo "== dependencies"
"${download[@]}" -r "$WHEELS/requirements-runtime.txt" -r "$WHEELS/requirements-project.txt"
# pip itself, to bootstrap a venv on a python3 that lacks ensurepip and pip.
"${download[@]}" --no-deps pip

echo "$PYVER" >"$WHEELS/PYVER"
(cd "$WHEELS" && sha256sum ./*.whl >SHA256SUMS)

echo "== ${WHEELS} (CPython ${PYVER}, manylinux x86_64)"
ls -l "$WHEELS"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
du -ch "$WHEELS"/*.whl | tail -1
