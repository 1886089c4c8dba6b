"""GPUs through Dynamic Resource Allocation, on the real scheduler, controller-manager and Kueue with
KWOK nodes: each test's node publishes a ResourceSlice of 8 fake GPUs (hack/fakedra.py: model,
uuid, memory), and the MPI workers ask for 2 each through a ResourceClaimTemplate; nothing asks for
nvidia.com/gpu. The operator counts the claimed devices as the workers' slots (the session's
operator is told the class is GPUs: --gpu-device-class), the kube-controller-manager makes each
pod's claim, the scheduler allocates the devices, and Kueue counts them against quota.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from fakedra import FAKE_GPU_CLASS, FAKE_GPU_MODEL, FAKE_GPU_RESOURCE, claim_template, device_class, resource_slice
from manifests import mpi_job
from support import Cluster, wait_for

pytestmark = pytest.mark.usefixtures("operator")
RESOURCE = ("resource.k8s.io", "v1")
WORKERS, PER_WORKER = 4, 2


@pytest.fixture
def dra_node(cluster: Cluster, namespace: str) -> Iterator[dict[str, str]]:
    """A KWOK node of this test's own whose ResourceSlice lists 8 fake GPUs; the DeviceClass; a
    ResourceClaimTemplate `two-gpus` in the namespace. Returns the node selector that reaches it."""
    from localcluster import FAKE_NODE_ANNOTATION

    name = f"dra-{namespace}"
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    cluster.core.create_node({"metadata": {"name": name, "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                                           "labels": {"dra-pool": name, "type": "kwok-dra"}},
                              "status": {"capacity": capacity, "allocatable": capacity}})
    objects = [device_class(), resource_slice(name)]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    cluster.apply(claim_template("two-gpus", PER_WORKER, f'device.attributes["{FAKE_GPU_CLASS}"].model == '
                                 f'"{FAKE_GPU_MODEL}"'), namespace)
    wait_for(lambda: any(c.type == "Ready" and c.status == "True"
                         for c in cluster.core.read_node(name).status.conditions or []), 30, "the node Ready")
    yield {"dra-pool": name}
    cluster.kubectl("delete", "resourceslice", objects[1]["metadata"]["name"], "--wait=false", check=False)
    cluster.core.delete_node(name)


def dra_mpi_job(name: str, selector: dict[str, str], claim: dict[str, str] | None = None,
                workers: int = WORKERS, **run_policy: Any) -> dict[str, Any]:
    job = mpi_job(name, workers=workers, gpus=0, **run_policy)
    for rep in job["spec"]["mpi"].values():
        rep["template"]["spec"]["nodeSelector"] = dict(selector)
    worker = job["spec"]["mpi"]["worker"]["template"]["spec"]
    worker["resourceClaims"] = [claim or {"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]
    worker["containers"][0].setdefault("resources", {})["claims"] = [{"name": worker["resourceClaims"][0]["name"]}]
    return job


def bound(cluster: Cluster, ns: str, job: str) -> int:
    return sum(1 for p in cluster.pods(ns, f"disttrain.dev/job-name={job}") if p.spec.node_name
               and not p.metadata.deletion_timestamp)


def allocated(cluster: Cluster, ns: str, job: str) -> dict[str, list[str]]:
    """Each worker pod's devices, from the claim the controller-manager made for it."""
    found = {}
    for pod in cluster.pods(ns, f"disttrain.dev/job-name={job},disttrain.dev/replica-type=worker"):
        names = [s.resource_claim_name for s in pod.status.resource_claim_statuses or [] if s.resource_claim_name]
        devices = []
        for claim in names:
            obj = cluster.custom.get_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", claim)
            devices += [r["device"] for r in ((obj.get("status") or {}).get("allocation") or {})
                        .get("devices", {}).get("results", [])]
        found[pod.metadata.name] = devices
    return found


def hostfile(cluster: Cluster, ns: str, job: str) -> str:
    return str(cluster.core.read_namespaced_config_map(f"{job}-mpi", ns).data["hostfile"])


def test_two_dra_gangs_one_placed_whole_with_its_devices_the_other_waits(
        cluster: Cluster, namespace: str, dra_node: dict[str, str]) -> None:
    """8 devices, two jobs of 4 workers x 2: the Kubernetes gang API places one whole, devices
    allocated, and the other waits with none bound; then it runs on the devices the first freed."""
    names = ("dra-a", "dra-b")
    for name in names:
        cluster.apply(dra_mpi_job(name, dra_node, scheduling={"gang": {"provider": "Kubernetes"}}), namespace)
    first = wait_for(lambda: next((n for n in names if bound(cluster, namespace, n) == WORKERS + 1), None), 60,
                     "one job's workers and launcher placed")
    second = next(n for n in names if n != first)
    devices = allocated(cluster, namespace, first)
    assert all(len(d) == PER_WORKER for d in devices.values()) and len(devices) == WORKERS, devices
    assert len({d for ds in devices.values() for d in ds}) == WORKERS * PER_WORKER, "no device given twice"
    assert hostfile(cluster, namespace, first).count(f"slots={PER_WORKER}") == WORKERS
    status = wait_for(lambda: (s := cluster.job_status(namespace, second)).get("reason") == "WaitingForGang" and s,
                      30, f"{second} saying WaitingForGang")
    assert bound(cluster, namespace, second) == 0
    assert cluster.job_status(namespace, first)["claimedGPUsPerWorker"] == PER_WORKER
    print(f"{second}: {status['message']}")
    cluster.finish_pod(namespace, f"{first}-launcher", 0)
    cluster.wait_phase(namespace, first, "Succeeded")
    wait_for(lambda: bound(cluster, namespace, second) == WORKERS + 1, 60, f"{second} placed once {first} is done")
    assert len({d for ds in allocated(cluster, namespace, second).values() for d in ds}) == WORKERS * PER_WORKER
    cluster.finish_pod(namespace, f"{second}-launcher", 0)
    cluster.wait_phase(namespace, second, "Succeeded")


