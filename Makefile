# cni-dra: `make demo` and `make test` are the two entry points (see README.md).
# Every target is idempotent; install steps keep stamps inside the venv and skip
# themselves when nothing changed, so a second run costs well under a second.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV      ?= /opt/cni-dra/venv
PY        := $(VENV)/bin/python
CNI_BIN   ?= /opt/cni/bin
# where `make install` puts the agent's systemd units (conf/systemd); nothing is enabled
SYSTEMD_UNIT_DIR ?= /etc/systemd/system
RUNTIME   ?= containerd
MULTUS    ?= 0
PYTEST    := $(PY) -m pytest
# CI=true: plain output, no cache directory written into the fresh clone.
PYTEST_FLAGS ?= $(if $(filter true,$(CI)),-p no:cacheprovider,)
MYPY_FLAGS   ?= $(if $(filter true,$(CI)),--cache-dir=/dev/null,)

# make image: the name and tag of the image, and its org.opencontainers.image.version label
# (VERSION=0.1.1 builds a second tag from the same tree, e.g. for an upgrade test).
VERSION   ?= $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE     ?= ghcr.io/cni-dra/cni-dra
IMAGE_TAG ?= $(VERSION)
IMAGE_DIR ?= build/image

export CNI_DRA_VENV := $(VENV)
export CNI_BIN_DIR  := $(CNI_BIN)
export CNI_DRA_SYSTEMD_DIR := $(SYSTEMD_UNIT_DIR)
# The netns tests run the plugin installed by this make (another VENV/CNI_BIN installs,
# and tests, a second copy beside the first).
export CNI_DRA_TEST_EXE      ?= $(CNI_BIN)/cni-dra
export CNI_DRA_TEST_CNI_PATH ?= $(CNI_BIN)
# tests/test_helm_chart.py renders the chart with this helm: scripts/e2e/build-helm builds it
# from the Go module proxy on first use (about 6 minutes) and answers from its cache after.
# Without it those tests skip, or fail when CI=true.
WITH_HELM = helm=$$(scripts/e2e/build-helm | tail -n 1) || { helm=; echo "scripts/e2e/build-helm failed: tests/test_helm_chart.py $(if $(filter true,$(CI)),fails,skips)"; }; export CNI_DRA_HELM=$$helm;

.PHONY: help deps venv install image demo test check unit netns lint format bench bench-cluster clean ipvlan-uml e2e cluster-up cluster-down smoke-runtimes render-manifests

help:
	@echo "make demo     install everything (idempotent), then run scripts/demo.sh"
	@echo "make test     install what tests need, run tests/ then netns_tests/ (root)"
	@echo "make check    make test, then make e2e (what CI runs; README's test command)"
	@echo "make install  apt deps + venv + $(CNI_BIN)/cni-dra and its tree $(CNI_BIN)/cni-dra.d + reference plugins on $(CNI_BIN)"
	@echo "make image    OCI archive of the image in $(IMAGE_DIR)/ (IMAGE, IMAGE_TAG, VERSION); prints path, tag, digest"
	@echo "make render-manifests   conf/k8s/{rbac,admission,daemonset,deviceclass}.yaml from the Helm chart deploy/helm/cni-dra"
	@echo "make lint     import-linter layer contracts (.importlinter), mypy (strict) over cni_dra/, ruff check and"
	@echo "              format --check (pyproject.toml), shellcheck over every shell script; fails if one is missing"
	@echo "make format   sort imports and format the Python code in place (ruff)"
	@echo "make bench    cni-dra vs the reference macvlan plugin (root; table + bench/results.json)"
	@echo "make bench-cluster   pod start-up in the real cluster, cni-dra vs the reference macvlan (root; uses a bed"
	@echo "              that is up or brings one up and down; table + bench/cluster-results.json; not in check)"
	@echo "make clean    remove build leftovers from the work tree (images in build/ too)"
	@echo "make e2e      real two-node Kubernetes on this machine (each node its own namespaces, kubelet, containerd), cni-dra installed by its Helm chart, + the scenarios (root)"
	@echo "make cluster-up / cluster-down   the same cluster with cni-dra's chart installed, left running to explore (prints KUBECONFIG)"
	@echo "make smoke-runtimes   build (cached) and smoke-check CRI-O, Multus and Helm on this host (root; not in check)"

deps:
	@scripts/install.sh deps

venv: deps
	@scripts/install.sh venv

install: venv
	@scripts/install.sh package tree plugins units

# Built from Debian's packages and the venv's PyPI distributions (scripts/image/image.py);
# the same commit gives the same digest (SOURCE_DATE_EPOCH: the commit's time).
image: venv
	@scripts/install.sh package
	@$(PY) scripts/image/image.py --venv $(VENV) --out-dir $(IMAGE_DIR) --name $(IMAGE) --tag $(IMAGE_TAG) --version $(VERSION)

demo: install
	@scripts/demo.sh

