#!/usr/bin/env bash
# Download, on a machine that reaches PyPI, every wheel the GPU check (scripts/gpu_check.sh)
# installs offline on a GPU machine beyond what that machine's python3 holds
# (scripts/gpu-base.txt, the image's documented packages):
# - kvikio-cu13 and libkvikio-cu13, without their dependencies: their CUDA ones
#   (cupy-cuda13x[ctk], cuda-toolkit[cufile]) are the machine's, and gigabytes of wheels;
# - the runtime requirements of those two wheels that the base lacks, at the pins their own
#   METADATA names (rapids-logger==0.3.* for libkvikio-cu13 26.10);
# - the project's requirements the base lacks (pydantic, bitmath), with their dependencies
#   resolved for the target platform.
#
#   bash scripts/gpu_wheels.sh     # PYVER=3.11 for another CPython than the GPU machine's 3.12
#
# Environment: PYVER (default 3.12: the lent machines' python3), KVIKIO_VERSION (default
# 26.10.*; the newest release if that does not exist), WHEELS (default scripts/wheels,
# git-ignored), PIP (default: the project venv's pip, else python3 -m pip). Writes the wheels,
# requirements.txt (what was asked for), PYVER and SHA256SUMS, which gpu_check.sh reads.
set -euo pipefail
cd "$(dirname "$0")/.."

PYVER=${PYVER:-3.12}
KVIKIO_VERSION=${KVIKIO_VERSION:-26.10.*}
WHEELS=${WHEELS:-scripts/wheels}
if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
PIP=${PIP:-$PY -m pip}
read -r -a pip <<<"$PIP"

if ! [[ $PYVER =~ ^3\.[0-9]+$ ]]; then
    echo "gpu_wheels: PYVER must look like 3.12, got '$PYVER'" >&2
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
rm -f "$WHEELS"/*.whl "$WHEELS"/requirements*.txt "$WHEELS"/PYVER "$WHEELS"/SHA256SUMS

echo "== kvikio-cu13 ${KVIKIO_VERSION} for CPython ${PYVER}"
if ! "${download[@]}" --no-deps "kvikio-cu13==${KVIKIO_VERSION}"; then
    echo "gpu_wheels: no kvikio-cu13==${KVIKIO_VERSION} for CPython ${PYVER}; taking the newest" >&2
    "${download[@]}" --no-deps kvikio-cu13
fi
kv_whl=$(ls "$WHEELS"/kvikio_cu13-*.whl)
kv_version=$(basename "$kv_whl" | cut -d- -f2)
"${download[@]}" --no-deps "libkvikio-cu13==${kv_version}"

mapfile -t wanted < <(
    "$PY" scripts/gpu_env.py beyond "$kv_whl" "$WHEELS"/libkvikio_cu13-*.whl
    "$PY" scripts/gpu_env.py needs
)
printf '%s\n' "kvikio-cu13==$kv_version" "libkvikio-cu13==$kv_version" "${wanted[@]}" \
    >"$WHEELS/requirements.txt"
echo "== beyond the base: ${wanted[*]}"
"${download[@]}" "${wanted[@]}"

# NIXL for the nixl peer's GDS_MT rows, in a folder of its own: gpu_check.sh installs it apart,
# so that a NIXL that does not install or load costs its rows alone. Without its dependencies
# (torch and numpy are the base's); a download that fails leaves the check without nixl.
rm -rf "$WHEELS/nixl"
echo "== nixl-cu13 for CPython ${PYVER}"
"${pip[@]}" download --disable-pip-version-check --progress-bar off --only-binary=:all: \
    "${platforms[@]}" --implementation cp --python-version "$PYVER" -d "$WHEELS/nixl" \
    --no-deps nixl-cu13 ||
    echo "gpu_wheels: no nixl-cu13 wheel for CPython ${PYVER}; the check runs without nixl" >&2

echo "$PYVER" >"$WHEELS/PYVER"
(cd "$WHEELS" && sha256sum ./*.whl $(compgen -G './nixl/*.whl' || true) >SHA256SUMS)

echo "== ${WHEELS} (CPython ${PYVER}, manylinux x86_64)"
ls -l "$WHEELS"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
du -ch "$WHEELS"/*.whl | tail -1
