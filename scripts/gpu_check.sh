#!/usr/bin/env bash
# One-shot GPU check, run from the repository root on a machine with one NVIDIA GPU and no
# package index. Its python3 is expected to hold the packages scripts/gpu-base.txt names (the
# image's documented ones: torch with CUDA, cupy-cuda13x, nvidia-cufile, pandas, scipy, pytest
# ...); scripts/gpu_wheels.sh fetched the rest beforehand into scripts/wheels/.
#
#   OUT=dir bash scripts/gpu_check.sh [ckptbench run options, e.g. --set total_sizes=[8GiB]]
#
# It installs into a folder put first on PYTHONPATH (`pip install --target`, offline: no venv,
# since the machine's python3 is itself a venv and a venv made from it would not see its torch)
# the wheels whose distributions python3 lacks, and those it holds in a version too old for what
# the run loads (scripts/gpu_env.py install). It verifies with `pip check` over the base and that
# folder, the project's requirements, and an import of every module the run imports; a failure
# on kvikio's side alone does not end the check: it goes on without gds, and the table says why
# (gpu_env.py verify). Then the `gpu` tests (real kvikio on CUDA), then configs/gpu-check.yaml
# in stages sized to the time left and the disk found (scripts/gpu_sizing.py: gds and
# cpu-single first, then the other engines with the ceilings, then the model workload; every
# save restored into CUDA memory and verified), each stage its own run folder, then the table
# over them (scripts/gpu_table.py). Each step runs under `timeout`, and the whole check within
# GPU_CHECK_LIMIT seconds (default 480: inside the device tool's 10-minute command limit, with
# room to spare); a stage cut short keeps its rows so far. Everything it prints is also kept in
# $OUT/gpu_check.log, the table in $OUT/gpu_table.txt, the sizing in $OUT/gpu_sizing.json, what
# failed, was skipped or sized in $OUT/gpu_notes.txt, and the stages in $OUT/<run-id>/.
# Of the run options, the sizing reads the `--set KEY=VALUE` ones (given as two words).
# Environment: OUT (default results), PYTHON (default python3), WHEELS (default scripts/wheels),
# GPU_CHECK_LIMIT, GPU_CHECK_SITE (keep the installed wheels there instead of a temporary folder).
# `make gpu-rehearsal` runs this check here, without a GPU, the way the GPU machine would.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=${WHEELS:-scripts/wheels}
OUT_DIR=${OUT:-results}
PYTHON=${PYTHON:-python3}
LIMIT=${GPU_CHECK_LIMIT:-480}
deadline=$((SECONDS + LIMIT))
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1

# step NAME SECONDS CMD...: CMD under `timeout`, never past the check's deadline.
step() {
    local name=$1 most=$2 left
    shift 2
    left=$((deadline - SECONDS))
    if ((left < most)); then most=$left; fi
    if ((most <= 0)); then
        echo "gpu_check: no time left for '$name' (GPU_CHECK_LIMIT=${LIMIT}s)" >&2
        return 124
    fi
    echo "== $name (at most ${most}s)" >&2 # not into a step's own output (the table's file)
    timeout --kill-after=10 "$most" "$@"
}

step gpu 30 nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total \
    --format=csv || echo "gpu_check: nvidia-smi failed or is missing (continuing)"

echo "== wheels ($WHEELS)"
if ! compgen -G "$WHEELS/kvikio_cu13-*.whl" >/dev/null; then
    echo "gpu_check: no kvikio wheel in $WHEELS; run 'make gpu-wheels' where PyPI is reachable" >&2
    exit 2
fi
(cd "$WHEELS" && sha256sum --quiet -c SHA256SUMS)
py_here=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
py_wheels=$(cat "$WHEELS/PYVER")
echo "$PYTHON is CPython $py_here; wheels are for CPython $py_wheels"
if [[ $py_here != "$py_wheels" ]]; then
    echo "gpu_check: wheels were fetched for CPython $py_wheels but $PYTHON is $py_here" \
        "(rerun: PYVER=$py_here make gpu-wheels)" >&2
    exit 2
fi

step "base (scripts/gpu-base.txt)" 60 "$PYTHON" scripts/gpu_env.py have

# What failed and why, one line each, for the table: kvikio, the sizing, stages cut or skipped.
notes=$OUT_DIR/gpu_notes.txt
: >"$notes"
note() {
    echo "gpu_check: $*"
    echo "$*" >>"$notes"
}

if [[ -n ${GPU_CHECK_SITE:-} ]]; then
    site=$GPU_CHECK_SITE
    mkdir -p "$site"
