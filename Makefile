# topas — common tasks. `make` (or `make help`) lists them.
#
#   make reproduce              run every experiment and notebook -> data/results/, figures/
#   make reproduce QUICK=1      the same, small (what CI-sized runs use)
#   make reproduce ENGINE=sglang SERVER=http://HOST:PORT   replay every run on a real SGLang server
#   make reproduce RAY_ADDRESS=auto   run the sweeps on a Ray cluster
#   make test                   the test suite (fast by default)

PY     ?= python3
VENV   ?= .venv
QUICK  ?= 0
ENGINE ?= sim

VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install test reproduce figures pack lab traces profiles bench clean

help:  ## list the targets
	@echo "Usage: make <target> [PY=python3] [VENV=.venv] [QUICK=0|1] [ENGINE=sim|sglang] [SERVER=URL] [RAY_ADDRESS=auto]"
	@echo
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-zA-Z_-]*:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The virtual environment. The stamp depends on pyproject.toml, so a dependency change reinstalls.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install --upgrade pip
	$(VPY) -m pip install -e '.[test,notebooks,ray]'
	touch $@

$(VENV)/.lab-installed: $(STAMP)
	$(VPY) -m pip install -e '.[lab]'
	touch $@

install: $(STAMP)  ## create $(VENV) and install topas with the test, notebook and ray extras

test: $(STAMP)  ## run the test suite (pytest; deselect slow tests with ARGS="-m 'not slow'")
	$(VPY) -m pytest $(ARGS)

reproduce: $(STAMP)  ## run all experiments and notebooks (QUICK=1 for a small run, ENGINE=sim|sglang)
	$(VPY) scripts/reproduce.py --engine $(ENGINE) $(if $(filter 1,$(QUICK)),--quick,) \
		$(if $(SERVER),--server $(SERVER),) $(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS),)

figures: $(STAMP)  ## re-render figures and tables from the results store only (no simulation)
	$(VPY) scripts/reproduce.py --figures-only

pack: $(STAMP)  ## after a full reproduce: pack the results the figures need into data/results/$(ENGINE)/ (commit it)
	$(VPY) scripts/pack_results.py --engine $(ENGINE)

lab: $(VENV)/.lab-installed  ## open JupyterLab in notebooks/
	cd notebooks && $(abspath $(VENV))/bin/jupyter lab

traces: $(STAMP)  ## regenerate the workload traces in data/traces/
	$(VPY) scripts/make_traces.py

profiles: $(STAMP)  ## refit the engine cost-model profiles in data/profiles/
	$(VPY) scripts/fit_profile.py

bench: $(STAMP)  ## simulator speed benchmark
	$(VPY) benchmarks/sim_speed.py

clean:  ## remove the venv and caches (never data/ or figures/)
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info
	find . -path ./.git -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
