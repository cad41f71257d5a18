# Everything sets itself up: a fresh machine needs only python3 (3.11+) and make.
VENV ?= .venv
PY := $(VENV)/bin/python
UPSTREAM ?= http://127.0.0.1:8000

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

.PHONY: install test gateway bench
install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

gateway: $(VENV)/.installed
	$(VENV)/bin/burnish gateway --upstream $(UPSTREAM)

bench: $(VENV)/.bench
	$(PY) bench/gateway_overhead.py
