# autoshard — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
IOPDDL := benchmarks/data/iopddl

.PHONY: setup bytecode postgres chromium demo test bench lint clean

setup: $(STAMP)

# Our own modules' bytecode, compiled now: the editable install leaves them to be compiled at import, and with
# PYTHONDONTWRITEBYTECODE set (our machines and CI) every process compiled them again (~0.4 s to import the
# planner and the service; `make test` starts hundreds of processes). Only what changed since is compiled.
bytecode: setup
	@$(BIN)/python -m compileall -q -j 0 strategies solver runtime service tests benchmarks

# PostgreSQL server binaries for the service's tests (they start a throwaway server): Debian's package when
# initdb is missing and we are root (CI is); otherwise say what to install.
postgres:
	@if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	else echo "autoshard: install PostgreSQL (initdb, pg_ctl): the service's tests start a throwaway server"; fi

# Chromium for the report's headless-browser test (Playwright drives it; no browser is downloaded): Debian's
# package when chromium is missing and we are root (CI is); otherwise say what to install.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "autoshard: install Chromium (Debian's chromium package, /usr/bin/chromium): the report's browser test drives it"; fi

# Installs torch first (pinned: a bare `torch` requirement would pull a CUDA build), then the project.
# pip compiles every module's bytecode here: with PYTHONDONTWRITEBYTECODE set (our machines and CI set it),
# nothing compiled later is kept, and `--no-compile` (install 109 -> 45 s) made the suite 6 min slower.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m strategies.plan.warm_up  # numba's cache: the first plan starts at once
	touch $(STAMP)

demo: bytecode
	@echo "== autoshard solve: the IOPDDL example (optimum 445) =="
	$(BIN)/autoshard solve $(IOPDDL)/example.json --backend highs --time-limit 10
	@echo "== autoshard solve: IOPDDL instance G (816 nodes, contest limit 120 s) =="
	$(BIN)/autoshard solve $(IOPDDL)/asplos-2025-iopddl-G.json.gz --backend auto --time-limit 120 --out results-G.json > /dev/null
	@$(BIN)/python -c "import json; r = json.load(open('results-G.json')); print({k: r[k] for k in ('status', 'cost', 'bound', 'gap', 'seconds', 'backend')})"
	@echo "== autoshard plan: a 2-layer MLP on a mesh of 4 with a big batch (data parallel is optimal) =="
	$(BIN)/autoshard plan --model mlp --mesh 4 --batch 65536 --out results-plan-mlp.json --time-limit 30 --quiet

# Two test processes share the two cores (a test mostly waits on its ranks, servers or subprocesses: one
# process used 1.2 cores); each module stays in one process, so its shared ranks and servers are made once.
# The tests marked `alone` measure latency and run afterwards with nothing beside them.
TEST_PROCESSES ?= 2

test: bytecode postgres chromium
	status=0; \
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile -m "not alone" || status=$$?; \
	$(BIN)/python -m pytest -m alone || status=$$?; \
	exit $$status

# The public contest instances A, M, S: from IOPDDL_DATA (or $AUTOSHARD_IOPDDL_DATA).
# With IOPDDL_WINNER=BIN (or $AUTOSHARD_IOPDDL_WINNER): side by side with the contest winner's binary, every
# instance A..Y (or IOPDDL_INSTANCES=B,G,V) at IOPDDL_TIME_LIMIT seconds (default 60). benchmarks/README.md.
bench: setup
	$(BIN)/python benchmarks/iopddl.py --threads 2 $(if $(IOPDDL_DATA),--data $(IOPDDL_DATA)) \
		$(if $(IOPDDL_WINNER),--against $(IOPDDL_WINNER)) $(if $(IOPDDL_INSTANCES),--instances $(IOPDDL_INSTANCES)) \
		$(if $(IOPDDL_TIME_LIMIT),--time-limit $(IOPDDL_TIME_LIMIT))

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint docker/service.Dockerfile docker/worker.Dockerfile

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache results-*.json
