"""Queues and quotas with a real Kueue (v0.19.2, built from its module, running beside the plane).

Each test gets its own ResourceFlavor (node labels matching two KWOK nodes of its own, 8 GPUs
each), ClusterQueue (a GPU quota) and LocalQueue. Jobs are labelled kueue.x-k8s.io/queue-name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from manifests import mpi_job, replica, tf_job
from support import Cluster, OperatorProcess, record_timing, wait_for

pytestmark = pytest.mark.usefixtures("operator")
KUEUE = ("kueue.x-k8s.io", "v1beta2")


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> None:
    served = cluster.kubectl("api-versions").stdout.split()
    if "kueue.x-k8s.io/v1beta2" not in served:
        pytest.skip("Kueue is not running on this cluster")


def setup_queue(cluster: Cluster, ns: str, gpus: int, nodes: int = 2) -> str:
    """Nodes with a flavor label, the flavor, a ClusterQueue with `gpus` of quota, a LocalQueue."""
    from localcluster import FAKE_NODE_ANNOTATION

    flavor = f"fl-{ns}"
    for i in range(nodes):
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
        cluster.core.create_node({"metadata": {"name": f"{ns}-{i}", "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                                               "labels": {"gpu-pool": flavor, "type": "kwok-kueue"}},
                                  "status": {"capacity": capacity, "allocatable": capacity}})
    objects = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
         "spec": {"nodeLabels": {"gpu-pool": flavor}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"cq-{ns}"},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                      {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "100"},
                                                     {"name": "memory", "nominalQuota": "1Ti"},
                                                     {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": ns},
         "spec": {"clusterQueue": f"cq-{ns}"}},
    ]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    def active() -> bool:
        queue = cluster.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", f"cq-{ns}")
        conditions = queue.get("status", {}).get("conditions", [])
        return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)
    wait_for(active, 30, "the ClusterQueue active")
    return flavor


@pytest.fixture
def queue_ns(cluster: Cluster, namespace: str, kueue: None) -> Iterator[str]:
    yield namespace
    cluster.kubectl("delete", "clusterqueue", f"cq-{namespace}", "--wait=false", check=False)
    cluster.kubectl("delete", "resourceflavor", f"fl-{namespace}", "--wait=false", check=False)
    for i in range(2):
        cluster.kubectl("delete", "node", f"{namespace}-{i}", "--wait=false", check=False)


def queued(job: dict[str, Any], priority: str | None = None) -> dict[str, Any]:
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    if priority:
        job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
    return job


def eight_gpu_job(name: str, priority: str | None = None) -> dict[str, Any]:
    return queued(tf_job(name, None, worker=replica(2, gpus=4, cpu="1")), priority)


def workloads(cluster: Cluster, ns: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.custom.list_namespaced_custom_object(
        *KUEUE, ns, "workloads", label_selector=f"disttrain.dev/job-name={job}")["items"]
    return items


def admitted(cluster: Cluster, ns: str, job: str) -> bool:
    return any(w.get("status", {}).get("admission") for w in workloads(cluster, ns, job))


def pods_of(cluster: Cluster, ns: str, job: str) -> list[Any]:
    return [p for p in cluster.pods(ns, f"disttrain.dev/job-name={job}") if not p.metadata.deletion_timestamp]


def test_quota_admits_two_of_three_and_the_third_when_one_finishes(cluster: Cluster, queue_ns: str) -> None:
    setup_queue(cluster, queue_ns, gpus=16)
    started = {}
    for name in ("one", "two", "three"):
        started[name] = time.monotonic()
        cluster.apply(eight_gpu_job(name), queue_ns)
        if name != "three":
            wait_for(partial(admitted, cluster, queue_ns, name), 30, f"{name}'s Workload admitted", interval=0.05)
            record_timing("kueue", f"apply -> Workload admitted: {name}", time.monotonic() - started[name])
        cluster.wait_phase(queue_ns, name, "Running" if name != "three" else "Queued", timeout=30)
        if name != "three":
            record_timing("kueue", f"apply -> Running (admitted, pods bound): {name}", time.monotonic() - started[name])
    # Queued at once; Kueue's own reason follows when its scheduler has tried the Workload.
    said = "queued in LocalQueue gpus: couldn't assign flavors to pod set worker: insufficient unused quota for " \
           "nvidia.com/gpu"
    wait_for(lambda: cluster.job_status(queue_ns, "three")["message"].startswith(said), 30, "Kueue's reason")
    assert not pods_of(cluster, queue_ns, "three"), "no pod before admission"
    print("\n" + cluster.kubectl("get", "dtj", "-n", queue_ns).stdout)
    print(cluster.kubectl("describe", "dtj", "three", "-n", queue_ns).stdout[-1500:])

    wait_for(lambda: all(p.status.phase == "Running" for p in pods_of(cluster, queue_ns, "one")), 30, "one running")
    done = time.monotonic()
    cluster.finish_pod(queue_ns, "one-worker-0", 0)
    cluster.wait_phase(queue_ns, "one", "Succeeded")
    finished = wait_for(lambda: next((w for w in workloads(cluster, queue_ns, "one") if any(
        c["type"] == "Finished" and c["status"] == "True" for c in w["status"].get("conditions", []))), None),
        30, "the first Workload Finished (its quota released)")
    assert finished["metadata"]["ownerReferences"][0]["name"] == "one"
    cluster.wait_phase(queue_ns, "three", "Running", timeout=60)
    record_timing("kueue", "first job done -> third admitted and Running", time.monotonic() - done)
    cluster.finish_pod(queue_ns, "three-worker-0", 0)
    cluster.wait_phase(queue_ns, "three", "Succeeded")


def test_a_higher_priority_job_preempts_without_spending_a_restart(cluster: Cluster, queue_ns: str) -> None:
    setup_queue(cluster, queue_ns, gpus=8)
    for name, value in (("e2e-low", 100), ("e2e-high", 1000)):
        cluster.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": name},
            "value": value}))
    cluster.apply(eight_gpu_job("low", "e2e-low"), queue_ns)
    cluster.wait_phase(queue_ns, "low", "Running", timeout=30)
    first = {p.metadata.uid for p in pods_of(cluster, queue_ns, "low")}
    cluster.apply(eight_gpu_job("high", "e2e-high"), queue_ns)
    status = cluster.wait_phase(queue_ns, "low", "Queued", timeout=60)
    assert status["reason"] == "Evicted", status
    assert status["restarts"] == 0, "a preemption is no restart"
    # The eviction's words are its event's: the status message moves on to Kueue's reason for the
    # requeued Workload (its quota taken) as soon as the quota is handed back, which a poll can miss.
    evicted = cluster.wait_event(queue_ns, "low", lambda e: e.reason == "Evicted", "the eviction said")
    assert "Preempted" in evicted.message, evicted.message
    cluster.wait_phase(queue_ns, "high", "Running", timeout=60)
    print("\n" + cluster.kubectl("get", "dtj", "-n", queue_ns).stdout + evicted.message)
    assert workloads(cluster, queue_ns, "high")[0]["spec"]["priority"] == 1000
    cluster.finish_pod(queue_ns, "high-worker-0", 0)
    cluster.wait_phase(queue_ns, "high", "Succeeded")
    cluster.wait_phase(queue_ns, "low", "Running", timeout=60)
    assert not first & {p.metadata.uid for p in pods_of(cluster, queue_ns, "low")}, "started afresh"
    cluster.finish_pod(queue_ns, "low-worker-0", 0)
    assert cluster.wait_phase(queue_ns, "low", "Succeeded")["restarts"] == 0


def test_a_restarted_operator_leaves_an_admitted_jobs_pods_alone(cluster: Cluster, queue_ns: str,
                                                                  operator: OperatorProcess) -> None:
    """Issue 45's review: with the jobs followed by a watch of the operator's own, a restarted
    operator reconciled a queued job before it knew the job's Workload, read that as a Workload
    gone, and deleted the job's running pods. Reconciling now waits for all three watches' lists."""
    setup_queue(cluster, queue_ns, gpus=16)
    cluster.apply(eight_gpu_job("steady"), queue_ns)
    cluster.wait_phase(queue_ns, "steady", "Running", timeout=30)
    before = {p.metadata.name: p.metadata.uid for p in pods_of(cluster, queue_ns, "steady")}
    operator.stop()
    operator.start()
    began = time.monotonic()
    while time.monotonic() - began < 15:  # its start, lists and first passes take ~3 s here
        pods = cluster.pods(queue_ns, "disttrain.dev/job-name=steady")
        assert {p.metadata.name: p.metadata.uid for p in pods} == before, "the pods are the ones before the restart"
        assert not any(p.metadata.deletion_timestamp for p in pods), "no pod of the job deleted"
        time.sleep(0.5)
    assert cluster.job_status(queue_ns, "steady")["phase"] == "Running"


def test_flavor_labels_land_on_an_mpi_jobs_pods_admitted_together(cluster: Cluster, queue_ns: str) -> None:
    flavor = setup_queue(cluster, queue_ns, gpus=16)
    cluster.apply(queued(mpi_job("hvd", workers=2, gpus=2)), queue_ns)
    cluster.wait_phase(queue_ns, "hvd", "Running", timeout=60)
    [workload] = workloads(cluster, queue_ns, "hvd")
    assert [s["name"] for s in workload["spec"]["podSets"]] == ["launcher", "worker"]
    assert [a["name"] for a in workload["status"]["admission"]["podSetAssignments"]] == ["launcher", "worker"]
    for pod in pods_of(cluster, queue_ns, "hvd"):
        assert pod.spec.node_selector == {"gpu-pool": flavor}
        assert "kueue.x-k8s.io/queue-name" not in (pod.metadata.labels or {}), "Kueue would queue the pod alone"
    wait_for(lambda: any(c["type"] == "PodsReady" and c["status"] == "True" for c in workloads(
        cluster, queue_ns, "hvd")[0]["status"].get("conditions", [])), 30, "PodsReady on the Workload")


def test_suspend_wins_and_a_change_while_queued_replaces_the_workload(cluster: Cluster, queue_ns: str) -> None:
    setup_queue(cluster, queue_ns, gpus=8)
    cluster.apply(eight_gpu_job("held"), queue_ns)
    cluster.wait_phase(queue_ns, "held", "Running", timeout=30)
    cluster.kubectl("patch", "dtj", "held", "-n", queue_ns, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":true}}}')
    cluster.wait_phase(queue_ns, "held", "Suspended")
    cluster.apply(eight_gpu_job("next"), queue_ns)
    cluster.wait_phase(queue_ns, "next", "Running", timeout=60)  # the suspended job's quota went back
    cluster.kubectl("patch", "dtj", "held", "-n", queue_ns, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":false}}}')
    cluster.wait_phase(queue_ns, "held", "Queued", timeout=30)
    before = workloads(cluster, queue_ns, "held")[0]["metadata"]["uid"]
    cluster.kubectl("patch", "dtj", "held", "-n", queue_ns, "--type=json", "-p", json.dumps([{
        "op": "replace", "path": "/spec/tensorflow/worker/template/spec/containers/0/resources/limits/cpu",
        "value": "2"}]))
    wait_for(lambda: [w["metadata"]["uid"] for w in workloads(cluster, queue_ns, "held")
                      if not w["metadata"].get("deletionTimestamp")] not in ([], [before]), 30, "a new Workload")
    cluster.finish_pod(queue_ns, "next-worker-0", 0)
    cluster.wait_phase(queue_ns, "held", "Running", timeout=60)


def test_kueue_evicts_a_job_whose_pods_never_become_ready(cluster: Cluster, queue_ns: str) -> None:
    """Issue 21, defect 8: with waitForPodsReady on (hack/kueue.py), Kueue itself evicts an
    admitted job whose pods don't all become Ready in time, and the job goes back to its queue with
    no restart spent. The operator keeps PodsReady as Kueue's job framework does (queueing.py)."""
    from kueue import WAIT_FOR_PODS_READY_SECONDS

    setup_queue(cluster, queue_ns, gpus=8)
    stalled = eight_gpu_job("stalled")
    stalled["spec"]["tensorflow"]["worker"]["template"]["spec"]["nodeSelector"] = {"no-such-node": "true"}
    cluster.apply(stalled, queue_ns)
    wait_for(partial(admitted, cluster, queue_ns, "stalled"), 30, "admitted")
    # The job's own word that it was admitted first: the Workload's admission is seen before the
    # operator writes Pending, and a Queued read then is the job's first, before admission (a fresh
    # clone's run read "waiting for Kueue to admit" 0.1 s before the operator wrote Pending).
    cluster.wait_phase(queue_ns, "stalled", "Pending", timeout=30)
    status = cluster.wait_phase(queue_ns, "stalled", "Queued", timeout=WAIT_FOR_PODS_READY_SECONDS + 60)
    # Kueue's words: the eviction's ("PodsReadyTimeout: ...") or, once requeued, "Exceeded the PodsReady timeout"
    assert status["reason"] == "Evicted" and "PodsReady" in status["message"], status["message"]
    assert status["restarts"] == 0, "an eviction is no restart"
    wait_for(lambda: not pods_of(cluster, queue_ns, "stalled"), 60, "its pods gone")
    [workload] = workloads(cluster, queue_ns, "stalled")
    conditions = {c["type"]: c for c in workload["status"].get("conditions", [])}
    assert conditions["Evicted"]["reason"] == "PodsReadyTimeout", conditions
    print("\n" + status["message"])


