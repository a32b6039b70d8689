# The whole set-up on a fresh machine is one of these two commands:
#   make run   serve tools/payments.py on the embedded journal (streamable HTTP), printing how to connect
#   make test  build .venv, install the package with its test extras, run the test suite
PYTHON ?= python3
VENV ?= .venv
PORT ?= 8000
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test bench bench-quick crash-trials powerloss clean console-screenshots

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,fastmcp]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mcp-durable serve tools/payments.py --transport http --host 127.0.0.1 --port $(PORT)

# Real MCP peers from npm that the tests drive; skipped where npm is missing (the tests that need
# them then skip, or fail under CI).
NODE_STAMP := tests/node/node_modules/.installed-stamp
$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then npm ci --prefix tests/node --no-audit --no-fund --loglevel=error && touch $@; else echo "npm not found: tests that drive npm MCP peers will skip"; fi

# Two workers (pytest-xdist): most tests wait on subprocesses, sockets and fsync rather than
# compute, and a second worker fills that time. `make test TEST_WORKERS=0` runs them in one
# process. A test keeps to its own directory, Postgres schema, ports and names, so that any two
# may run at once (README, "Longer runs").
TEST_WORKERS ?= 2

test: $(STAMP) $(NODE_STAMP)
	$(BIN)/python -m pytest -q -ra --durations=20 --numprocesses=$(TEST_WORKERS) --dist=worksteal

# The benchmarks also measure the peers (case 9: DBOS, Powertools + Redis): their extra.
BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,peers]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks --quick

# The console screenshots in docs/img/ (docs/console.md): a real server, Debian's headless chromium.
console-screenshots: $(STAMP)
	$(BIN)/python docs/console_screenshots.py

# The power-loss harness's long run (docs/crash-results.md): 1,000 cut points per journal. Needs strace.
powerloss: $(STAMP)
	$(BIN)/python -m tests.powerloss --cuts 1000

clean:
	rm -rf $(VENV) .mcp-durable .pytest_cache