# One pytest run over tests/ then netns_tests/ so the output closes on a single
# summary line. Exit 5 ("no tests collected") is not a failure of the code under
# test; scripts/pytest-run maps it to 0 and prints pytest's summary last.
test: install
	@$(VENV)/bin/lint-imports --config .importlinter --no-cache >/dev/null || $(VENV)/bin/lint-imports --config .importlinter --no-cache
	@$(WITH_HELM) CNI_DRA_IPVLAN_REQUIRED=$$($(IPVLAN_PROBE) >/dev/null 2>&1 && echo 1 || echo 0) \
	 scripts/pytest-run $(PYTEST) $(PYTEST_FLAGS) tests/ $(if $(filter 0,$(shell id -u)),netns_tests/,)
	@$(if $(filter 0,$(shell id -u)),$(MAKE) --no-print-directory ipvlan-uml,true)

# The ipvlan netns tests ran above when this kernel has ipvlan (scripts/ipvlan-probe, which
# does not take cni-dra's own probe's word; those runs then fail instead of skipping);
# otherwise run them once more under user-mode-linux (scripts/uml-run), one pytest process,
# venv python called directly, where a test that would skip fails too. When neither works
# they are not run: SKIPPED with the reason, or, under CI=true, FAILED (CI cannot be green
# without ipvlan's path having run).
UML_RUN      ?= scripts/uml-run
IPVLAN_PROBE ?= scripts/ipvlan-probe
ipvlan-uml:
	@if $(IPVLAN_PROBE) >/dev/null 2>&1; then \
	   echo "ipvlan: this kernel has ipvlan; netns_tests/test_ipvlan.py ran natively"; \
	 elif why=$$($(UML_RUN) --check 2>&1); then \
	   echo "ipvlan: this kernel has no ipvlan; running netns_tests/test_ipvlan.py under $(UML_RUN)"; \
	   CNI_DRA_IPVLAN_REQUIRED=1 UML_RUN_ENV="CNI_DRA_TEST_EXE CNI_DRA_TEST_CNI_PATH CNI_DRA_IPVLAN_REQUIRED" $(UML_RUN) \
	     'scripts/pytest-run $(PYTEST) -p no:cacheprovider netns_tests/test_ipvlan.py'; \
	 elif [ "$(CI)" = true ]; then \
	   echo "ipvlan: FAILED: netns_tests/test_ipvlan.py cannot run: this kernel lacks ipvlan AND $(UML_RUN) fails: $$why"; \
	   exit 1; \
	 else \
	   echo "ipvlan: SKIPPED netns_tests/test_ipvlan.py: this kernel lacks ipvlan AND $(UML_RUN) fails: $$why"; \
	 fi

# What CI runs (.ci/run): the linters, then every suite, each bounded by a timer (a hang
# fails by name). The e2e components (Go builds on a cold machine) are built at nice 19 in
# the background meanwhile (scripts/e2e/prefetch); `make e2e` then finds them cached, or
# waits on a build still running, or builds what the prefetch could not.
check:
	@start=$$(date +%s); mkdir -p build; \
	 $(MAKE) --no-print-directory deps; \
	 setsid nice -n 19 scripts/e2e/prefetch build/prefetch.log >build/prefetch.out 2>&1 & prefetch=$$!; \
	 timeout -k 60 10m $(MAKE) --no-print-directory lint || { rc=$$?; { kill -- -$$prefetch 2>/dev/null || true; }; echo "check: make lint failed (exit $$rc)"; exit $$rc; }; \
	 timeout -k 60 50m $(MAKE) --no-print-directory test || { rc=$$?; { kill -- -$$prefetch 2>/dev/null || true; }; cat build/prefetch.out; echo "check: make test failed (exit $$rc) after $$(( $$(date +%s) - start )) s"; exit $$rc; }; \
	 mid=$$(date +%s); echo "check: make test took $$(( mid - start )) s"; \
	 wait $$prefetch || echo "check: the prefetch failed (build/prefetch.log); make e2e builds what is missing"; \
	 cat build/prefetch.out; echo "check: waited $$(( $$(date +%s) - mid )) s for the prefetch after make test"; \
	 mid=$$(date +%s); \
	 timeout -k 60 45m $(MAKE) --no-print-directory e2e || { rc=$$?; $(PY) scripts/e2e/cluster.py down || true; echo "check: make e2e failed (exit $$rc) after $$(( $$(date +%s) - mid )) s"; exit $$rc; }; \
	 echo "check: make e2e took $$(( $$(date +%s) - mid )) s; $$(( $$(date +%s) - start )) s in all"

unit: venv
	@$(WITH_HELM) scripts/pytest-run $(PYTEST) $(PYTEST_FLAGS) tests/

netns: install
	@scripts/pytest-run $(PYTEST) $(PYTEST_FLAGS) netns_tests/

# Every linter must be installed and happy: scripts/lint names each that fails or is missing.
lint: venv
	@MYPY_FLAGS="$(MYPY_FLAGS)" scripts/lint check $(VENV)

# Sorts the imports and formats the Python code in place (ruff; what `make lint` checks).
format: venv
	@scripts/lint format $(VENV)