def pods_ready(cluster: Cluster, ns: str, job: str) -> dict[str, Any]:
    return next((c for w in workloads(cluster, ns, job) for c in w.get("status", {}).get("conditions", [])
                 if c["type"] == "PodsReady"), {})


def test_kueue_evicts_a_job_that_doesnt_recover_from_a_restart(cluster: Cluster, queue_ns: str) -> None:
    """Issue 21, defect 8, the case that failed: PodsReady stayed True through a whole-job restart,
    so a job whose new pods never came up kept its quota forever. Now it goes False
    (WaitForRecovery) and Kueue evicts the job after recoveryTimeout."""
    from kueue import WAIT_FOR_PODS_READY_SECONDS

    setup_queue(cluster, queue_ns, gpus=8)
    cluster.apply(eight_gpu_job("recovering"), queue_ns)
    cluster.wait_phase(queue_ns, "recovering", "Running", timeout=60)
    wait_for(lambda: pods_ready(cluster, queue_ns, "recovering").get("reason") == "Started", 30, "PodsReady Started")
    for i in range(2):  # the restart's pods will find no node
        cluster.core.patch_node(f"{queue_ns}-{i}", {"spec": {"unschedulable": True}})
    cluster.finish_pod(queue_ns, "recovering-worker-0", 137)
    cluster.wait_phase(queue_ns, "recovering", "Restarting")
    wait_for(lambda: (pods_ready(cluster, queue_ns, "recovering").get("status"),
                      pods_ready(cluster, queue_ns, "recovering").get("reason")) == ("False", "WaitForRecovery"),
             30, "PodsReady False, WaitForRecovery")
    status = cluster.wait_phase(queue_ns, "recovering", "Queued", timeout=WAIT_FOR_PODS_READY_SECONDS + 60)
    assert status["reason"] == "Evicted" and "PodsReady" in status["message"], status["message"]
    assert status["restarts"] == 1, "the restart counted once, the eviction not at all"


