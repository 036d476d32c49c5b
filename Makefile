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

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/day0 demo

services:
	./.ci/services.sh

test: $(STAMP) services
	DAY0_DATABASE_URL=$${DAY0_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/day0} \
	DAY0_REDIS_URL=$${DAY0_REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(BIN)/pytest $(PYTEST_ARGS)

test-all: $(STAMP) services
	DAY0_DATABASE_URL=$${DAY0_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/day0} \
	DAY0_REDIS_URL=$${DAY0_REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(BIN)/pytest -m 'not gpu' $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
