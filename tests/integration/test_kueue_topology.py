"""Kueue topology-aware scheduling (TAS) with a real Kueue: KWOK nodes labelled block / rack /
hostname, a Topology of those levels and a ResourceFlavor naming it. A replica type annotated
`kueue.x-k8s.io/podset-required-topology: <level>` gets every pod in one domain of that level: Kueue
assigns the domains at admission, and its TopologyUngater writes them into the pods' nodeSelector."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from manifests import replica, tf_job
from support import Cluster, record_timing, wait_for

pytestmark = pytest.mark.usefixtures("operator")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
GPUS_PER_NODE = 4


def node_name(ns: str, block: int, rack: int, host: int) -> str:
    return f"{ns}-b{block}-r{rack}-n{host}"


@pytest.fixture
def tas_ns(cluster: Cluster, namespace: str) -> Iterator[str]:
    """2 blocks x 2 racks x 2 nodes of 4 GPUs (a rack holds 8), a Topology, a TAS flavor, queues."""
    if "kueue.x-k8s.io/v1beta2" not in cluster.kubectl("api-versions").stdout.split():
        pytest.skip("Kueue is not running on this cluster")
    from localcluster import FAKE_NODE_ANNOTATION

    pool = f"tas-{namespace}"
    nodes = []
    for b in range(2):
        for r in range(2):
            for h in range(2):
                name = node_name(namespace, b, r, h)
                capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
                cluster.core.create_node({"metadata": {
                    "name": name, "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                    "labels": {"pool": pool, BLOCK: f"b{b}", RACK: f"b{b}-r{r}", HOST: name}},
                    "status": {"capacity": capacity, "allocatable": capacity}})
                nodes.append(name)
    objects = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": pool},
         "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": pool},
         "spec": {"nodeLabels": {"pool": pool}, "topologyName": pool}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": pool},
         "spec": {"namespaceSelector": {}, "resourceGroups": [
             {"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                 {"name": pool, "resources": [{"name": "cpu", "nominalQuota": "256"},
                                              {"name": "memory", "nominalQuota": "2Ti"},
                                              {"name": "nvidia.com/gpu", "nominalQuota": "32"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "racks", "namespace":
                                                                                   namespace},
         "spec": {"clusterQueue": pool}},
    ]
    cluster.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    def active() -> bool:
        conditions = cluster.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", pool).get("status", {})
        return any(c["type"] == "Active" and c["status"] == "True" for c in conditions.get("conditions", []))
    wait_for(active, 30, "the TAS ClusterQueue active")
    yield namespace
    cluster.kubectl("delete", "dtj", "--all", "-n", namespace, "--wait=false", check=False)
    for kind in ("clusterqueue", "resourceflavor", "topology"):
        cluster.kubectl("delete", kind, pool, "--wait=false", check=False)
    for name in nodes:
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def topology(replicas: int, gpus: int, **annotations: str) -> dict[str, Any]:
    spec = replica(replicas, gpus=gpus, cpu="1")
    spec["template"]["metadata"] = {"annotations": annotations}
    return spec


def queued(job: dict[str, Any]) -> dict[str, Any]:
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "racks"}
    return job


def placement(cluster: Cluster, ns: str, job: str) -> list[tuple[str, str, str, str]]:
    """(pod, node, rack, block) of every pod of the job, bound."""
    racks = {n.metadata.name: n.metadata.labels for n in cluster.core.list_node().items}
    return sorted((p.metadata.name, p.spec.node_name, racks[p.spec.node_name][RACK], racks[p.spec.node_name][BLOCK])
                  for p in cluster.pods(ns, f"disttrain.dev/job-name={job}") if p.spec.node_name)


def listing(rows: list[tuple[str, str, str, str]]) -> str:
    return "\n".join(f"{pod:<20} {node:<28} {rack:<8} {block}" for pod, node, rack, block in
                     [("POD", "NODE", "RACK", "BLOCK"), *rows])


def test_a_job_that_requires_a_rack_has_every_worker_in_one_rack(cluster: Cluster, tas_ns: str) -> None:
    """4 workers of 2 GPUs fill exactly one rack; the chief asks for one host on its own."""
    job = tf_job("racked", None, chief=topology(1, 1, **{"kueue.x-k8s.io/podset-required-topology": HOST}),
                 worker=topology(4, 2, **{"kueue.x-k8s.io/podset-required-topology": RACK}))
    started = time.monotonic()
    cluster.apply(queued(job), tas_ns)
    cluster.wait_phase(tas_ns, "racked", "Running", timeout=60)
    record_timing("tas", "apply -> Running (TAS admitted, pods ungated and bound): 5 pods", time.monotonic() - started)
    rows = placement(cluster, tas_ns, "racked")
    print(f"\n[TAS] pod -> node -> rack of job racked (required: {RACK} for the workers):\n{listing(rows)}")
    workers = [r for r in rows if "-worker-" in r[0]]
    assert len(workers) == 4 and len({rack for _, _, rack, _ in workers}) == 1, rows
    for pod in cluster.pods(tas_ns, "disttrain.dev/job-name=racked"):
        # With hostname the lowest level, Kueue assigns hosts, and its ungater writes the host alone.
        assert not pod.spec.scheduling_gates, "Kueue's ungater lifted the gate"
        assert pod.spec.node_selector[HOST] == pod.spec.node_name, pod.spec.node_selector
    workload = cluster.custom.list_namespaced_custom_object(*KUEUE, tas_ns, "workloads")["items"][0]
    requests = {s["name"]: s.get("topologyRequest") for s in workload["spec"]["podSets"]}
    assert requests["worker"] == {"required": RACK, "podIndexLabel": "disttrain.dev/replica-index"}
    assert requests["chief"]["required"] == HOST


def test_a_job_that_fits_no_single_rack_waits_in_kueues_words(cluster: Cluster, tas_ns: str) -> None:
    """4 workers of 4 GPUs are 16, two racks' worth: never in one rack."""
    job = tf_job("toobig", None, worker=topology(4, 4, **{"kueue.x-k8s.io/podset-required-topology": RACK}))
    cluster.apply(queued(job), tas_ns)
    said = wait_for(lambda: "topology" in (m := cluster.job_status(tas_ns, "toobig").get("message", "")) and m, 60,
                    "Kueue's TAS reason in the job's message")
    status = cluster.job_status(tas_ns, "toobig")
    print(f"\n[TAS] job toobig: PHASE {status['phase']}, REASON {status['reason']}: {said}")
    print(cluster.kubectl("get", "dtj", "toobig", "-n", tas_ns, "-o", "wide").stdout)
    assert status["phase"] == "Queued"
    assert "couldn't assign flavors to pod set worker: topology" in said and "4 pod(s)" in said
    assert not cluster.pods(tas_ns, "disttrain.dev/job-name=toobig")


def test_a_bad_topology_request_fails_at_apply(cluster: Cluster, tas_ns: str) -> None:
    both = tf_job("both", None, worker=topology(1, 1, **{"kueue.x-k8s.io/podset-required-topology": RACK,
                                                        "kueue.x-k8s.io/podset-preferred-topology": RACK}))
    proc = cluster.apply(queued(both), tas_ns, check=False)
    assert proc.returncode != 0 and "at most one of the annotations kueue.x-k8s.io/podset-required-topology" in \
        proc.stderr, proc.stderr
    sliced = tf_job("sliced", None, worker=topology(2, 1, **{"kueue.x-k8s.io/podset-slice-required-topology": RACK,
                                                            "kueue.x-k8s.io/podset-slice-size": "two"}))
    proc = cluster.apply(queued(sliced), tas_ns, check=False)
    assert proc.returncode != 0 and "kueue.x-k8s.io/podset-slice-size is a whole number" in proc.stderr, proc.stderr