def test_a_workload_deleted_under_a_running_job_stops_its_pods_until_readmitted(cluster: Cluster,
                                                                               queue_ns: str) -> None:
    """Issue 21, defect 7: an admin deletes the Workload of a running job. Its pods must not run
    on without quota: they are stopped (no restart counted), a new Workload is made, and the job
    runs again once Kueue admits it."""
    setup_queue(cluster, queue_ns, gpus=8)
    cluster.apply(eight_gpu_job("orphan"), queue_ns)
    cluster.wait_phase(queue_ns, "orphan", "Running", timeout=60)
    first = {p.metadata.uid for p in pods_of(cluster, queue_ns, "orphan")}
    [old] = workloads(cluster, queue_ns, "orphan")
    cluster.custom.delete_namespaced_custom_object(*KUEUE, queue_ns, "workloads", old["metadata"]["name"])
    # Queued, then (the quota is free) admitted again at once: the event says the first.
    event = cluster.wait_event(queue_ns, "orphan", lambda e: "ran with no Workload" in (e.message or ""),
                               "the job queued again", timeout=30)
    print("\n" + event.message)
    wait_for(lambda: (now := {p.metadata.uid for p in pods_of(cluster, queue_ns, "orphan")}) and not now & first,
             60, "new pods: started afresh")
    status = cluster.wait_phase(queue_ns, "orphan", "Running", timeout=60)
    assert status["restarts"] == 0, "stopped as an eviction, no restart counted"
    assert [w["metadata"]["uid"] for w in workloads(cluster, queue_ns, "orphan")] != [old["metadata"]["uid"]]