else
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckptbench-gpu.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    site=$tmp/site
fi
# The wheels the base lacks, and those whose distribution it holds too old for what the run
# loads; kvikio's separately: their failure leaves the CPU paths to run.
step install 120 "$PYTHON" scripts/gpu_env.py install "$WHEELS" "$site" --notes "$notes"
# NIXL (scripts/gpu_wheels.sh put it apart): its wheel alone, after the rest; where it does not
# install, nixl's rows are not run and the sizing's note says why (it cannot import).
if compgen -G "$WHEELS/nixl/*.whl" >/dev/null; then
    step nixl 90 "$PYTHON" -m pip install --disable-pip-version-check --quiet --no-index \
        --no-deps --no-compile --upgrade --target "$site" "$WHEELS"/nixl/*.whl ||
        echo "gpu_check: NIXL's wheel did not install (above): nixl is not run"
fi
export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH}
# pip check over the base and $site, the project's requirements, every module the run imports:
# exit 2 ends the check; 3 is kvikio's side alone, and the check goes on without gds.
without=()
verified=0
step verify 90 "$PYTHON" scripts/gpu_env.py verify --site "$site" --notes "$notes" || verified=$?
if ((verified == 3)); then
    without=(--without gds)
    echo "gpu_check: kvikio failed (above); the CPU paths and the baselines run without gds"
elif ((verified != 0)); then
    exit 2
fi
echo "setup took $SECONDS s"

rc=$((verified ? 1 : 0))
step engines 60 "$PYTHON" -m bench engines || rc=1
# The real-kvikio tests first: short, and they must not be starved by a long run.
step "the gpu tests" 150 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gds_kvikio_io.py tests/test_engines.py || rc=1

# The stages, sized to the time left and the disk found (scripts/gpu_sizing.py), most valuable
# first; the table keeps 30 s. After the first stage the others are sized again, their
# estimates scaled by how the first compared with its own; a stage whose estimate no longer
# fits is skipped, and one cut by the limit keeps its rows so far.
sets=()
prev=
for a in "$@"; do
    if [[ $prev == --set ]]; then sets+=(--set "$a"); fi
    prev=$a
done
sizing() {
    step "sizing" 60 "$PYTHON" scripts/gpu_sizing.py --seconds "$((deadline - SECONDS - 30))" \
        --out "$OUT_DIR" "${without[@]}" "${sets[@]}" "$@"
}
rm -f "$OUT_DIR/gpu_stages.tsv"
sizing || { rc=1; note "sizing failed (see gpu_check.log): the config as it is, in one stage"; }
mapfile -t stages < <(cat "$OUT_DIR/gpu_stages.tsv" 2>/dev/null || printf 'config\t0\t\n')
runs=()
while ((${#stages[@]})); do
    IFS=$'\t' read -r stage est stage_sets <<<"${stages[0]}"
    stages=("${stages[@]:1}")
    read -r -a stage_args <<<"$stage_sets"
    left=$((deadline - SECONDS - 30))
    if [[ $stage != first ]] && ((est > left)); then
        note "stage $stage skipped: it needs about ${est} s, ${left} s are left"
        continue
    fi
    args=()
    for a in "${stage_args[@]}"; do args+=(--set "$a"); done
    before=$(ls "$OUT_DIR")
    t0=$SECONDS
    stage_rc=0
    step "run: stage $stage" "$left" "$PYTHON" -m bench run configs/gpu-check.yaml -q \
        -o "$OUT_DIR" "$@" "${args[@]}" </dev/null || stage_rc=$?
    took=$((SECONDS - t0))
    echo "gpu_check: stage $stage took $took s (estimated $est s)"
    run_dir=$(comm -13 <(echo "$before") <(ls "$OUT_DIR") | grep -v '^gpu_' | tail -1 || true)
    if ((stage_rc == 124 || stage_rc == 137)); then
        note "stage $stage cut short by the limit after $took s: its rows so far are kept"
    fi
    ((stage_rc == 0)) || rc=1
    if [[ -n $run_dir && -f $OUT_DIR/$run_dir/results.csv ]]; then
        runs+=("$OUT_DIR/$run_dir")
    else
        note "stage $stage left no results.csv"
    fi
    if [[ $stage == first ]] && ((${#stages[@]})); then
        if sizing --first-took "$took"; then
            mapfile -t stages <"$OUT_DIR/gpu_stages.tsv"
        else
            rc=1
        fi
    fi
done
if ((${#runs[@]})); then
    step table 30 "$PYTHON" scripts/gpu_table.py --notes "$notes" "${runs[@]}" |
        tee "$OUT_DIR/gpu_table.txt" || rc=1
else
    echo "gpu_check: no stage left a results.csv: no table" >&2
    rc=1
fi
echo "gpu_check: exit $rc after $SECONDS s; results in ${runs[*]}"
exit $rc
