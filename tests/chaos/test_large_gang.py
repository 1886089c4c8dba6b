"""A 1,024-worker job admitted whole by Kueue (issue 45), on the real plane: one Workload whose worker
podSet counts 1,024, admitted in one piece against a quota of exactly that, then every pod made and
Running on KWOK nodes. `make chaos` runs it (a minute of the plane's time); `make bench` measures the
same size with Kubernetes' own gang (hack/bench_large.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from manifests import gloo_job
from support import Cluster, record_timing, wait_for

pytestmark = [pytest.mark.usefixtures("operator"), pytest.mark.chaos_full]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
WORKERS = 1024
NODES, GPUS_PER_NODE = 13, 80  # 1,040 GPUs: the gang fits, with no room for a second


@pytest.fixture
def queue(cluster: Cluster, namespace: str) -> Iterator[str]:
    from localcluster import FAKE_NODE_ANNOTATION

    if "kueue.x-k8s.io/v1beta2" not in cluster.kubectl("api-versions").stdout.split():
        pytest.skip("Kueue is not running on this cluster")
    flavor = f"fl-{namespace}"
    capacity = {"cpu": "200", "memory": "1Ti", "pods": "200", "nvidia.com/gpu": str(GPUS_PER_NODE)}
    for i in range(NODES):
        meta = {"name": f"{namespace}-{i}", "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                "labels": {"gpu-pool": flavor}}
        cluster.core.create_node({"metadata": meta, "status": {"capacity": capacity, "allocatable": capacity}})
    quota = [{"name": "cpu", "nominalQuota": "10000"}, {"name": "memory", "nominalQuota": "100Ti"},
             {"name": "nvidia.com/gpu", "nominalQuota": str(WORKERS)}]
    objects = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
         "spec": {"nodeLabels": {"gpu-pool": flavor}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"cq-{namespace}"},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                                               "flavors": [{"name": flavor, "resources": quota}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "big", "namespace": namespace}, "spec": {"clusterQueue": f"cq-{namespace}"}},
    ]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    try:
        yield namespace
    finally:
        cluster.kubectl("delete", "clusterqueue", f"cq-{namespace}", "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", flavor, "--wait=false", check=False)
        for i in range(NODES):
            cluster.kubectl("delete", "node", f"{namespace}-{i}", "--wait=false", check=False)


def admission(cluster: Cluster, ns: str) -> dict[str, Any]:
    """The job's Workload's admission; not yet: an AssertionError with its conditions (wait_for's last)."""
    workloads = cluster.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
    for workload in workloads:
        if found := workload.get("status", {}).get("admission"):
            return dict(found)
    raise AssertionError([w.get("status", {}).get("conditions") for w in workloads])


def test_a_1024_worker_job_is_admitted_whole_and_all_its_pods_run(cluster: Cluster, queue: str) -> None:
    job = gloo_job("big", workers=WORKERS, gpus=1)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "big"}
    started = time.monotonic()
    cluster.apply(job, queue)

    admitted = wait_for(lambda: admission(cluster, queue), 120, "the Workload admitted")
    to_admitted = time.monotonic() - started
    counts = {a["name"]: a.get("count") for a in admitted["podSetAssignments"]}
    assert counts == {"worker": WORKERS}, counts  # whole: one admission of every worker, not a part

    def running() -> int | None:
        pods = cluster.pods(queue, "disttrain.dev/job-name=big")
        ready = sum(1 for p in pods if p.status.phase == "Running")
        return ready if ready == WORKERS and len(pods) == WORKERS else None

    wait_for(running, 400, f"{WORKERS} pods Running", interval=2.0)  # with the 120 s above, under pytest's 600
    to_running = time.monotonic() - started
    status = cluster.job_status(queue, "big")
    assert status["phase"] == "Running", status
    record_timing("large", f"Kueue {WORKERS}-worker Gloo job: apply -> admitted whole", to_admitted)
    record_timing("large", f"Kueue {WORKERS}-worker Gloo job: apply -> every pod Running", to_running)