@pytest.fixture
def queue_label_policy(cluster: Cluster) -> Iterator[None]:
    """The chart's ValidatingAdmissionPolicy, as `helm install` makes it."""
    from support import ROOT, helm

    policy = helm(cluster, "template", "qlp", str(ROOT / "charts" / "disttrain-operator"),
                  "--show-only", "templates/queue-label-policy.yaml")
    cluster.apply(policy)
    yield
    cluster.kubectl("delete", "-f", "-", input=policy, check=False)


def test_the_queue_label_changes_only_while_a_job_waits_or_is_suspended(cluster: Cluster, queue_ns: str,
                                                                       queue_label_policy: None) -> None:
    """Issue 21, defect 7: the label added to a running job left its pods running without a
    Workload; removed from an admitted one, its quota was never released. The chart's policy
    refuses both, in words that say what to do, and allows the change while the job is queued or
    suspended (as Kueue's own integrations have it)."""
    cluster.apply(tf_job("free", None, worker=replica(1)), queue_ns)
    cluster.wait_phase(queue_ns, "free", "Running")

    def label(value: str, *dry_run: str) -> Any:
        return cluster.kubectl("label", "--overwrite", "dtj", "free", "-n", queue_ns,
                               f"kueue.x-k8s.io/queue-name={value}", *dry_run, check=False)

    # A new policy takes a moment to reach the API server's admission: tried without a write until then.
    wait_for(lambda: label("gpus", "--dry-run=server").returncode != 0, 30, "the policy in force")
    refused = label("gpus")
    assert refused.returncode != 0, "refused for real too"
    assert ("metadata.labels[kueue.x-k8s.io/queue-name] can not change while the job is Running (from \"\" to "
            '"gpus"): suspend it') in refused.stderr, refused.stderr
    # Not in the update that suspends it either (issue 43: a preempted job in its checkpoint hold
    # that suspended and dropped the label at once kept its evicted Workload's quota for ever).
    both = cluster.kubectl("patch", "dtj", "free", "-n", queue_ns, "--type=merge", "-p",
                           '{"metadata":{"labels":{"kueue.x-k8s.io/queue-name":"gpus"}},'
                           '"spec":{"runPolicy":{"suspend":true}}}', check=False)
    assert both.returncode != 0 and "suspend it" in both.stderr, both.stderr
    cluster.kubectl("patch", "dtj", "free", "-n", queue_ns, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":true}}}')
    cluster.wait_phase(queue_ns, "free", "Suspended")
    assert label("gpus").returncode == 0, "suspended: it may join a queue"
    cluster.kubectl("label", "dtj", "free", "-n", queue_ns, "kueue.x-k8s.io/queue-name-")  # and leave it


def test_a_job_without_the_label_is_left_to_the_scheduler(cluster: Cluster, queue_ns: str) -> None:
    cluster.apply(tf_job("free", None, worker=replica(1)), queue_ns)
    cluster.wait_phase(queue_ns, "free", "Running")
    assert not workloads(cluster, queue_ns, "free")


def test_kueues_own_webhooks_admit_the_workloads_the_operator_writes(cluster: Cluster, queue_ns: str) -> None:
    """The API server calls Kueue's mutating and validating Workload webhooks for our writes, and
    neither refuses one: the Workloads are what Kueue itself would accept from its own jobs."""
    setup_queue(cluster, queue_ns, gpus=8)
    cluster.apply(queued(tf_job("hooked", None, worker=replica(1))), queue_ns)
    cluster.wait_phase(queue_ns, "hooked", "Running", timeout=60)
    calls: dict[tuple[str, str], float] = {}
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_admission_webhook_request_total") and "workload.kb.io" in line:
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            key = (labels["name"].strip('"'), labels["rejected"].strip('"'))
            calls[key] = calls.get(key, 0) + float(line.rsplit(" ", 1)[1])
    assert calls.get(("mworkload.kb.io", "false"), 0) > 0, calls
    assert calls.get(("vworkload.kb.io", "false"), 0) > 0, calls
    assert not [key for key in calls if key[1] == "true"], calls


def test_without_kueue_the_operator_asks_nothing_of_it(tmp_path: Any) -> None:
    """On a cluster that serves no Kueue: jobs run, no error, and not one request for Kueue's objects
    (the Workload watch's 404 and its discovery GET, once a minute, are counted under no group)."""
    from localcluster import LocalCluster
    from support import install_crd

    with LocalCluster(root=tmp_path / "plane", nodes=1, gang_schedulers=False, kueue=False) as plane:
        bare = Cluster(kubeconfig=plane.kubeconfig)
        install_crd(bare)
        operator = OperatorProcess(bare, tmp_path / "operator.log")
        operator.start()
        try:
            job = tf_job("plain", None, worker=replica(1))
            job["metadata"]["labels"] = {"team": "ml"}
            bare.apply(job, "default")
            bare.wait_phase("default", "plain", "Running", timeout=60)
            bare.finish_pod("default", "plain-worker-0", 0)
            bare.wait_phase("default", "plain", "Succeeded")
        finally:
            operator.stop()
        metrics = plane.api_text("/metrics")
        assert not [line for line in metrics.splitlines()
                    if line.startswith("apiserver_request_total") and 'group="kueue.x-k8s.io"' in line]
        log = operator.log()
        assert " ERROR " not in log and "Traceback" not in log, log


def test_an_elastic_job_is_admitted_partly_and_never_scales_past_its_admission(cluster: Cluster,
                                                                               queue_ns: str) -> None:
    """Kueue's partial admission: the worker podSet asks for spec.mpi.worker.replicas with minCount
    minReplicas; quota for two of three workers admits two, and the job runs with them."""
    setup_queue(cluster, queue_ns, gpus=4)
    job = queued(mpi_job("el", workers=3, gpus=2))
    job["spec"]["mpi"]["elastic"] = {"minReplicas": 1, "maxReplicas": 3}
    cluster.apply(job, queue_ns)
    workload = wait_for(lambda: next((w for w in workloads(cluster, queue_ns, "el")
                                      if w.get("status", {}).get("admission")), None), 30, "the Workload admitted")
    worker_set = next(s for s in workload["spec"]["podSets"] if s["name"] == "worker")
    assert (worker_set["count"], worker_set["minCount"]) == (3, 1)
    counts = {a["name"]: a.get("count") for a in workload["status"]["admission"]["podSetAssignments"]}
    assert counts == {"launcher": 1, "worker": 2}, counts
    status = cluster.wait_phase(queue_ns, "el", "Running", timeout=60)
    assert sorted(p.metadata.name for p in pods_of(cluster, queue_ns, "el")) == ["el-launcher", "el-worker-0",
                                                                                "el-worker-1"]
    wait_for(lambda: cluster.job_status(queue_ns, "el").get("elastic", {}).get("workers") == 2, 30, "2 workers")
    assert cluster.job_status(queue_ns, "el")["elastic"]["wantedWorkers"] == 2, status
    # The spec may ask for three; Kueue admitted two, so two it stays.
    cluster.kubectl("scale", "dtj/el", "--replicas=3", "-n", queue_ns)
    time.sleep(2)
    assert len(pods_of(cluster, queue_ns, "el")) == 3
    cluster.finish_pod(queue_ns, "el-launcher", 0)
    cluster.wait_phase(queue_ns, "el", "Succeeded")


def test_an_admitted_elastic_job_scaled_down_gives_its_quota_back(cluster: Cluster, queue_ns: str) -> None:
    """Issue 31: an admitted elastic job scaled down kept all its quota until it ended, and a job
    waiting on that quota waited with it. Once the leaving workers are gone the operator lowers the
    Workload's worker count in place (Kueue KEP-77; its webhook allows a smaller count on an admitted
    Workload), Kueue counts the smaller, and the waiting job is admitted."""
    setup_queue(cluster, queue_ns, gpus=8)
    big = queued(mpi_job("big", workers=4, gpus=2))
    big["spec"]["mpi"]["elastic"] = {"minReplicas": 1, "maxReplicas": 4, "scaleDownDelaySeconds": 1}
    cluster.apply(big, queue_ns)
    cluster.wait_phase(queue_ns, "big", "Running", timeout=60)
    cluster.apply(queued(mpi_job("waiting", workers=1, gpus=4)), queue_ns)
    wait_for(lambda: cluster.job_status(queue_ns, "waiting").get("phase") == "Queued", 30, "the second job queued")
    time.sleep(3)
    assert not admitted(cluster, queue_ns, "waiting"), "8 GPUs held by the first"
    cluster.kubectl("scale", "dtj/big", "--replicas=2", "-n", queue_ns)
    wait_for(lambda: admitted(cluster, queue_ns, "waiting"), 60, "the waiting job admitted on the quota given back")
    [workload] = workloads(cluster, queue_ns, "big")
    assert {s["name"]: s["count"] for s in workload["spec"]["podSets"]} == {"launcher": 1, "worker": 2}
    status = cluster.job_status(queue_ns, "big")
    assert (status["phase"], status["restarts"]) == ("Running", 0), "scaled down in place, no restart"
    cluster.wait_phase(queue_ns, "waiting", "Running", timeout=60)


def test_a_job_moved_to_another_queue_while_it_waits_is_admitted_there(cluster: Cluster, queue_ns: str) -> None:
    """Issue 31: the Workload's queueName was written only when it was made: a job relabelled while
    it waited stayed in the old queue for ever, its message naming the new one. As Kueue's own
    integrations do (QueueNameChange), the Workload follows the label while it has no quota."""
    setup_queue(cluster, queue_ns, gpus=8)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "nowhere",
                                                                              "namespace": queue_ns},
        "spec": {"clusterQueue": f"cq-missing-{queue_ns}"}}))  # a ClusterQueue that doesn't exist: never admits
    job = eight_gpu_job("moved")
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "nowhere"
    cluster.apply(job, queue_ns)
    wait_for(lambda: workloads(cluster, queue_ns, "moved"), 30, "its Workload")
    time.sleep(3)
    assert not admitted(cluster, queue_ns, "moved")
    cluster.kubectl("label", "--overwrite", "dtj", "moved", "-n", queue_ns, "kueue.x-k8s.io/queue-name=gpus")
    wait_for(lambda: admitted(cluster, queue_ns, "moved"), 60, "admitted in the queue it was moved to")
    assert workloads(cluster, queue_ns, "moved")[0]["spec"]["queueName"] == "gpus"
    cluster.wait_phase(queue_ns, "moved", "Running", timeout=60)
