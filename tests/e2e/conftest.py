"""The end-to-end tests' fixtures (tests/e2e): the real node, the operator installed by its chart
(once for the package), a namespace per test pinned to the node, and pods' logs followed."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from e2e_support import HELM, LAST_LINES, Follow, pinned_namespace
from fakedra import FAKE_GPU_CLASS
from support import ROOT, Cluster, LogFollower, OperatorProcess


@pytest.fixture(scope="package")
def real_node(cluster: Cluster) -> str:
    import realnode

    nodes = cluster.core.list_node(label_selector=f"{realnode.NODE_KEY}=true").items
    if not nodes:
        pytest.skip("no real node in this cluster (DISTTRAIN_REAL_NODE=1, make node images)")
    name = str(nodes[0].metadata.name)
    # A run killed while a test had it cordoned (the failover test) left every later pod Pending.
    cluster.kubectl("uncordon", name)
    return name


@pytest.fixture(scope="package")
def chart_operator(crd: Cluster, operator: OperatorProcess, real_node: str) -> Iterator[str]:
    """The operator as users run it: `helm install` of the chart, its image pulled from the plane's
    registry with a pull secret, once for the e2e tests that need it. The session's own operator (a
    process on this machine) steps aside meanwhile."""
    import registry

    operator.stop()
    # The release's namespace has the registry's pull secret, as the chart's NOTES ask.
    release = pinned_namespace(crd, f"disttrain-{uuid.uuid4().hex[:6]}")
    # Progress is written every 2 s (the chart's default is 15): these trainings last under a minute.
    # The real node's DRA driver's class counts as GPUs (hack/nodedra.py, test_dra_real_node.py).
    subprocess.run([str(HELM), "install", "disttrain", str(ROOT / "charts" / "disttrain-operator"), "-n", release,
                    *registry.Registry.helm_values(),
                    "--set", "progress.statusIntervalSeconds=2",
                    "--set-json", f'dra.gpuDeviceClasses=["{FAKE_GPU_CLASS}"]',
                    "--wait", "--timeout", "180s"], env=crd.env(),
                   check=True, capture_output=True, text=True)
    try:
        yield release
    finally:
        # The operator stopped before its grants go: helm deletes the Deployment without waiting for
        # its pod, then the Roles, and a stopping leader releases its Lease (a GET and an UPDATE),
        # refused once its Role is gone (the RBAC audit, a fresh clone's run).
        crd.kubectl("scale", "deploy", "-n", release, "-l", "app.kubernetes.io/name=disttrain-operator",
                    "--replicas=0", check=False)
        crd.kubectl("wait", "--for=delete", "pod", "-n", release, "-l", "app.kubernetes.io/name=disttrain-operator",
                    "--timeout=60s", check=False)
        subprocess.run([str(HELM), "uninstall", "disttrain", "-n", release, "--wait"], env=crd.env(),
                       capture_output=True)
        crd.core.delete_namespace(release)
        operator.start()


@pytest.fixture
def job_namespace(cluster: Cluster, chart_operator: str) -> Iterator[str]:
    ns = pinned_namespace(cluster, f"e2e-{uuid.uuid4().hex[:6]}")
    yield ns
    cluster.core.delete_namespace(ns)
    for pv in cluster.core.list_persistent_volume(label_selector=f"disttrain.dev/claim-namespace={ns}").items:
        cluster.core.delete_persistent_volume(pv.metadata.name)


@pytest.fixture
def follow(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Follow]:
    """Follow pods' logs; every follower is stopped when the test ends, pass or fail, and the last
    lines of each pod are kept in .cache/e2e-last-lines/<test>.txt (what a run's report quotes; 40,
    where 4 kept only the end of Open MPI's help text when a launcher failed)."""
    followers: list[LogFollower] = []

    def start(ns: str, pods: list[Any]) -> dict[str, LogFollower]:
        started = {p.metadata.name: LogFollower(cluster, ns, p.metadata.name) for p in pods}
        followers.extend(started.values())
        return started
    yield start
    for follower in followers:
        follower.stop()
    LAST_LINES.mkdir(parents=True, exist_ok=True)
    (LAST_LINES / f"{request.node.name}.txt").write_text(
        "".join(f"--- {f.pod}\n" + "".join(f"{line}\n" for line in f.lines[-40:]) for f in followers))
