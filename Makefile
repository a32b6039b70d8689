# The whole set-up on a fresh machine is one of these two commands:
#   make run   serve tools/payments.py on the embedded journal (streamable HTTP), printing how to connect
#   make test  build .venv, install the package with its test extras, run the test suite
PYTHON ?= python3
VENV ?= .venv
PORT ?= 8000
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench bench-quick crash-trials clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mcp-durable serve tools/payments.py --transport http --host 127.0.0.1 --port $(PORT)

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

bench: $(STAMP)
	$(BIN)/python -m benchmarks

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick

clean:
	rm -rf $(VENV) .mcp-durable .pytest_cache
