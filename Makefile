# `make demo` and `make test` set themselves up: a .venv in the repo root with the project installed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# `make demo` needs only the package and its runtime dependencies; the dev extra (pytest, ray, ruff,
# hypothesis, gguf: about 2 minutes to install) comes with `make test` / `make lint` (STAMP).
BASE_STAMP := $(VENV)/.base-stamp

# `make test` runs every test (CI runs it); `make test-fast` leaves out those marked `slow` (over ~2 s each:
# end-to-end CLI runs, spawned ranks, the demo), the inner loop: under 2 minutes on 2 cores.
.PHONY: setup test test-fast demo lint typecheck bench bench-demo bench-memory mutate clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changes. torch is pinned exactly to the local CPU wheel.
$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# two pytest workers (pytest-xdist), each taking the next test when it is free: 16 minutes in one
# process on 2 cores, 11 on two (a test's module fixtures are built in each worker that runs it)
test: setup
	$(PY) -m pytest -q -n 2 --dist worksteal

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

demo: $(BASE_STAMP)
	$(VENV)/bin/rlhf demo

lint: setup typecheck
	$(VENV)/bin/ruff check rlhf tests bench examples tools
	$(VENV)/bin/ruff format --check rlhf tests bench examples tools

# mypy on the packages pyproject.toml's [tool.mypy] names: the runtimes, their protocol and the RL loop
# strictly (every runtime is a Runtime: tests/runtime/runtime_conformance.py). Minutes on a cold cache
# (it reads torch), seconds after.
typecheck: setup
	$(PY) -m mypy

bench: setup
	$(PY) bench/run.py

# Peak resident memory of sft, rm and train (LoRA policy) on SmolLM2-135M and HH pairs against each
# stage's floor (about 30 minutes on 2 cores; bench/results/memory_stages.json, docs/memory.md).
# The model and the pairs: RLHF_BENCH_MODEL=DIR RLHF_BENCH_PAIRS=FILE.jsonl.gz (skipped without them).
bench-memory: setup
	$(PY) bench/memory/memory.py

# Wall time of `rlhf demo` and `rlhf demo --compare --seeds 3`, with the findings (about 10 minutes).
bench-demo: setup
	$(PY) bench/speed/demo_timing.py

# Mutation testing of rlhf/core/*.py and rlhf/rl/experience.py (minutes; not part of `make test`):
# prints the per-file table and survivors, writes bench/results/mutation.json (docs/mutation.md).
# MUTATE_LIMIT mutants per file (a seeded sample); `make mutate MUTATE_LIMIT=` runs all of them.
MUTATE_LIMIT ?= 25
mutate: setup
	$(PY) tools/mutate.py --seed 0 $(if $(MUTATE_LIMIT),--limit $(MUTATE_LIMIT)) --json bench/results/mutation.json

clean:
	rm -rf $(VENV) runs .pytest_cache
