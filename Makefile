# Two commands set everything up: `make demo` and `make test` (each creates .venv on first use).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit notebooks lab bench faults compat horovod clean

LAB_STAMP := $(VENV)/.installed-lab

$(STAMP): pyproject.toml tools/horovod_wheel.sh patches/horovod-0.28.1-tf2.21.patch
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	bash tools/horovod_wheel.sh $(BIN)/python
	touch $(STAMP)

# Horovod 0.28.1 from PyPI's sdist + patches/ (TensorFlow 2.21), built once into
# ~/.cache/kit/wheels (needs cmake and g++; about 5 minutes on 2 cores), then reused
horovod: $(STAMP)
	bash tools/horovod_wheel.sh $(BIN)/python

$(LAB_STAMP): $(STAMP)  # JupyterLab only for `make lab` (the tests run notebooks without it)
	$(BIN)/python -m pip install --quiet -e '.[dev,lab]'
	touch $(LAB_STAMP)

demo: $(STAMP)  ## train the seeds' MNIST example on 1 and on 2 workers; writes out/
	$(BIN)/kit demo --out out

test: unit notebooks  ## unit tests, then every notebook under nbval

unit: $(STAMP)
	$(BIN)/python -m pytest tests

notebooks: $(STAMP)
	$(BIN)/python -m pytest --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -p no:cacheprovider --ignore=notebooks/out notebooks/

lab: $(LAB_STAMP)  ## open the notebooks in JupyterLab
	$(BIN)/jupyter lab notebooks/

bench: $(STAMP)  ## efficiency, start-up, recovery, memory, notebook times -> out/bench/bench.json
	$(BIN)/kit bench --out out/bench

faults: $(STAMP)  ## 10 fault-injection trials (random task, random step) -> out/faults/trials.json
	$(BIN)/kit faults --trials 10 --out out/faults

compat: $(STAMP)  ## rerun the Keras compatibility table -> docs/keras-compatibility.md
	$(BIN)/python -m kit.compat --out docs/keras-compatibility.md

clean:
	rm -rf out notebooks/out .pytest_cache
