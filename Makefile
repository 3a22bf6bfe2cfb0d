# topas — common tasks. `make` (or `make help`) lists them.
#
#   make reproduce              run every experiment and notebook -> data/results/, figures/
#   make reproduce QUICK=1      the same, small (what CI-sized runs use)
#   make reproduce ENGINE=sglang SERVER=http://HOST:PORT   replay every run on a real SGLang server
#   make reproduce ENGINE=sglang GRID=gpu-afternoon SERVERS=URL1,URL2 YES=1   ~3 h of arrivals, split over servers
#   make reproduce ... ARGS='--tasks 2 --plan'   any scripts/reproduce.py option (--plan: print the plan, stop)
#   make reproduce RAY_ADDRESS=auto   run the sweeps on a Ray cluster
#   make test                   the test suite (fast by default)

PY     ?= python3
VENV   ?= .venv
QUICK  ?= 0
ENGINE ?= sim
GRID   ?=
YES    ?= 0

VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install lock test test-sglang test-cluster fidelity fidelity-contention reproduce figures pack check-results lab traces profiles bench bench-figures clean

help:  ## list the targets
	@echo "Usage: make <target> [PY=python3] [VENV=.venv] [QUICK=0|1] [ENGINE=sim|sglang] [SERVER=URL] [SERVERS=URL1,URL2] [GRID=full|quick|gpu-afternoon] [YES=1] [ARGS=...] [RAY_ADDRESS=auto]"
	@echo
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-zA-Z_-]*:.*## / {printf "  %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The virtual environment, pinned by requirements-lock.txt (pip constraints: exactly those
# versions). The stamp depends on both files, so a dependency or lock change reinstalls.
LOCK ?= requirements-lock.txt
$(STAMP): pyproject.toml $(LOCK)
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install --upgrade pip
	$(VPY) -m pip install -c $(LOCK) -e '.[test,notebooks,ray]'
	touch $@

# JupyterLab's own small extra (no Ray, no test tools), at the lock's pins: after `make install` it
# only adds JupyterLab and nbstripout; from nothing it installs the core and the notebook kernel too.
LAB_STAMP := $(VENV)/.lab-installed
$(LAB_STAMP): pyproject.toml $(LOCK)
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -c $(LOCK) -e '.[notebooks,lab]'
	touch $@

install: $(STAMP)  ## create .venv and install topas + test/notebook/ray extras at the versions in requirements-lock.txt

lock: $(STAMP) $(LAB_STAMP)  ## re-pin requirements-lock.txt from .venv (after changing a dependency; commit it)
	{ sed -n '/^#/p' $(LOCK); $(VPY) -m pip freeze --exclude-editable; } > $(LOCK).tmp && mv $(LOCK).tmp $(LOCK)

