# The two commands of the README. Both are idempotent: the venv is rebuilt only
# when pyproject.toml, setup.py or constraints.txt change, the C kernels only when
# their sources do, the model only when missing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
KERNELS := ds4tui/engine/kernels
# Built by the editable install (setup.py), rebuilt here after an edit or a pull.
KERNEL_LIB := $(KERNELS)/libds4k.so
# Pulled for the tests too: the real K-quant (Q4_K_M) Gemma 3 file checked against llama.cpp.
TEST_MODELS := gemma3-270m

.PHONY: run test lint install kernels model test-models clean

# The chat downloads its model itself on the first start, on its start screen (with progress).
run: install kernels
	$(PY) -m ds4tui $(ARGS)

test: install kernels model test-models
	$(PY) -m pytest -q $(PYTEST_ARGS)

# ruff (errors only: pyproject [tool.ruff]) and mypy (format/, cache/: [tool.mypy]).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

install: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "installing ds4tui and its dependencies; the C kernels compile once (about a minute on 2 cores)"
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

kernels: $(KERNEL_LIB)

# Without a compiler the app still runs (torch backend, slower): say so, do not stop.
$(KERNEL_LIB): $(wildcard $(KERNELS)/*.c $(KERNELS)/*.h) $(KERNELS)/build.py | $(STAMP)
	$(PY) -m ds4tui.engine.kernels.build $@ || echo "no C kernels built: ds4tui runs on its torch backend"

# A bare `models pull` pulls the default model (DEFAULT_MODEL in ds4tui/engine/defaults.py).
model: install
	$(PY) -m ds4tui models pull

test-models: install
	for m in $(TEST_MODELS); do $(PY) -m ds4tui models pull $$m || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info $(KERNEL_LIB)
