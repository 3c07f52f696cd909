# ckptbench: `make bench` runs the main job, `make test` the tests. Both bootstrap .venv.
#
# torch: without a GPU the CPU wheel is installed (TORCH=torch==2.13.0); a bare `torch` would
# pull several GB of CUDA build. With a GPU (nvidia-smi lists one) the default PyPI torch (a CUDA
# build) and the `gds` extra (kvikio + cupy for the driver's CUDA major) are installed. NIXL (the
# `nixl` peer) is installed either way, its wheel for the driver's CUDA major (12 without a GPU).
# Pick a build by hand with e.g. `make TORCH='torch==2.9.1' bench`, or
# `make TORCH='torch --index-url https://download.pytorch.org/whl/cu128' bench`.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= configs/default.yaml
ARGS   ?=

, := ,
HAS_GPU    := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
ifeq ($(HAS_GPU),1)
TORCH  ?= torch
EXTRAS ?= dev,$(if $(filter 12,$(CUDA_MAJOR)),gds-cu12$(,)nixl,gds$(,)nixl-cu13)
else
TORCH  ?= torch==2.13.0
EXTRAS ?= dev,nixl
endif

.PHONY: hosts bench test lint format columns engines gpu-wheels gpu-check gpu-rehearsal clean-scratch help

help:
	@echo "make bench    run $(CONFIG) (ARGS='--set repetitions=5' to override)"
	@echo "make test     mypy, then the tests"
	@echo "make engines  list the engines and whether each runs here"
	@echo "make lint     ruff check + format check"
	@echo "make columns  write docs/results.md's columns tables from the row types"
	@echo "make report   figures and report.md of the latest run (make plots: figures only)"
	@echo "make ceiling  each engine next to the device ceilings (configs/ceiling.yaml)"
	@echo "make peers    cpu-single vs safetensors, FastPersist, DCP, torch.save and fio, alternating"
	@echo "make peers TUNED=results/tuned.yaml   the same, each tuned engine also with its tuned knobs"
	@echo "make scaling  each path's cost against checkpoint size, 256 MiB to 12 GiB, with its report"
	@echo "make many-tensors   80 MiB as 4 KiB, 64 KiB and 16 MiB tensors, and an MoE shard, with its report"
	@echo "make mlperf   MLPerf Storage's checkpoint workload (llama3-1t, scaled to fit), with its report"
	@echo "make train    stall in a real training loop (configs/training.yaml)"
	@echo "make perf     hot-path micro-benchmarks (make perf-compare: against the last run)"
	@echo "make gpu-wheels / gpu-check   prepare / run the one-shot GPU check (scripts/)"
	@echo "make gpu-rehearsal   the GPU check here, offline, from its wheels and the image's base"
	@echo "make tune     each engine's best knobs for CONFIG's targets in BUDGET (results/tuned.yaml)"
	@echo "make tune-check   the tuned knobs against an exhaustive sweep of the same grid (slow)"
	@echo "make hosts    2 hosts x 2 ranks on this machine (root: namespaces, loop disks), with its report"
	@echo "make mutate   mutation testing of the crash-safety core (cosmic-ray; not in CI)"

# Without a GPU the real kvikio package is installed too, without its CUDA dependencies
# (scripts/kvikio-cpu.txt): the tests hold the gds engine's kvikio calls against it.
$(BIN)/.installed: pyproject.toml scripts/kvikio-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	$(if $(HAS_GPU),,$(BIN)/pip install -q --no-deps --require-hashes -r scripts/kvikio-cpu.txt)
	touch $@

bench: $(BIN)/.installed
	$(BIN)/ckptbench run $(CONFIG) $(ARGS)

