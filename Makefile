# disttrain: `make test` runs everything CI runs; `make demo` shows a job run end to end.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .cache/venv
PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.stamp-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
BINARIES_STAMP := .cache/bin/.stamp-$(shell cat hack/versions.env hack/kube/go.mod hack/etcd/go.mod | sha1sum | cut -c1-12)
TF_VENV := .cache/tf-venv
# Real TensorFlow for the end-to-end TF_CONFIG tests (CPU build; ~600 MB, cached).
TF_PACKAGES := tensorflow-cpu==2.21.0 tf-keras==2.21.0
TF_STAMP := $(TF_VENV)/.stamp-$(shell echo "$(TF_PACKAGES)" | sha1sum | cut -c1-12)
HVD_VENV := .cache/hvd-venv
CLUSTER_DIR := .cache/cluster
PYTEST_ARGS ?=

.PHONY: all test lint unit integration venv tf-venv mpi-e2e binaries cluster-up cluster-down crd demo bench clean

all: test

$(VENV_STAMP): pyproject.toml
	hack/ensure-system.sh
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV_STAMP)

$(TF_STAMP):
	hack/ensure-system.sh
	rm -rf $(TF_VENV) && $(PYTHON) -m venv $(TF_VENV)
	$(TF_VENV)/bin/pip install -q --upgrade pip
	$(TF_VENV)/bin/pip install -q $(TF_PACKAGES)
	touch $@

tf-venv: $(TF_STAMP)

# Open MPI 4.1 + sshd from Debian, and mpi4py / TensorFlow 2.15 / Horovod 0.28.1 built against
# them, for tests/integration/test_real_mpi.py (each script caches its own result).
mpi-e2e:
	hack/mpi-e2e/setup-system.sh
	hack/mpi-e2e/build-hvd-venv.sh $(HVD_VENV)

$(BINARIES_STAMP): hack/versions.env hack/kube/go.mod hack/etcd/go.mod
	hack/build-binaries.sh
	touch $@

binaries: $(BINARIES_STAMP)

lint: venv
	$(VENV)/bin/ruff check operator hack tests examples
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: venv binaries tf-venv mpi-e2e
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

# The README's test command: lint, unit tests, then integration tests on a real control plane.
test: venv binaries tf-venv mpi-e2e
	$(VENV)/bin/ruff check operator hack tests examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -p no:cacheprovider tests $(PYTEST_ARGS)

crd: venv
	$(PY) hack/gen_podtemplate_schema.py --kubeconfig $(CLUSTER_DIR)/kubeconfig
	$(PY) -m disttrain crd > crds/disttrainjobs.disttrain.dev.yaml
	cp crds/disttrainjobs.disttrain.dev.yaml charts/disttrain-operator/crds/

# A job from `kubectl apply` to Succeeded on the local control plane, with real TensorFlow.
demo: venv binaries tf-venv
	$(PY) hack/demo.py

# Operator vs a plain client doing the same API writes; writes bench-results/results.md.
bench: venv binaries
	$(PY) hack/bench.py

cluster-up: venv binaries
	$(PY) hack/localcluster.py up --dir $(CLUSTER_DIR)

cluster-down: venv
	$(PY) hack/localcluster.py down --dir $(CLUSTER_DIR)

clean: cluster-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
