# Two commands set everything up on a fresh machine:
#   make train   -> builds .venv, prepares the embedded corpus, trains the default model
#   make test    -> builds .venv, runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup train test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[train,dev,eval,log]"
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

clean:
	rm -rf $(VENV) build *.egg-info
