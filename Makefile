# disttrain: `make test` runs everything CI runs; `make demo` shows a job run end to end.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .cache/venv
PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.stamp-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
BINARY_SOURCES := hack/versions.env hack/build-binaries.sh hack/build-kube-version.sh hack/kube/go.mod \
                  hack/kube/go.sum $(wildcard hack/kube/*.go hack/kube/*/main.go) \
                  hack/kube-v1.37/go.mod hack/kube-v1.37/go.sum hack/kube-v1.37/tools.go \
                  hack/volcano/go.mod hack/etcd/go.mod \
                  hack/kwok/go.mod hack/kwok/easycel-guard.patch
BINARIES_STAMP := .cache/bin/.stamp-$(shell cat $(BINARY_SOURCES) | sha1sum | cut -c1-12)
TF_VENV := .cache/tf-venv
# Real TensorFlow for the end-to-end TF_CONFIG tests (CPU build; ~600 MB, cached).
# tf-keras without its dependencies: it requires `tensorflow`, the full build, beside tensorflow-cpu.
TF_PACKAGES := tensorflow-cpu==2.21.0
TF_KERAS := tf-keras==2.21.0
TF_STAMP := $(TF_VENV)/.stamp-$(shell echo "$(TF_PACKAGES) $(TF_KERAS) no-deps" | sha1sum | cut -c1-12)
HVD_VENV := .cache/hvd-venv
CLUSTER_DIR := .cache/cluster
PYTEST_ARGS ?=
, := ,

.PHONY: all help test test-matrix lint unit integration e2e chaos venv tf-venv mpi-e2e binaries previous-plane prometheus node images cluster-up cluster-down \
        crd demo bench bench-checkpoint clean dist push

all: test

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/  make \1\t\2/' | expand -t 24

$(VENV_STAMP): pyproject.toml
	hack/ensure-system.sh
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[operator,dev]'
	touch $@

venv: $(VENV_STAMP) ## the dev virtualenv (.cache/venv)

# The sdist, and the wheel built from it (so the sdist is known whole): what a user installs from a
# checkout without pip reaching PyPI for disttrain itself, which is not published there.
dist: venv ## the sdist and wheel in dist/: pip install 'dist/disttrain-<version>-py3-none-any.whl[operator]'
	rm -rf dist && $(PY) -m build --outdir dist .

$(TF_STAMP):
	hack/ensure-system.sh
	rm -rf $(TF_VENV) && $(PYTHON) -m venv $(TF_VENV)
	$(TF_VENV)/bin/pip install -q --upgrade pip
	$(TF_VENV)/bin/pip install -q $(TF_PACKAGES)
	$(TF_VENV)/bin/pip install -q --no-deps $(TF_KERAS)
	touch $@

tf-venv: $(TF_STAMP) ## TensorFlow 2.21 for the real-training tests (.cache/tf-venv)

# Open MPI 4.1 + sshd from Debian, and mpi4py / TensorFlow 2.15 / Horovod 0.28.1 built against
# them, for tests/integration/test_real_mpi.py (each script caches its own result).
mpi-e2e: ## Open MPI, sshd and Horovod 0.28.1 for the real-mpirun tests (.cache/hvd-venv)
	hack/mpi-e2e/setup-system.sh
	MAKEFLAGS= hack/mpi-e2e/build-hvd-venv.sh $(HVD_VENV)  # its own -j: make -j4's MAKEFLAGS made Horovod's build serial (133 s -> 463 s)

$(BINARIES_STAMP): $(BINARY_SOURCES)
	hack/build-binaries.sh
	touch $@

binaries: $(BINARIES_STAMP) ## the control plane, kubelet and CoreDNS built from the Go module proxy (.cache/bin)

# The control plane before the default's (hack/versions.env, PREVIOUS_KUBERNETES_VERSION): the one
# tests/integration/test_plane_upgrade.py upgrades from, in .cache/bin-<version> (cached).
previous-plane: binaries ## the previous minor's API server, controller manager and scheduler (the upgrade test)
	source hack/versions.env && hack/build-kube-version.sh $$PREVIOUS_KUBERNETES_VERSION \
	  kube-apiserver kube-controller-manager kube-scheduler >/dev/null

# Prometheus (hack/versions.env), for the test of the chart's dashboard queries alone: `make test` builds
# it beside its lanes, and that test runs the same script (which waits for that build, or builds it).
prometheus: ## Prometheus, for tests/integration/test_prometheus_dashboard.py (.cache/bin/prometheus)
	hack/build-binaries.sh prometheus >/dev/null

node: ## Debian packages of the real node: runc, CNI plugins, iptables, ipset; buildah, debootstrap
	hack/node/ensure-node-system.sh

images: venv tf-venv mpi-e2e node ## the images, built here with buildah, as OCI archives (.cache/images)
	$(PY) hack/images.py

lint: venv ## ruff, mypy and the import contracts (also run by pre-commit)
	$(VENV)/bin/ruff check operator hack tests examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

