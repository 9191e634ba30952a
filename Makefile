# SPDX-License-Identifier: Apache-2.0
# The two commands of the README: `make lab` and `make test`. Each installs what it needs.
VENV := .venv
PY := $(VENV)/bin/python
MESHCTL := $(VENV)/bin/meshctl
LAB ?= ctl/meshctl/lab/labs/default.yaml
# The kernel matrix of `make vmtest` (Debian packages, unpacked under /var/lib/meshctl/kernels).
KERNELS ?= 5.10 6.1 6.12
# The kernels `make test` needs: its VM smoke boots 6.1, its multi-VM lab mixes all three.
SMOKE_KERNELS := 5.10 6.1 6.12
# pytest-xdist workers of `make test` (0: one process). One worker boots the VM tests (TCG) while
# one other runs host tests beside it; the third waits until the VM tests are done (tests/conftest.py's
# scheduler: a test file is one unit, the VM tests all one), then uses the CPU the host tests leave
# idle while they wait on agents and pings. The tests wait on events with loaded-machine timeouts
# (tests/waiting.py) and bound no figure (bench/ measures them).
TEST_WORKERS ?= 3
# The agent image (`make image`): tag it for your registry with IMAGE=registry.example.com/meshctl:TAG.
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= meshctl/meshctl:$(VERSION)

.PHONY: setup kernels test vmtest lab lab-down lint bench image base-image clean

setup:
	@bash scripts/setup.sh

kernels: setup
	@bash scripts/kernels.sh $(KERNELS)

test: setup lint
	@bash scripts/kernels.sh $(SMOKE_KERNELS)
	@$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

# The datapath, node, lab and paths suites inside each kernel of the matrix (TCG: hours).
vmtest: kernels
	@$(PY) -m meshctl.lab.vms.matrix --kernels $(shell echo $(KERNELS) | tr ' ' ',')

lint: setup
	@$(VENV)/bin/ruff check ctl tests bench
	@$(VENV)/bin/mypy

lab: setup
	@$(MESHCTL) lab up -f $(LAB)
	@$(MESHCTL) lab check
	@echo
	@echo "The lab is up. Look around:"
	@echo "  $(MESHCTL) lab status                 # nodes, pods, agents"
	@echo "  $(MESHCTL) status --node a1       # one agent's view"
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

# Needs no venv: only a container engine (docker with a daemon, or podman; ENGINE= picks one),
# docs/kubernetes.md "The image". scripts/image.sh picks the engine and the base (Debian's packages
# through mmdebstrap where no registry answers), hands the build the host's CA bundle (CA_BUNDLE=),
# compiles the shipped objects in a privileged container and builds the image.
image:
	@IMAGE='$(IMAGE)' ENGINE='$(ENGINE)' BASE='$(BASE)' CA_BUNDLE='$(CA_BUNDLE)' bash scripts/image.sh build

# The offline base image alone (mmdebstrap), tagged localhost/meshctl/debian:bookworm-slim.
base-image:
	@ENGINE='$(ENGINE)' bash scripts/image.sh base

clean:
	rm -rf $(VENV) build *.egg-info ctl/*.egg-info