def test_kueue_counts_the_claimed_devices_against_quota(cluster: Cluster, namespace: str,
                                                       dra_node: dict[str, str]) -> None:
    """A ClusterQueue with 8 of example.com/gpu (Kueue's name for the class's devices): two jobs of
    4 x 2 devices, one admitted and running, the other queued in Kueue's words, then admitted."""
    served = cluster.kubectl("api-versions").stdout.split()
    if "kueue.x-k8s.io/v1beta2" not in served:
        pytest.skip("Kueue is not running on this cluster")
    flavor, queue = f"fl-{namespace}", f"cq-{namespace}"
    objects = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
         "spec": {"nodeLabels": dict(dra_node)}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": queue},
         "spec": {"namespaceSelector": {},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", FAKE_GPU_RESOURCE], "flavors": [
                      {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "100"},
                                                     {"name": "memory", "nominalQuota": "1Ti"},
                                                     {"name": FAKE_GPU_RESOURCE, "nominalQuota": "8"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "gpus", "namespace": namespace}, "spec": {"clusterQueue": queue}},
    ]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    try:
        for name in ("q-one", "q-two"):
            job = dra_mpi_job(name, dra_node)
            job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
            cluster.apply(job, namespace)
            if name == "q-one":
                cluster.wait_phase(namespace, name, "Running", timeout=60)
        said = f"insufficient unused quota for {FAKE_GPU_RESOURCE} in flavor {flavor}, 8 more needed"
        status = wait_for(lambda: said in (s := cluster.job_status(namespace, "q-two")).get("message", "") and s,
                          60, "Kueue's reason on the second job")
        assert status["phase"] == "Queued" and bound(cluster, namespace, "q-two") == 0, status
        print(f"q-two: {status['message']}")
        assert hostfile(cluster, namespace, "q-one").count(f"slots={PER_WORKER}") == WORKERS
        cluster.finish_pod(namespace, "q-one-launcher", 0)
        cluster.wait_phase(namespace, "q-one", "Succeeded")
        cluster.wait_phase(namespace, "q-two", "Running", timeout=60)
        assert len({d for ds in allocated(cluster, namespace, "q-two").values() for d in ds}) == 8
    finally:
        cluster.kubectl("delete", "clusterqueue", queue, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", flavor, "--wait=false", check=False)


def test_claims_that_cant_work_fail_naming_them_and_a_missing_template_is_waited_for(
        cluster: Cluster, namespace: str, dra_node: dict[str, str]) -> None:
    shared = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "team-gpus"},
              "spec": claim_template("x", 4)["spec"]["spec"]}
    cluster.apply(shared, namespace)
    cluster.apply(dra_mpi_job("shared", dra_node, {"name": "gpus", "resourceClaimName": "team-gpus"}, workers=2),
                  namespace)
    status = cluster.wait_phase(namespace, "shared", "Failed")
    assert status["reason"] == "InvalidSpec" and "ResourceClaim team-gpus allocates GPUs and is shared by all 2 " \
        "workers" in status["message"], status
    cluster.wait_event(namespace, "shared", lambda e: e.type == "Warning" and "team-gpus" in e.message, "the warning")

    cluster.apply(dra_mpi_job("later", dra_node, {"name": "gpus", "resourceClaimTemplateName": "four-gpus"},
                              workers=2), namespace)
    status = wait_for(lambda: (s := cluster.job_status(namespace, "later")).get("reason") == "WaitingForClaims"
                      and s, 30, "the job waiting for its template")
    assert "ResourceClaimTemplate four-gpus" in status["message"] and not cluster.pods(
        namespace, "disttrain.dev/job-name=later")
    cluster.apply(claim_template("four-gpus", 4), namespace)
    cluster.wait_phase(namespace, "later", "Running", timeout=60)
    assert hostfile(cluster, namespace, "later").count("slots=4") == 2


def test_a_claim_entry_naming_both_a_claim_and_a_template_is_refused_at_apply(crd: Cluster, namespace: str) -> None:
    job = dra_mpi_job("both", {"pool": "none"}, {"name": "gpus", "resourceClaimName": "a",
                                          "resourceClaimTemplateName": "b"})
    result = crd.apply(job, namespace, check=False)
    assert result.returncode != 0 and "sets exactly one of resourceClaimName" in result.stderr, result.stderr
    twice = dra_mpi_job("twice", {"pool": "none"})
    twice["spec"]["mpi"]["worker"]["template"]["spec"]["resourceClaims"] *= 2
    result = crd.apply(twice, namespace, check=False)
    assert result.returncode != 0 and "duplicate entries for key [name=\"gpus\"]" in result.stderr, result.stderr
    # A name goes into the operator's request path: only a DNS name is taken (the operator checks again).
    walk = dra_mpi_job("walk", {"pool": "none"}, {"name": "gpus", "resourceClaimTemplateName": "../../x/y"})
    result = crd.apply(walk, namespace, check=False)
    assert result.returncode != 0 and "resourceClaimTemplateName in body should match" in result.stderr, result.stderr
    many = dra_mpi_job("many", {"pool": "none"})
    many["spec"]["mpi"]["worker"]["template"]["spec"]["resourceClaims"] = [
        {"name": f"c{i}", "resourceClaimTemplateName": "two-gpus"} for i in range(33)]
    result = crd.apply(many, namespace, check=False)
    assert result.returncode != 0 and "must have at most 32 items" in result.stderr, result.stderr
