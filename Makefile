# Every target creates or reuses .venv, installed with the pinned constraints.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# Also pins packages inside build environments (deepspeed builds from an sdist): an unpinned
# torch there would pull several GB of CUDA wheels.
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
# Feast (feature_store/) runs in its own interpreter: it needs pandas<3 and tenacity<9, the workers
# keep constraints.txt's. The feature-store client runs $(TRAINPIPE_FEAST_PYTHON); set it to use another.
FEAST_VENV := .venv-feast
FEAST_INSTALLED := $(FEAST_VENV)/.installed
FEAST_REQUIREMENT := feast[duckdb]==0.67.0
TRAINPIPE_FEAST_PYTHON ?= $(CURDIR)/$(FEAST_VENV)/bin/python
export TRAINPIPE_FEAST_PYTHON

.PHONY: venv lint test test-fast demo up bench soak soak-many docs gx-catalog constraints constraints-feast check clean

# DeepSpeed JIT-compiles its CPU communication op the first time a job starts (~45 s on 2 cores):
# built here, once per venv, into the venv's own extensions dir, so neither the first demo job
# nor the first test pays for it (a job that finds it missing still builds it).
TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
export TORCH_EXTENSIONS_DIR

$(INSTALLED): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark,openlineage]'
	PATH="$(CURDIR)/$(BIN):$$PATH" DS_ACCELERATOR=cpu $(BIN)/python -c \
		'from airflow_trainpipe.runtime.extensions import load_comm_op; load_comm_op()' \
		|| echo "DeepSpeed's CPU comm op was not prebuilt: the first training job builds it"
	@touch $@

# Its own pins (constraints-feast.txt), not constraints.txt's.
$(FEAST_INSTALLED): constraints-feast.txt
	@test -x $(FEAST_VENV)/bin/python || $(PYTHON) -m venv $(FEAST_VENV)
	PIP_CONSTRAINT=$(CURDIR)/constraints-feast.txt $(FEAST_VENV)/bin/python -m pip install --quiet '$(FEAST_REQUIREMENT)'
	@touch $@

venv: $(INSTALLED) $(FEAST_INSTALLED)

# ruff (lint + format), mypy (strict for config/, contracts/ and registry/promotion.py), the
# function-length rule (no function in src/ over 60 lines): settings in pyproject.toml, .flake8;
# and the layers (tests/test_architecture.py: no import cycle, no import up docs/architecture.md's table).
lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/flake8 src
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 0 tests/test_architecture.py

# TEST_WORKERS=N runs the suite on N pytest-xdist workers: a file's tests on one worker, and the
# files sharing the Airflow stack or the Spark server together (tests/conftest.py). Serial by
# default: a test's training job runs 2 ranks, and two workers' jobs on 2 cores (4 busy ranks) made
# the chaos soak's fault-free train task take 102 s and the soak time out after 3 of its 4 runs
# (150 s for all 4 in the last serial CI). Give each worker 2 cores.
TEST_WORKERS ?= 0
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS)

test: lint $(FEAST_INSTALLED)
	scripts/ensure_debian_packages.sh
	$(PYTEST)

test-fast: $(INSTALLED) $(FEAST_INSTALLED)
	$(PYTEST) -m 'not slow'

check: $(INSTALLED)
	$(BIN)/trainpipe check dags/configs

demo: $(INSTALLED)
	$(BIN)/python scripts/demo.py

# Airflow standalone + mlflow server on 127.0.0.1 with this repo's dags/ and plugins/; Ctrl-C, SIGTERM or SIGHUP stops them all.
# DB=postgres: Airflow's metadata in a PostgreSQL cluster of make up's own (Debian's postgresql, data
# kept in var/up/postgres), with the LocalExecutor sized to the host's cores; SQLite by default.
DB ?= sqlite
up: $(INSTALLED) $(FEAST_INSTALLED)
	$(BIN)/python scripts/up.py --db $(DB)

# `make bench ONLY=sources` (or several: ONLY="sources validation_engines") re-measures those
# sections and keeps the others. PostgreSQL and Java come from Debian, as for the tests.
ONLY ?=
bench: $(INSTALLED) $(FEAST_INSTALLED)
	scripts/ensure_debian_packages.sh
	$(BIN)/python benchmarks/run.py --output BENCHMARKS.md $(foreach s,$(ONLY),--only $(s))

# The chaos soak (docs/architecture.md): SOAK_RUNS scheduled runs of one pipeline on a real stack
# (airflow standalone, mlflow server, moto S3), each but the first struck by a seeded fault;
# its result replaces the `Chaos soak` section of BENCHMARKS.md (make bench keeps that section).
SOAK_RUNS ?= 20
SOAK_SEED ?= 19
soak: $(INSTALLED)
	$(BIN)/python scripts/soak.py --runs $(SOAK_RUNS) --seed $(SOAK_SEED) --benchmarks BENCHMARKS.md

# Many pipelines on one Airflow (issue 51): SOAK_PIPELINES pipelines made from the examples,
# triggered at once on `make up DB=postgres`'s stack, three struck by seeded faults (a killed rank,
# the MLflow server down, a day of bad data); replaces BENCHMARKS.md's `Many pipelines` section.
SOAK_PIPELINES ?= 20
soak-many: $(INSTALLED)
	scripts/ensure_debian_packages.sh
	$(BIN)/python scripts/soak.py --pipelines $(SOAK_PIPELINES) --seed $(SOAK_SEED) --benchmarks BENCHMARKS.md

# The config reference (docs/configuration.md) and the layout (docs/architecture.md), both generated
# from the code's docstrings; tests fail when either is stale.
docs: $(INSTALLED)
	$(BIN)/python scripts/update_reference.py
	$(BIN)/python scripts/architecture_layout.py

gx-catalog: $(INSTALLED)
	$(BIN)/python scripts/gen_gx_catalog.py
	$(BIN)/ruff format src/airflow_trainpipe/config/gx_catalog.py

# Re-pin after changing dependencies in pyproject.toml: resolves in a scratch venv.
constraints:
	rm -rf .venv-pin && $(PYTHON) -m venv .venv-pin
	echo "torch==2.13.0" > .venv-pin/torch.txt
	PIP_CONSTRAINT=$(CURDIR)/.venv-pin/torch.txt .venv-pin/bin/pip install --quiet -e '.[test,spark,openlineage]'
	{ sed -n '1,3p' constraints.txt; .venv-pin/bin/pip freeze --exclude-editable | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .venv-pin

# Re-pin the Feast interpreter (constraints-feast.txt) after changing its version.
constraints-feast:
	rm -rf .venv-pin-feast && $(PYTHON) -m venv .venv-pin-feast
	PIP_CONSTRAINT= .venv-pin-feast/bin/pip install --quiet '$(FEAST_REQUIREMENT)'
	{ sed -n '1,3p' constraints-feast.txt; .venv-pin-feast/bin/pip freeze; } > constraints-feast.txt.new
	mv constraints-feast.txt.new constraints-feast.txt && rm -rf .venv-pin-feast

clean:
	rm -rf $(VENV) $(FEAST_VENV) .pytest_cache src/*.egg-info