# The suite runs on every core (pytest-xdist; TEST_JOBS=1 runs it in one process, e.g. to debug).
TEST_JOBS ?= auto
test: $(STAMP)  ## run the test suite on every core (pytest; ARGS="-x -q", or ARGS="-m 'not slow'" to skip the slow ones; TEST_JOBS=1)
	$(VPY) -m pytest $(if $(filter 1,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist worksteal) $(ARGS)

# The SGLang CPU integration test: builds (or reuses) the lean SGLang env in .venvs/sglang-cpu,
# starts a real SGLang server (tiny dummy-weight model, the topas plugin) on 127.0.0.1 and
# replays small Chain-3 / DAG-4 traces under FCFS and TOPAS (tests_sglang/).
test-sglang:  ## SGLang integration test on CPU: real server + topas plugin (builds .venvs/sglang-cpu once)
	bash tools/sglang_cpu/build_env.sh
	.venvs/sglang-cpu/bin/python -m pytest tests_sglang -p no:cacheprovider -s $(ARGS)

# Two CPU SGLang servers (the test-sglang env, each with the plugin and the tiny model's tokenizer)
# behind the real sglang-router 0.3.2 (cache_aware): Chain-3 / DAG-4 replays sent as text through
# the router, the plugin metadata on both servers, the router's choices against the simulator's
# sglang-cache-aware (tests_cluster/). RESULT=FILE also writes every request's choices there
# (RESULT=data/results/fidelity/cluster_router.jsonl regenerates the committed ones).
test-cluster:  ## real-router integration test on CPU: 2 SGLang servers behind sglang-router, choices vs the simulator (RESULT=FILE)
	bash tools/sglang_cpu/build_env.sh
	$(if $(RESULT),rm -f $(RESULT) &&,) $(if $(RESULT),TOPAS_CLUSTER_RESULT=$(abspath $(RESULT)),) \
		.venvs/sglang-cpu/bin/python -m pytest tests_cluster -p no:cacheprovider -s $(ARGS)

fidelity:  ## simulator vs real SGLang: the CPU server here, or SERVER=URL PROFILE=FILE (see scripts/fidelity_cpu.py)
	bash tools/sglang_cpu/build_env.sh
	.venvs/sglang-cpu/bin/python scripts/fidelity_cpu.py $(if $(SERVER),--server $(SERVER) --profile $(or $(PROFILE),data/profiles/measured_server.json) --reprofile,) $(ARGS)

fidelity-contention:  ## prefixes competing for a small KV pool: simulator vs the CPU server, request by request (ARGS="--compare-only" re-compares the stored runs)
	bash tools/sglang_cpu/build_env.sh
	.venvs/sglang-cpu/bin/python scripts/fidelity_contention.py $(ARGS)

# The options every reproduce-like target passes to scripts/reproduce.py (ARGS: any other option).
REPRO_OPTS = --engine $(ENGINE) $(if $(filter 1,$(QUICK)),--quick,) $(if $(GRID),--grid $(GRID),) \
	$(if $(SERVER),--server $(SERVER),) $(if $(SERVERS),--servers $(SERVERS),) $(if $(filter 1,$(YES)),--yes,) \
	$(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS),)

# The command as typed (the variables given on make's command line), for the resume hint.
REPRO_CMD = $(strip make reproduce$(foreach v,ENGINE QUICK GRID SERVER SERVERS YES RAY_ADDRESS,$(if $(filter command line,$(origin $(v))), $(v)=$($(v))))$(if $(filter command line,$(origin ARGS)), ARGS='$(ARGS)'))

reproduce: $(STAMP)  ## run all experiments and notebooks (QUICK=1 small, ENGINE=sim|sglang, GRID=gpu-afternoon, SERVERS=..., YES=1, ARGS=...)
	TOPAS_INVOKED_AS="$(REPRO_CMD)" $(VPY) scripts/reproduce.py $(REPRO_OPTS) $(ARGS)

figures: $(STAMP)  ## re-render figures and tables from the results store only (no simulation)
	$(VPY) scripts/reproduce.py --figures-only $(if $(filter-out sim,$(ENGINE)),--engine $(ENGINE),) \
		$(if $(filter 1,$(QUICK)),--quick,) $(if $(GRID),--grid $(GRID),) $(ARGS)

pack: $(STAMP)  ## after a reproduce: pack the results of the chosen grid into data/results/$(ENGINE)/ (commit it)
	$(VPY) scripts/pack_results.py --engine $(ENGINE) $(if $(GRID),--grid $(GRID),) $(if $(filter 1,$(QUICK)),--grid quick,) $(ARGS)

check-results: $(STAMP)  ## re-run a sample of stored results with the current code; compare (ARGS="--sample 20")
	$(VPY) scripts/check_results.py $(ARGS)

# Lab serves the repository root (docs/, figures/ and the notebooks' ../docs links reachable) and
# opens notebooks/. nbstripout, installed as this clone's git filter, strips outputs and execution
# counts (and the kernel's language_info) from notebooks as git reads them, keeping the committed
# cell ids; Lab itself saves notebooks through the same stripping (topas.notebook_save), so the
# files on disk stay as committed and `git status` stays clean after a session.
# JupyterLab refuses to run as root without --allow-root (e.g. in a container); ARGS pass through.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)
lab: $(LAB_STAMP)  ## JupyterLab at the repository root, notebooks/ opened; notebooks saved without outputs (ARGS="--no-browser --port 8890")
	$(VENV)/bin/nbstripout --install --attributes .gitattributes
	git config filter.nbstripout.clean '"$(abspath $(VPY))" -m nbstripout --keep-id --extra-keys metadata.language_info'
	$(abspath $(VENV))/bin/jupyter lab $(LAB_ROOT) --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks --ContentsManager.pre_save_hook=topas.notebook_save.strip_outputs $(ARGS)