unit: venv ## unit tests only (no cluster)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: venv binaries previous-plane prometheus tf-venv mpi-e2e ## integration tests on a real local control plane (KWOK nodes)
	DISTTRAIN_REAL_NODE=0 $(PY) -m pytest tests/integration $(PYTEST_ARGS)

e2e: venv binaries node images ## the examples from kubectl apply to Succeeded on a real node, the operator in-cluster
	DISTTRAIN_REAL_NODE=1 $(PY) -m pytest tests/e2e $(PYTEST_ARGS)

# The README's test command: lint, then every test in three lanes at once (hack/testlanes.py): the e2e
# tests on a plane with the real node; meanwhile the integration and quick chaos tests on a KWOK-only
# one, and the unit tests with none. The previous minor's control plane (make previous-plane) and
# Prometheus are built beside the lanes, each for the one test that needs it.
# The builds at once (make -j): a new machine's Go builds keep both cores busy while pip and apt
# mostly wait on the network (the apt steps take a lock in turn). The images too: built here, in the
# Go builds' shadow, they no longer hold the node lane back (a fresh clone's run: its images took
# 433 s before its first test, while the KWOK lane ended 7 minutes before it).
TEST_PREREQUISITES := lint binaries tf-venv mpi-e2e node images
test: ## what CI runs: lint, then every test
	hack/ensure-system.sh  # curl, unzip, git and venv first: the parallel builds below all use them
	$(MAKE) --no-print-directory -j4 --output-sync=target $(TEST_PREREQUISITES)
	$(PY) hack/testlanes.py $(PYTEST_ARGS)

# The integration suite on each supported Kubernetes minor (hack/versions.env); the versions besides
# the default add their control plane's build (cached; the previous minor's shares hack/kube's graph).
KUBE_VERSIONS ?=
test-matrix: venv binaries tf-venv mpi-e2e ## tests/integration on each supported Kubernetes version (KUBE_VERSIONS=...)
	KUBE_VERSIONS="$(KUBE_VERSIONS)" hack/test-matrix.sh

# Scenarios whose purpose is to break the operator (tests/chaos): the quick ones run in `make test`
# too; DISTTRAIN_CHAOS=full adds the long ones (operator SIGKILLs, API server and etcd outages).
chaos: venv binaries ## the chaos suite on KWOK nodes, long scenarios included (under 20 minutes)
	DISTTRAIN_CHAOS=full DISTTRAIN_REAL_NODE=0 $(PY) -m pytest tests/chaos $(PYTEST_ARGS)

crd: venv ## regenerate the CRD from a running plane's PodTemplateSpec (make cluster-up first)
	$(PY) hack/gen_podtemplate_schema.py --kubeconfig $(CLUSTER_DIR)/kubeconfig
	$(PY) -m disttrain crd > crds/disttrainjobs.disttrain.dev.yaml
	cp crds/disttrainjobs.disttrain.dev.yaml charts/disttrain-operator/crds/

# A job from `kubectl apply` to Succeeded on the local control plane, with real TensorFlow.
demo: venv binaries tf-venv $(if $(REAL_NODE),node) ## a job from kubectl apply to Succeeded (REAL_NODE=1: in containers)
	$(if $(REAL_NODE),$(PY) hack/images.py --only operator$(,)tensorflow)
	$(PY) hack/demo.py $(if $(REAL_NODE),--real-node)

# Operator vs a plain client doing the same API writes: burst, completion, single job, scale and
# API cost; writes bench/results.{json,md} and plots. BENCH_ARGS=--quick (under 5 minutes), --profile.
BENCH_ARGS ?=
bench: venv binaries ## the operator against a plain client doing the same API writes (bench/results.md)
	$(PY) hack/bench.py $(BENCH_ARGS)

# The work a stop loses (suspend, Kueue preemption, a drained pod), with and without the
# checkpoint before it, on the real node; writes bench/results.checkpoint.{json,md}.
bench-checkpoint: venv binaries node images ## steps redone after a stop, with and without a checkpoint first (~15 min)
	DISTTRAIN_REAL_NODE=1 $(PY) -m pytest tests/e2e/bench_lost_work.py -s $(PYTEST_ARGS)

REAL_NODE ?=
push: venv images ## push the images to REGISTRY=host[:port]/path (default: the local plane's) and print their digests
	hack/build-binaries.sh crane
	$(PY) hack/registry.py push $(if $(REGISTRY),--registry $(REGISTRY))

cluster-up: venv binaries $(if $(REAL_NODE),node images) ## a local plane with 4 fake GPU nodes (REAL_NODE=1: and a real one)
	$(PY) hack/localcluster.py up --dir $(CLUSTER_DIR) $(if $(REAL_NODE),--real-node)

cluster-down: venv ## stop it
	$(PY) hack/localcluster.py down --dir $(CLUSTER_DIR)

clean: cluster-down ## remove the dev virtualenv and tool caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
