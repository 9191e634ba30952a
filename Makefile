# The two commands of the README: `make lab` and `make test`. Each installs what it needs.
VENV := .venv
PY := $(VENV)/bin/python
MESHCTL := $(VENV)/bin/meshctl
LAB ?= ctl/meshctl/lab/labs/default.yaml

.PHONY: setup test lab lab-down lint bench clean

setup:
	@bash scripts/setup.sh

test: setup lint
	@$(PY) -m pytest -q -p no:cacheprovider tests

lint: setup
	@$(VENV)/bin/ruff check ctl tests bench
	@$(VENV)/bin/mypy

lab: setup
	@$(MESHCTL) lab up -f $(LAB)
	@$(MESHCTL) lab check
	@echo
	@echo "The lab is up. Look around:"
	@echo "  $(MESHCTL) lab status                 # nodes, pods, agents"
	@echo "  $(MESHCTL) status --lab-node a1       # one agent's view"
	@echo "  $(MESHCTL) maps dump --node a1        # its fast-path map"
	@echo "  $(MESHCTL) lab check                  # pod-to-pod matrix again"
	@echo "Take it down with: $(MESHCTL) lab down   (or: make lab-down)"

lab-down: setup
	@$(MESHCTL) lab down

bench: setup
	@$(PY) bench/plan_scale.py
	@$(PY) bench/datapath.py
	@cd bench && ../$(PY) convergence.py
	@cd bench && ../$(PY) clustermesh.py
	@$(PY) bench/watch_reader.py

clean:
	rm -rf $(VENV) build *.egg-info ctl/*.egg-info
