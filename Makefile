# The two commands: `make serve` (set up + serve the default model) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export GRPC_PORT ?= 8001
export HTTP_PORT ?= 8000
export METRICS_PORT ?= 8002

.PHONY: setup model serve test unit integration lint bench clean

setup:            ## venv + pinned deps, tritonserver backend, default model (idempotent)
	bash scripts/setup.sh all

model:
	bash scripts/setup.sh model

serve: setup      ## serve model_repository on GRPC_PORT/HTTP_PORT/METRICS_PORT
	$(PY) -m rufus.server --models "$${RUFUS_MODELS:-rufus_llm}"

test: setup       ## lint + unit + integration tests (real tritonserver, real model)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -p no:cacheprovider tests

unit: setup
	$(PY) -m pytest -q tests/unit

lint:
	$(PY) -m ruff check .

bench: setup      ## Triton path vs in-process vLLM, concurrency 1 and 16
	$(PY) scripts/bench.py --concurrency 1 16

clean:
	rm -rf build .pytest_cache .ruff_cache
