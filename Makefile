# Two commands on a fresh machine (see README):
#   make demo   create .venv, install alt-tvm, run the main job
#   make test   create .venv, install alt-tvm with its dev tools, run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_FLAGS ?= --disable-pip-version-check
# Test files run in this many worker processes (pytest-xdist, a file per worker: its fixtures stay
# in one process). 2 fits CI's 2 cores; each worker is a whole TVM + torch process (~1.5 GB).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo test test-all install install-dev lint

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

install: $(VENV)/bin/python
	$(PY) -m pip install $(PIP_FLAGS) -e .

# timm and torchvision without their dependencies: their Python model code (the public sweep's
# architectures) runs beside the pinned CPU torch; their own pins would pull another torch.
install-dev: $(VENV)/bin/python
	$(PY) -m pip install $(PIP_FLAGS) -e ".[dev]"
	$(PY) -m pip install $(PIP_FLAGS) --no-deps "timm==1.0.31" "torchvision==0.28.0"

demo: install
	$(PY) scripts/quickstart.py

# prepare-board.sh: the emulated ARM board (cached in ~/.cache/alt-tvm/boards; never fails).
test: install-dev
	bash .ci/install-cross.sh
	bash .ci/prepare-board.sh $(PY)
	$(PYTEST)

test-all: install-dev
	$(PYTEST) -m "slow or not slow"

lint: install-dev
	$(VENV)/bin/ruff check alt_tvm strategies tuning vta_mapping scripts benchmarks tests
