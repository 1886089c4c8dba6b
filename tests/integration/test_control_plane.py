"""The local control plane is a real one: schema validation, scheduling of GPU pods onto KWOK
nodes, pod lifecycle to a chosen exit code, and owner-reference garbage collection."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import ROOT, Cluster, pinned_versions, wait_for

WIDGET_CRD = textwrap.dedent("""
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata: {name: widgets.test.disttrain.dev}
    spec:
      group: test.disttrain.dev
      scope: Namespaced
      names: {kind: Widget, plural: widgets, singular: widget}
      versions:
      - name: v1
        served: true
        storage: true
        schema:
          openAPIV3Schema:
            type: object
            properties:
              spec:
                type: object
                required: [size]
                properties:
                  size: {type: integer, minimum: 1}
""")


def gpu_pod(name: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
    }


def test_version_is_the_pinned_release(cluster: Cluster) -> None:
    """hack/versions.env's, or the version `make test-matrix` built the plane at."""
    from localcluster import BIN_DIR, kube_version

    version = cluster.kubectl("version", "-o", "json").stdout
    assert f'"gitVersion": "{kube_version()}"' in version
    if BIN_DIR == ROOT / ".cache" / "bin":
        assert kube_version() == pinned_versions()["KUBERNETES_VERSION"]


def test_fake_gpu_nodes_are_ready(cluster: Cluster) -> None:
    nodes = cluster.core.list_node(label_selector="type=kwok").items
    assert len(nodes) >= 1
    for node in nodes:
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_schema_violation_is_rejected(cluster: Cluster, namespace: str) -> None:
    cluster.apply(WIDGET_CRD)
    bad = "apiVersion: test.disttrain.dev/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: zero}\n"
    result = wait_for(lambda: (r := cluster.apply(bad, namespace, check=False)).returncode != 0
                      and "spec.size" in r.stderr and r, 20, "the schema to reject spec.size")
    assert "spec.size" in result.stderr
    good = bad.replace("size: zero", "size: 3")
    cluster.apply(good, namespace)


def test_gpu_pod_runs_and_succeeds(cluster: Cluster, namespace: str) -> None:
    cluster.core.create_namespaced_pod(namespace, gpu_pod("gpu-ok"))
    pod = wait_for(lambda: (p := cluster.core.read_namespaced_pod("gpu-ok", namespace)).status.phase == "Running"
                   and p, 30, "pod Running")
    assert pod.spec.node_name.startswith("kwok-gpu-node-")
    assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
    cluster.finish_pod(namespace, "gpu-ok", 0)
    wait_for(lambda: cluster.core.read_namespaced_pod("gpu-ok", namespace).status.phase == "Succeeded",
             30, "pod Succeeded")


def test_pod_fails_with_exit_code_137(cluster: Cluster, namespace: str) -> None:
    cluster.core.create_namespaced_pod(namespace, gpu_pod("gpu-oom", gpus=2))
    wait_for(lambda: cluster.core.read_namespaced_pod("gpu-oom", namespace).status.phase == "Running", 30)
    cluster.finish_pod(namespace, "gpu-oom", 137)
    pod = wait_for(lambda: (p := cluster.core.read_namespaced_pod("gpu-oom", namespace)).status.phase == "Failed"
                   and p, 30, "pod Failed")
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 137
    assert terminated.reason == "OOMKilled"


def test_gpu_requests_beyond_capacity_stay_pending(cluster: Cluster, namespace: str) -> None:
    cluster.core.create_namespaced_pod(namespace, gpu_pod("gpu-huge", gpus=64))
    pod = wait_for(lambda: (p := cluster.core.read_namespaced_pod("gpu-huge", namespace)).status.conditions
                   and p, 30, "scheduler verdict")
    assert pod.status.phase == "Pending"
    assert "nvidia.com/gpu" in (pod.status.conditions[0].message or "")


def test_garbage_collection_deletes_children(cluster: Cluster, namespace: str) -> None:
    parent = cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "parent"}})
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": parent.metadata.uid}
    cluster.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [owner]}})
    cluster.core.delete_namespaced_config_map("parent", namespace)
    wait_for(lambda: not [c for c in cluster.core.list_namespaced_config_map(namespace).items
                          if c.metadata.name == "child"], 60, "the child to be collected")


def test_cluster_down_leaves_no_process(tmp_path: Path) -> None:
    from localcluster import LocalCluster

    cluster = LocalCluster(root=tmp_path / "plane", nodes=1).up()
    pids = list(cluster.processes.values())
    try:
        assert set(cluster.processes) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                          "kwok", "podreaper", "coscheduler", "coscheduling-controller",
                                          "vc-scheduler", "kueue"}
    finally:
        cluster.down()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_component_that_dies_at_start_up_is_named_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20: KWOK crashed at start-up and `up` spent its whole timeout waiting for nodes that
    a dead process would never make Ready. A component that exits while the plane starts is now
    named at once, with the end of its log."""
    import time

    from localcluster import ComponentDied, LocalCluster

    crash = ["sh", "-c", "echo 'fatal error: concurrent map writes'; exit 2"]
    monkeypatch.setattr(LocalCluster, "kwok_argv", lambda self, value: crash)
    cluster = LocalCluster(root=tmp_path / "plane", nodes=1, gang_schedulers=False, kueue=False)
    started = time.monotonic()
    with pytest.raises(ComponentDied, match=r"(?s)^kwok exited.*kwok \(exit 2\).*concurrent map writes"):
        cluster.up(timeout=120)
    assert time.monotonic() - started < 60, "named while waiting, not after the timeout"
    assert not cluster.processes, "and the rest stopped"


def test_finishing_a_pod_the_operator_already_removed_is_a_normal_end(cluster: Cluster, namespace: str) -> None:
    """hack/kwokpods.finish_pod, which the demo, the tests and the benchmark use: a pod deleted,
    being deleted, or replaced by a newer pod of the same name has simply ended (issue: the demo
    failed when the operator deleted a pod between its listing and its exit report)."""
    from kwokpods import finish_pod

    assert not finish_pod(cluster.core, namespace, "never-existed", 0)
    old = cluster.core.create_namespaced_pod(namespace, gpu_pod("replaced"))
    cluster.core.delete_namespaced_pod("replaced", namespace, grace_period_seconds=0)
    wait_for(lambda: not [p for p in cluster.pods(namespace) if p.metadata.name == "replaced"], 30, "deleted")
    new = cluster.core.create_namespaced_pod(namespace, gpu_pod("replaced"))
    assert not finish_pod(cluster.core, namespace, "replaced", 0, old.metadata.uid), "not the new pod's exit"
    assert finish_pod(cluster.core, namespace, "replaced", 0, new.metadata.uid)
    held = gpu_pod("held")
    held["metadata"]["finalizers"] = ["test.disttrain.dev/hold"]
    cluster.core.create_namespaced_pod(namespace, held)
    cluster.core.delete_namespaced_pod("held", namespace)
    assert not finish_pod(cluster.core, namespace, "held", 0), "a pod being deleted has ended"
