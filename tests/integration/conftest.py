"""Integration fixtures: one real control plane per test session (or the cluster named by
DISTTRAIN_TEST_KUBECONFIG), the CRD installed, the operator running, a namespace per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import CRD_FILE, ROOT, Cluster, OperatorProcess, wait_for, wait_namespace_ready


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    existing = os.environ.get("DISTTRAIN_TEST_KUBECONFIG")
    if existing:
        yield Cluster(kubeconfig=Path(existing))
        return
    from localcluster import LocalCluster

    with LocalCluster(root=ROOT / ".cache" / "test-cluster") as local:
        yield Cluster(kubeconfig=local.kubeconfig, local=local)


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> Cluster:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    established = "{.status.conditions[?(@.type=='Established')].status}"
    wait_for(lambda: cluster.kubectl("get", "crd/disttrainjobs.disttrain.dev", "-o",
                                     f"jsonpath={established}").stdout == "True", 60, "CRD established")
    return cluster


@pytest.fixture(scope="session")
def operator(crd: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(crd, tmp_path_factory.mktemp("operator") / "operator.log")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    wait_namespace_ready(cluster, name)
    yield name
    cluster.core.delete_namespace(name)