# mypy first (pyproject.toml [tool.mypy]: bench/ and analysis/, pinned): a type error fails the tests.
# Then pytest in two parts. Most tests run in parallel (pytest-xdist, TEST_WORKERS workers, one per
# CPU up to 8 by default: each holds torch and its own fixtures, about 1 GiB; each test file on one
# worker, so its module fixtures are built once). Those marked `alone` (pyproject.toml: they read
# pages kept in the page cache, a port or a wall clock, which a test beside them would disturb)
# run after, one at a time. Both parts run even if
# the first fails; an ARGS selection with nothing in one part is not a failure.
# --durations: the slowest tests named in every run.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 8 ? n : 8 )))
test: $(BIN)/.installed
	$(BIN)/mypy
	@rc=0; \
	echo "== pytest, in parallel (-n $(TEST_WORKERS)): the tests not marked alone"; \
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not alone' --durations=25 $(ARGS) \
		|| { r=$$?; [ $$r = 5 ] || rc=$$r; }; \
	echo "== pytest, one at a time: the tests marked alone"; \
	$(BIN)/pytest -q -m alone --durations=10 $(ARGS) || { r=$$?; [ $$r = 5 ] || rc=$$r; }; \
	exit $$rc

engines: $(BIN)/.installed
	$(BIN)/ckptbench engines

lint: $(BIN)/.installed
	$(BIN)/ruff check bench analysis tests scripts
	$(BIN)/ruff format --check bench analysis tests scripts

format: $(BIN)/.installed
	$(BIN)/ruff format bench analysis tests scripts
	$(BIN)/ruff check --fix bench analysis tests scripts

# docs/results.md's columns tables, from the row types of bench/measure/results.py.
columns: $(BIN)/.installed
	$(BIN)/python scripts/columns.py

gpu-wheels:
	bash scripts/gpu_wheels.sh

gpu-check:
	bash scripts/gpu_check.sh

gpu-rehearsal: $(BIN)/.installed
	bash scripts/gpu_rehearsal.sh

clean-scratch:
	rm -rf scratch

