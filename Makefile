# Two commands for a fresh machine:
#   make demo   set up, then train and evaluate the built-in hyperspectral demo
#   make test   set up, then run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= all
DEMO_CONFIG ?= experiments/indian_pines_demo.yaml
DEMO_DIR ?= runs/demo

.PHONY: setup demo test lint bench clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: pyproject.toml setup.py $(wildcard sciformer/*.h sciformer/geometry/*.cpp sciformer/geometry/*.h sciformer/attention/*.cpp sciformer/attention/*.h sciformer/pointcloud/*.cpp) scripts/install_torch.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PIP="$(BIN)/python -m pip" scripts/install_torch.sh
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

demo: setup
	$(BIN)/sciformer train --config $(DEMO_CONFIG) --output-dir $(DEMO_DIR)-$$(date +%Y%m%d-%H%M%S)

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check sciformer tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_geometry.py --quick
	$(BIN)/python benchmarks/bench_point_attention.py

clean:
	rm -rf $(VENV) .pytest_cache
