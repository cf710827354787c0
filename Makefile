# Two commands set everything up on a fresh machine:
#   make train   -> builds .venv, prepares the embedded corpus, trains the default model
#   make test    -> builds .venv, runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup train test lint bench gpu-check clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[train,dev,eval,log,hf]"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(BIN)/spectra train $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests

bench: $(STAMP)
	$(BIN)/spectra bench ops $(ARGS)

# On a machine with a CUDA GPU, with its own python3 and torch (nothing is installed):
# the step beside its peers, a profile, the capturable step, the CUDA tests, then 124M
# training and bench ops as the 390-second budget allows; JSON under docs/data/gpu/ (ARGS="--archive F.tar.gz": one file).
# Its python3 if that has torch, else .venv's.
gpu-check:
	@if $(PY) -c "import torch" 2>/dev/null; then py=$(PY); \
	elif [ -x $(BIN)/python ]; then py=$(BIN)/python; \
	else echo "gpu-check: no python with torch here, so no CUDA GPU to check"; exit 0; fi; \
	PYTHONPATH=src $$py -m spectra_lab bench gpu-check $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