# Side by side with the reference macvlan + host-local (installed by `install`);
# table on stdout, everything in bench/results.json. BENCH_FLAGS: see bench/run.py --help.
bench: install
	@$(PY) bench/run.py --exe $(CNI_BIN)/cni-dra $(BENCH_FLAGS)

# Pod start-up and tear-down in the real cluster (scripts/e2e/cluster.py): bursts of pods
# with claims on cni-dra against the same pods on the reference macvlan, on the same node,
# alternating; see docs/performance.md. Uses the bed that is up (make cluster-up), else
# brings one up and takes it down at the end. A measurement, not a test: not in `make check`.
# BENCH_CLUSTER_FLAGS: see bench/cluster.py --help (--pods 50 --rounds 2 ...). RUNTIME only
# when given: a bed that is up is used with the runtime it was brought up with. The agent
# runs the chart's default fast-path processes (one per CPU), not the bed's single one.
BENCH_CLUSTER_FLAGS ?= --helm-set fastpath.processes=0
bench-cluster: install
	@$(if $(filter command line environment,$(origin RUNTIME)),CNI_DRA_E2E_RUNTIME=$(RUNTIME)) \
	 $(PY) bench/cluster.py $(BENCH_CLUSTER_FLAGS)

# The real-cluster scenarios (netns_tests/e2e, collected only with CNI_DRA_E2E=1):
# Kubernetes from the Go module proxy (scripts/e2e/build-kube), etcd/containerd/runc and
# two local images (scripts/e2e/fetch-runtime), Helm (scripts/e2e/build-helm), CRI-O and
# Multus (scripts/e2e/build-crio, build-multus), all cached by version under
# CNI_DRA_E2E_CACHE, and cni-dra's image (make image, cached by the tree's content); then
# one pytest session per runtime, each bringing the cluster up (cni-dra installed by its
# Helm chart), running its scenarios and tearing everything down, pass or fail: containerd
# runs every scenario; CRI-O, with Multus as the second node's CNI, runs
# netns_tests/e2e/test_runtimes.py (what differs between runtimes, and the Multus
# scenarios). Each session starts from a cluster of its own: one left up before (make
# cluster-up, a killed run) is taken down first. Exit 5 (nothing collected) fails here.
E2E_SESSIONS = containerd:netns_tests/e2e/ cri-o:netns_tests/e2e/test_runtimes.py
e2e: install
	@start=$$(date +%s); \
	 scripts/e2e/build-kube >/dev/null; \
	 scripts/e2e/fetch-runtime >/dev/null; \
	 scripts/e2e/build-crio >/dev/null; \
	 scripts/e2e/build-multus >/dev/null; \
	 echo "e2e: builds and fetches $$(( $$(date +%s) - start )) s"; \
	 rc=0; times=; \
	 for s in $(E2E_SESSIONS); do \
	   rt=$${s%%:*}; what=$${s#*:}; multus=0; [ $$rt = cri-o ] && multus=1; t0=$$(date +%s); \
	   echo "e2e: runtime $$rt (Multus on the second node: $$multus), components:"; \
	   CNI_DRA_E2E_RUNTIME=$$rt CNI_DRA_E2E_MULTUS=$$multus $(PY) scripts/e2e/cluster.py versions; \
	   $(PY) scripts/e2e/cluster.py down; \
	   CNI_DRA_E2E=1 CNI_DRA_E2E_RUNTIME=$$rt CNI_DRA_E2E_MULTUS=$$multus \
	     $(PYTEST) -p no:cacheprovider -v -rfEsxXp $$what || rc=$$?; \
	   CNI_DRA_E2E_RUNTIME=$$rt $(PY) scripts/e2e/cluster.py down; \
	   times="$$times $$rt $$(( $$(date +%s) - t0 )) s;"; \
	 done; \
	 echo "e2e: $$(( $$(date +%s) - start )) s in all ($$times) pytest exit $$rc"; \
	 exit $$rc

# RUNTIME=cri-o for CRI-O; MULTUS=1 for Multus as the second node's CNI
cluster-up: install
	@CNI_DRA_E2E_RUNTIME=$(RUNTIME) CNI_DRA_E2E_MULTUS=$(MULTUS) $(PY) scripts/e2e/cluster.py up

cluster-down:
	@CNI_DRA_E2E_RUNTIME=$(RUNTIME) $(PY) scripts/e2e/cluster.py down

# CRI-O (with conmon, crictl, runc), Multus and Helm built or fetched into
# CNI_DRA_E2E_CACHE (scripts/e2e/build-crio, build-multus, build-helm), then each run on
# this host and everything it started removed: see README "More components". Not part
# of `make check`: a cold build takes about half an hour of the 2 cores.
smoke-runtimes:
	@scripts/e2e/smoke-runtimes

# The chart is the one source of the plain manifests in conf/k8s (a unit test compares them).
render-manifests:
	@scripts/render-manifests

# build/ holds make image's archives and its temporary directories. The .deb files and the
# cached part of the plugin tree stay in /var/cache/cni-dra-tree (CNI_DRA_TREE_CACHE).
clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis .mypy_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