# Analysis of the latest run under results/ (or RUN_DIR=results/<run-id>), into RUN_DIR/report/:
# `make plots` the five figures (PNG + PDF), `make report` those plus summary.csv, report.md/html.
RUN_DIR ?= $(patsubst %/,%,$(lastword $(sort $(dir $(wildcard results/*/results.csv)))))
.PHONY: plots report

plots: $(BIN)/.installed
	@test -n "$(RUN_DIR)" || { echo "no run under results/: run make bench first"; exit 2; }
	$(BIN)/ckptbench report $(RUN_DIR) --figures-only

report: $(BIN)/.installed
	@test -n "$(RUN_DIR)" || { echo "no run under results/: run make bench first"; exit 2; }
	$(BIN)/ckptbench report $(RUN_DIR)

# Hot-path micro-benchmarks (tests/perf/bench_*.py, pytest-benchmark), about a minute; not part
# of `make test` (its collection matches test_*.py only). `make perf` runs them and saves the run
# under .benchmarks/; `make perf-compare` runs them again and compares with the latest saved run
# without saving (PERF_BASELINE=0003 for another; PERF_FAIL=median:20% to fail on a regression).
PERF_BASELINE ?=
PERF_FAIL     ?=
PERF_PYTEST    = $(BIN)/pytest tests/perf -o python_files='bench_*.py' -q \
	--benchmark-columns=min,median,max,ops,rounds --benchmark-sort=name
.PHONY: perf perf-compare

perf: $(BIN)/.installed
	$(PERF_PYTEST) --benchmark-autosave $(ARGS)

perf-compare: $(BIN)/.installed
	@test -n "$(wildcard .benchmarks/*/*.json)" || { echo "no saved run under .benchmarks/: run make perf first"; exit 2; }
	$(PERF_PYTEST) --benchmark-compare$(if $(PERF_BASELINE),=$(PERF_BASELINE)) \
		$(if $(PERF_FAIL),--benchmark-compare-fail=$(PERF_FAIL)) $(ARGS)

# The training-loop stall (configs/training.yaml): step-time inflation of a real AdamW loop
# checkpointed through each engine, in results/<run-id>/; `ckptbench report` draws its figure.
.PHONY: train
train: $(BIN)/.installed
	$(BIN)/ckptbench train configs/training.yaml $(ARGS)

# Each engine's knobs searched on CONFIG's targets within BUDGET (bench/run/tune/, docs/tune.md);
# `make bench ARGS='--tuned results/tuned.yaml'` applies them. tune-check runs the whole grid of
# every tuned engine (scripts/tune_check.py): slow, so not in `make test`.
BUDGET ?= 240s
TUNED  ?= results/tuned.yaml
.PHONY: tune tune-check
tune: $(BIN)/.installed
	$(BIN)/ckptbench tune $(CONFIG) --budget $(BUDGET) -o $(TUNED) $(ARGS)

tune-check: $(BIN)/.installed
	$(BIN)/python scripts/tune_check.py $(CONFIG) $(TUNED) $(ARGS)

# The single-copy path against the peers users would pick and against fio, in one alternating run
# (scripts/peers.py; fastpersist only where DeepSpeed is installed, nixl's GDS_MT only on a GPU).
# TUNED=PROFILE (from `make tune`) also runs each tuned engine with its knobs beside its defaults.
.PHONY: peers
peers: $(BIN)/.installed
	$(BIN)/python scripts/peers.py $(if $(TUNED),--tuned $(TUNED)) $(ARGS)

# How each path's cost grows with the checkpoint (configs/scaling.yaml, 256 MiB to 12 GiB), and
# its report (slopes, Figures 10 and 11) in the run's report/ folder.
.PHONY: scaling
scaling: $(BIN)/.installed
	$(BIN)/ckptbench run configs/scaling.yaml --report $(ARGS)

# What a save costs per tensor beside per byte (configs/many-tensors.yaml: 80 MiB as 20,480 x
# 4 KiB, 1,280 x 64 KiB and 5 x 16 MiB, and a mixture-of-experts shard), and its report (us per
# tensor next to GB/s) in the run's report/ folder.
.PHONY: many-tensors
many-tensors: $(BIN)/.installed
	$(BIN)/ckptbench run configs/many-tensors.yaml --report $(ARGS)

# MLPerf Storage v2.0's checkpoint workload (configs/mlperf.yaml: llama3-1t's 8 ranks of one host,
# every rank's bytes scaled to fit here, 10 writes, the cache cleared, 10 reads, every engine and
# dlio-style, DLIO's own way of writing), and its report (MLPerf's metrics) in the run's report/.
.PHONY: mlperf
mlperf: $(BIN)/.installed
	$(BIN)/ckptbench run configs/mlperf.yaml --report $(ARGS)

# Each engine next to the device's ceilings (fio when installed) on one target, with the ratios.
.PHONY: ceiling
ceiling: $(BIN)/.installed
	$(BIN)/ckptbench run configs/ceiling.yaml $(ARGS)

# Mutation testing of the crash-safety core (scripts/mutate.py: manifest, generations, tree,
# layout, checksums, verify, the striped engine's commit and delete), outside CI: cosmic-ray
# from the `mutate` extra, sessions and copies under .mutate/. Exits 1 on a survivor that
# scripts/mutate_equivalent.txt does not explain. ARGS='--only layout' for one module.
.PHONY: mutate
mutate: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[$(EXTRAS),mutate]'
	$(BIN)/python scripts/mutate.py $(ARGS)

# Two hosts on this machine (scripts/hosts.py; root): network, UTS and mount namespaces, a veth
# pair, a loop disk each, one torchrun agent per host over a c10d rendezvous; torn down after.
# HOSTS_ARGS='--host-set 1:max_write_bw=25MiB/s' caps host 1's target (the straggler named).
HOSTS_CONFIG ?= configs/hosts.yaml
HOSTS_ARGS   ?=
hosts: $(BIN)/.installed
	$(BIN)/python scripts/hosts.py --nproc-per-host 2 $(HOSTS_ARGS) -- run $(HOSTS_CONFIG) -o results --report $(ARGS)
