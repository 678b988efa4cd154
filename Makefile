# The two commands: `make serve` (set up + serve the default model) and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export GRPC_PORT ?= 8001
export HTTP_PORT ?= 8000
export METRICS_PORT ?= 8002
export OPENAI_PORT ?= 9000

.PHONY: setup model serve test unit integration lint bench bench-openai clean check-deploy rig fleet fleet-bench fleet-sim capacity-bench image compose-up compose-down roll test-containers affinity-bench observe observe-down

setup:            ## venv + pinned deps, tritonserver backend, default model (idempotent)
	bash scripts/setup.sh all

model:
	bash scripts/setup.sh model

serve: setup      ## serve model_repository on GRPC_PORT/HTTP_PORT/METRICS_PORT + OpenAI API on OPENAI_PORT
	$(PY) -m rufus.launch.stack --models "$${RUFUS_MODELS:-rufus_llm,rufus_qp_medusa,rufus_assistant}"

# Unit tests are independent of each other: one pytest-xdist worker per core (at most 4).
XDIST := -n auto --maxprocesses 4 --dist loadfile
# The container and integration suites run one after the other in one process (they share
# two cores and the memory). SUITES_XDIST="-n 2 --dist loadgroup" runs them side by side on two
# workers (work units: tests/conftest.py); measured on 2 cores it did not pay: a rolled cell
# took twice as long to come back (docs/benchmarks-history.md).
SUITES_XDIST ?=

# The container suite's image is built (from cached layers) beside the unit tests: the build
# mostly waits on Docker. Its log: build/image-beside-unit.log. Where it fails (no Docker and
# not root, say), the container suite builds or skips as before. IMAGE_BESIDE_UNIT=0: no.
IMAGE_BESIDE_UNIT ?= 1
# The test image's build-time warm-up (scripts/image.sh): "auto" skips starting the models
# where the rig's compile-cache volumes (kept between runs) would hide what it builds.
TEST_PREBUILD ?= auto

# A Docker engine that `make test` started (the image build beside the unit tests starts one
# where none runs) is stopped by its pid when the tests end, pass or fail (docker/engine.sh).
STOP_TEST_ENGINE = if [ -f build/docker/engine-by-test ]; then bash docker/engine.sh stop; \
	rm -f build/docker/engine-by-test; fi

test: setup check-deploy  ## lint + type check + deploy checks + unit + integration tests
	$(PY) -m ruff check .
	$(PY) -m mypy
	@rm -f build/image-beside-unit.rc build/docker/engine-by-test; \
	if [ "$(IMAGE_BESIDE_UNIT)" = 1 ] && { command -v docker >/dev/null || [ "$$(id -u)" = 0 ]; }; then \
	  mkdir -p build/docker; timeout 10 docker info >/dev/null 2>&1 || touch build/docker/engine-by-test; \
	  echo "[test] building the image beside the unit tests (log: build/image-beside-unit.log)"; \
	  ( bash scripts/image.sh --prebuild $(TEST_PREBUILD) > build/image-beside-unit.log 2>&1; echo $$? > build/image-beside-unit.rc ) & \
	fi; \
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=20 tests/unit; rc=$$?; wait; \
	if [ -f build/image-beside-unit.rc ]; then \
	  echo "[test] image build beside the unit tests: exit $$(cat build/image-beside-unit.rc); $$(tail -n 1 build/image-beside-unit.log)"; fi; \
	if [ $$rc != 0 ]; then $(STOP_TEST_ENGINE); fi; \
	exit $$rc
	$(PY) -m pytest -q -p no:cacheprovider $(SUITES_XDIST) --durations=60 --prebuild=$(TEST_PREBUILD) tests/containers tests/integration; \
	rc=$$?; $(STOP_TEST_ENGINE); exit $$rc

check-deploy: setup  ## static checks of docker/ and deploy/ (no Docker engine needed)
	$(VENV)/bin/hadolint docker/Dockerfile
	$(VENV)/bin/check-jsonschema -q --schemafile deploy/schemas/compose-spec.json docker/compose.yaml
	$(VENV)/bin/check-jsonschema -q --schemafile deploy/schemas/leaderworkerset-v1.json deploy/kubernetes/lws-*.yaml
	$(VENV)/bin/check-jsonschema -q --schemafile deploy/schemas/service-v1.json deploy/kubernetes/service.yaml
	$(VENV)/bin/check-jsonschema -q --schemafile deploy/schemas/ecs-task-definition.json deploy/ecs/*-taskdef.json
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_deploy_consistency.py

unit: setup
	$(PY) -m pytest -q $(XDIST) tests/unit

lint:             ## ruff + mypy (the trees and settings: [tool.mypy] in pyproject.toml)
	$(PY) -m ruff check .
	$(PY) -m mypy

bench: setup      ## Triton path vs in-process vLLM, concurrency 1 and 16
	$(PY) scripts/bench.py --concurrency 1 16

bench-openai: setup  ## OpenAI API: frontend -> Triton vs vLLM's OpenAI server (vllm bench serve)
	$(PY) scripts/bench_openai.py --concurrency 1 16 --output-len 64

clean:
	rm -rf build .pytest_cache .ruff_cache .mypy_cache

rig: setup        ## two-node unit (leader tritonserver + follower) on this machine, supervised
	$(PY) scripts/rig.py --grpc-port $(GRPC_PORT) --http-port $(HTTP_PORT) --metrics-port $(METRICS_PORT) $(RIG_ARGS)

fleet: setup      ## two units + unit agents + HAProxy (ingress printed; FLEET_ARGS=--fixed-ports -> :9000)
	$(PY) scripts/fleet.py up $(FLEET_ARGS)

fleet-bench: setup  ## least outstanding vs round robin through HAProxy, two units, same run
	$(PY) scripts/fleet.py bench $(FLEET_ARGS)

fleet-sim:        ## fleet-scale routing simulation (100+ units, bursts), seeded, < 1 min
	$(PY) scripts/fleet_sim.py $(SIM_ARGS)

affinity-bench: setup  ## assistant conversations on two units: conversation affinity vs least outstanding, same run
	$(PY) scripts/affinity_bench.py $(AFFINITY_ARGS)

capacity-bench: setup  ## units of 8 and 2 sequences: capacity-weighted vs equal weights, same run
	$(PY) scripts/capacity_bench.py $(CAPACITY_ARGS)

image: setup      ## cpu + ingress images (classic builder, wheelhouse, local bases if no registry)
	bash scripts/image.sh

compose-up: setup  ## image + the two-cell compose rig (ingress gRPC :8001, OpenAI :9000)
	bash scripts/compose.sh up

compose-down:     ## stop and remove the rig (volumes with compile caches are kept)
	bash scripts/compose.sh down

roll: setup       ## rolling update of the rig under load: ROLL_ARGS="--image X" or a new tag of the current image
	$(PY) -m lab.roll_bench $(ROLL_ARGS)

test-containers: setup  ## container tests: build, rig up, faults, rolling update, rig down
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 tests/containers

# `make observe` runs with the project's interpreter where `make setup` made it, else python3:
# it uses only the standard library, and Phoenix gets a venv of its own (build/observe-venv).
OBSERVE_PY = $(if $(wildcard $(PY)),$(PY),python3)

observe:          ## Prometheus :9090 + Arize Phoenix (traces) :6006 beside `make serve`
	$(OBSERVE_PY) -m rufus.launch.observe up

observe-down:     ## stop what `make observe` started (by pid)
	$(OBSERVE_PY) -m rufus.launch.observe down
