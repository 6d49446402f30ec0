# The two commands of the README. Both are idempotent: the venv is rebuilt only
# when pyproject.toml or constraints.txt change, the model only when missing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEFAULT_MODEL := smollm2-135m-instruct
# Pulled for the tests too: the real K-quant (Q4_K_M) Gemma 3 file checked against llama.cpp.
TEST_MODELS := gemma3-270m

.PHONY: run test install model test-models clean

run: install model
	$(PY) -m ds4tui $(ARGS)

test: install model test-models
	$(PY) -m pytest -q $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

model: install
	$(PY) -m ds4tui models pull $(DEFAULT_MODEL)

test-models: install
	for m in $(TEST_MODELS); do $(PY) -m ds4tui models pull $$m || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
