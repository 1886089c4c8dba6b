"""The real node pulls from the plane's registry as a cluster's node pulls from a platform team's:
over TLS, only with a pull secret's credentials (hack/registry.py). A fresh tag per run, so the
image is resolved from the registry, never found in containerd's store by name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from e2e_support import pinned_namespace
from support import Cluster, wait_for, wait_namespace_ready


@pytest.fixture
def probe_image(cluster: Cluster, real_node: str) -> str:
    import registry

    return registry.Registry(cluster.kubeconfig.parent).tag(registry.OPERATOR, f"probe-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def bare_namespace(cluster: Cluster, real_node: str) -> Iterator[str]:
    """Pinned to the node, with no pull secret."""
    import realnode

    name = f"nopull-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(realnode.pinned_namespace(name))
    wait_namespace_ready(cluster, name)
    yield name
    cluster.core.delete_namespace(name)


def probe_pod(image: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "probe", "image": image, "command": ["python", "-c", "print('pulled')"]}]}}


def test_the_node_pulls_from_the_registry_only_with_the_pull_secret(
        cluster: Cluster, real_node: str, probe_image: str, bare_namespace: str) -> None:
    cluster.apply(probe_pod(probe_image), namespace=bare_namespace)

    def refused() -> str | None:
        pod = cluster.core.read_namespaced_pod("probe", bare_namespace)
        waiting = next((s.state.waiting for s in pod.status.container_statuses or [] if s.state.waiting), None)
        return waiting.message if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff") else None
    message = wait_for(refused, 60, "the pull without credentials refused")
    assert "authorization failed: no basic auth credentials" in message, message

    granted = pinned_namespace(cluster, f"pull-{uuid.uuid4().hex[:6]}")
    try:
        cluster.apply(probe_pod(probe_image), namespace=granted)
        pod = wait_for(lambda: (p := cluster.core.read_namespaced_pod("probe", granted)).status.phase == "Succeeded"
                       and p, 120, "the pod with the pull secret run")
        # Named and resolved by the registry: the digest it serves, not a copy imported by name.
        assert pod.status.container_statuses[0].image_id.startswith(probe_image.rsplit(":", 1)[0] + "@sha256:")
        assert pod.spec.image_pull_secrets[0].name == "disttrain-registry"  # from the default ServiceAccount
    finally:
        cluster.core.delete_namespace(granted)


def test_the_chart_runs_the_operator_from_the_registry(cluster: Cluster, chart_operator: str) -> None:
    import registry

    pod = cluster.pods(chart_operator, "app.kubernetes.io/name=disttrain-operator")[0]
    assert pod.spec.containers[0].image == registry.local(registry.OPERATOR)
    assert pod.spec.image_pull_secrets[0].name == registry.PULL_SECRET
    assert pod.status.container_statuses[0].image_id.startswith(registry.local("disttrain/operator") + "@sha256:")