traces: $(STAMP)  ## regenerate the synthetic workload traces and the held-out random workflows in data/traces/
	$(VPY) scripts/make_traces.py
	$(VPY) scripts/make_traces.py --held-out

# MetaGPT workloads (tools/metagpt/README.md). MetaGPT lives in its own venvs, never in $(VENV):
# SOP = metagpt==0.8.2 from the registry; TL = MetaGPT main at METAGPT_TL_COMMIT (TeamLeader mode is
# in no release). Its lancedb==0.4.0 pin is not on the registry, hence uv's --override.
METAGPT_TL_COMMIT ?= 1dfce070d29041fbd10dc9deb4a2db48bd5aebc7
METAGPT_TL_SRC    ?= git+https://github.com/FoundationAgents/MetaGPT@$(METAGPT_TL_COMMIT)
METAGPT_N         ?= 150
METAGPT_JOBS      ?= 2
UV                := .venvs/uv/bin/uv
.PHONY: metagpt-env traces-metagpt

$(UV):
	$(PY) -m venv .venvs/uv && .venvs/uv/bin/pip install uv

.venvs/metagpt-sop/.installed: tools/metagpt/overrides.txt | $(UV)
	$(UV) venv -p python3.11 .venvs/metagpt-sop
	$(UV) pip install --python .venvs/metagpt-sop/bin/python metagpt==0.8.2 bpe-openai --override tools/metagpt/overrides.txt
	.venvs/metagpt-sop/bin/python tools/metagpt/setup_tiktoken.py .venvs/tiktoken_cache
	touch $@

.venvs/metagpt-tl/.installed: tools/metagpt/overrides.txt | $(UV)
	$(UV) venv -p python3.11 .venvs/metagpt-tl
	$(UV) pip install --python .venvs/metagpt-tl/bin/python "$(METAGPT_TL_SRC)" bpe-openai --override tools/metagpt/overrides.txt
	.venvs/metagpt-tl/bin/python tools/metagpt/setup_tiktoken.py .venvs/tiktoken_cache
	touch $@

metagpt-env: .venvs/metagpt-sop/.installed .venvs/metagpt-tl/.installed  ## build the MetaGPT venvs .venvs/metagpt-{sop,tl} (~1.5 GB each; METAGPT_TL_SRC=path for a local checkout)

traces-metagpt: metagpt-env  ## record MetaGPT-SOP/TL runs (offline responder) -> data/traces/metagpt-{sop,tl}.json.gz
	.venvs/metagpt-sop/bin/python scripts/collect_metagpt_traces.py --workflow sop --offline --n $(METAGPT_N) --jobs $(METAGPT_JOBS)
	.venvs/metagpt-tl/bin/python scripts/collect_metagpt_traces.py --workflow tl --offline --n $(METAGPT_N) --jobs $(METAGPT_JOBS)

profiles: $(STAMP)  ## refit the engine cost-model profiles in data/profiles/
	$(VPY) scripts/fit_profile.py

bench: $(STAMP)  ## benchmarks: simulator speed (FCFS), each policy's CPU s per 1,000 tasks vs FCFS, where TOPAS's time goes, TOPAS's decision latency
	$(VPY) benchmarks/sim_speed.py --no-progress
	$(VPY) benchmarks/policy_cost.py $(ARGS)

bench-figures: $(STAMP)  ## wall time of make figures (into a temporary folder; each notebook's time; files checked byte-identical to figures/; ARGS="--jobs 1")
	$(VPY) benchmarks/figures_time.py $(ARGS)

clean:  ## remove the venv and caches (never data/ or figures/)
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info
	find . -path ./.git -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
