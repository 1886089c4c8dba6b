"""MultiKueue on two real planes: the session's plane is the manager, a second one (its own etcd,
API server, scheduler, KWOK nodes, Kueue and operator) the worker.

A DistTrainJob applied on the manager with `spec.managedBy: kueue.x-k8s.io/multikueue` and the
queue label is queued there; Kueue's MultiKueue (v0.19.2, its generic adapter for external kinds)
copies its Workload to the worker, and once the worker admits it, creates the job there. The
worker's operator runs it under that Workload; Kueue copies the worker's status back whole.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from manifests import mpi_job, replica, tf_job
from support import (
    ROOT,
    Cluster,
    OperatorProcess,
    chart_identity,
    install_crd,
    record_timing,
    wait_for,
    wait_namespace_ready,
)

pytestmark = pytest.mark.usefixtures("operator")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
WORKER = "worker-1"  # the MultiKueueCluster


def kueue_objects(flavor_nodes: dict[str, str], check: str | None, ns: str) -> list[dict[str, Any]]:
    """A flavor, a ClusterQueue (with MultiKueue's admission check on the manager) and the LocalQueue."""
    queue_spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
            {"name": f"mk-{ns}", "resources": [{"name": "cpu", "nominalQuota": "100"},
                                               {"name": "memory", "nominalQuota": "1Ti"},
                                               {"name": "nvidia.com/gpu", "nominalQuota": "16"}]}]}]}
    if check:
        queue_spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": f"mk-{ns}"},
         "spec": {"nodeLabels": flavor_nodes} if flavor_nodes else {}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"mk-{ns}"},
         "spec": queue_spec},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": ns},
         "spec": {"clusterQueue": f"mk-{ns}"}},
    ]


def apply_all(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def condition(obj: dict[str, Any], ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


@pytest.fixture(scope="module")
def worker(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The worker plane with its own operator, connected to the manager's MultiKueue."""
    if cluster.local is None or "kueue.x-k8s.io/v1beta2" not in cluster.kubectl("api-versions").stdout.split():
        pytest.skip("MultiKueue needs the local plane with Kueue (a second plane is started beside it)")
    from localcluster import LocalCluster

    started = time.monotonic()
    local = LocalCluster(root=ROOT / ".cache" / "test-worker", nodes=2, gang_schedulers=False)
    with local:
        plane = Cluster(kubeconfig=local.kubeconfig, local=local)
        install_crd(plane)
        tmp = tmp_path_factory.mktemp("worker-operator")
        operator = OperatorProcess(chart_identity(plane, tmp), tmp / "operator.log")
        operator.start()
        record_timing("multikueue", "the worker plane up (etcd, API server, Kueue, operator)",
                      time.monotonic() - started)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WORKER, "namespace": "kueue-system"},
                  "data": {"kubeconfig": base64.b64encode(local.kubeconfig.read_bytes()).decode()}}
        apply_all(cluster, [
            secret,
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster", "metadata": {"name": WORKER},
             "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": WORKER}}}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueConfig", "metadata": {"name": "disttrain"},
             "spec": {"clusters": [WORKER]}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": "multikueue"},
             "spec": {"controllerName": MULTIKUEUE, "parameters": {
                 "apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": "disttrain"}}},
        ])
        wait_for(lambda: condition(cluster.custom.get_cluster_custom_object(*KUEUE, "multikueueclusters", WORKER),
                                   "Active"), 60, "the MultiKueueCluster Active (the manager reaches the worker)")
        try:
            yield plane
        finally:
            operator.stop()
            for kind, name in (("admissioncheck", "multikueue"), ("multikueueconfig", "disttrain"),
                               ("multikueuecluster", WORKER)):
                cluster.kubectl("delete", kind, name, "--wait=false", check=False)
            said = [line for line in operator.log().splitlines() if "disttrain.control.telling" in line]
            print("\n--- what the worker's operator said ---\n" + "\n".join(said[-30:]))


@pytest.fixture
def mk_ns(cluster: Cluster, worker: Cluster, namespace: str) -> Iterator[str]:
    """The test's namespace on both planes, each with its queues (MultiKueue's contract: the same
    namespace and LocalQueue on the worker)."""
    worker.core.create_namespace({"metadata": {"name": namespace}})
    wait_namespace_ready(worker, namespace)
    apply_all(worker, kueue_objects({}, None, namespace))
    apply_all(cluster, kueue_objects({}, "multikueue", namespace))
    def active() -> bool:
        return all(condition(c.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", f"mk-{namespace}"), "Active")
                   for c in (cluster, worker))
    wait_for(active, 30, "both ClusterQueues active")
    yield namespace
    for plane in (cluster, worker):
        plane.kubectl("delete", "dtj", "--all", "-n", namespace, "--wait=false", check=False)
        plane.kubectl("delete", "clusterqueue", f"mk-{namespace}", "--wait=false", check=False)
        plane.kubectl("delete", "resourceflavor", f"mk-{namespace}", "--wait=false", check=False)
    worker.core.delete_namespace(namespace)


def dispatched(job: dict[str, Any]) -> dict[str, Any]:
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpus"}
    job["spec"]["managedBy"] = MULTIKUEUE
    return job


def exists(cluster: Cluster, ns: str, name: str) -> bool:
    return bool(cluster.kubectl("get", "dtj", name, "-n", ns, "--ignore-not-found", "-o", "name").stdout.strip())


def side_by_side(manager: Cluster, worker: Cluster, ns: str, when: str) -> str:
    text = f"\n--- {when} ---\n"
    for title, plane in (("manager", manager), ("worker", worker)):
        listed = plane.kubectl("get", "dtj", "-n", ns)
        text += f"[{title}] $ kubectl get dtj -n {ns}\n{listed.stdout or listed.stderr}"
    print(text)
    return text


def run_to_success(cluster: Cluster, worker: Cluster, ns: str, job: dict[str, Any], decider: str,
                   pods: int) -> None:
    name = job["metadata"]["name"]
    started = time.monotonic()
    cluster.apply(dispatched(job), ns)
    wait_for(lambda: exists(worker, ns, name), 60, f"{name} copied to the worker")
    record_timing("multikueue", f"apply on the manager -> the job on the worker: {name}", time.monotonic() - started)
    copy = worker.job(ns, name)
    assert "managedBy" not in copy["spec"], "MultiKueue removes managedBy from the worker's copy"
    wait_for(lambda: len([p for p in worker.pods(ns, f"disttrain.dev/job-name={name}")
                          if p.status.phase == "Running"]) == pods, 60, f"{name}'s {pods} pods running on the worker")
    cluster.wait_phase(ns, name, "Running", timeout=60)
    record_timing("multikueue", f"apply -> Running on the manager (the worker's status copied): {name}",
                  time.monotonic() - started)
    assert not cluster.pods(ns), "no pod on the manager"
    manager_status, worker_status = cluster.job_status(ns, name), worker.job_status(ns, name)
    assert manager_status["ready"] == worker_status["ready"] == f"{pods}/{pods}"
    side_by_side(cluster, worker, ns, f"{name} running")
    prebuilt = copy["metadata"]["annotations"]["kueue.x-k8s.io/prebuilt-workload-name"]
    workload = worker.custom.get_namespaced_custom_object(*KUEUE, ns, "workloads", prebuilt)
    assert workload["metadata"]["ownerReferences"][0]["uid"] == copy["metadata"]["uid"], "the worker's job adopted it"
    worker.finish_pod(ns, decider, 0)
    seen: dict[str, Any] = {}

    def succeeded() -> dict[str, Any] | None:
        # The worker's copy is deleted once the manager's Workload is Finished (Kueue's contract):
        # its last status is kept as seen.
        if exists(worker, ns, name):
            seen.update(worker=worker.job_status(ns, name))
            if seen["worker"].get("phase") == "Succeeded" and "table" not in seen:
                seen["table"] = side_by_side(cluster, worker, ns, f"{name} succeeded")
        manager = cluster.job_status(ns, name)
        return manager if manager.get("phase") == "Succeeded" else None
    status = wait_for(succeeded, 60, f"{name} Succeeded on the manager", interval=0.05)
    assert seen["worker"]["phase"] == "Succeeded" and status["message"] == seen["worker"]["message"]
    wait_for(lambda: all(condition(w, "Finished") for w in cluster.custom.list_namespaced_custom_object(
        *KUEUE, ns, "workloads")["items"]), 30, "the manager's Workload Finished")
    wait_for(lambda: not exists(worker, ns, name), 30, "MultiKueue deletes the worker's copy once it is Finished")
    side_by_side(cluster, worker, ns, f"{name} succeeded, its worker copy deleted by MultiKueue")


def test_a_tensorflow_job_runs_on_the_worker_and_its_status_follows(cluster: Cluster, worker: Cluster,
                                                                   mk_ns: str) -> None:
    run_to_success(cluster, worker, mk_ns, tf_job("mk-tf", worker=replica(2, gpus=4, cpu="1")), "mk-tf-worker-0", 2)


def test_an_mpi_job_runs_on_the_worker(cluster: Cluster, worker: Cluster, mk_ns: str) -> None:
    run_to_success(cluster, worker, mk_ns, mpi_job("mk-hvd", workers=2, gpus=2), "mk-hvd-launcher", 3)


def test_deleting_it_on_the_manager_removes_it_from_the_worker(cluster: Cluster, worker: Cluster,
                                                               mk_ns: str) -> None:
    cluster.apply(dispatched(tf_job("mk-del", worker=replica(1, gpus=1))), mk_ns)
    wait_for(lambda: worker.pods(mk_ns, "disttrain.dev/job-name=mk-del"), 60, "its pod on the worker")
    cluster.kubectl("delete", "dtj", "mk-del", "-n", mk_ns)
    wait_for(lambda: not exists(worker, mk_ns, "mk-del"), 60, "the worker's copy deleted")
    wait_for(lambda: not [p for p in worker.pods(mk_ns) if not p.metadata.deletion_timestamp], 60,
             "its pods gone from the worker")


def test_without_the_queue_label_it_fails_naming_the_field(cluster: Cluster, worker: Cluster, mk_ns: str) -> None:
    job = tf_job("mk-nolabel", worker=replica(1))
    job["spec"]["managedBy"] = MULTIKUEUE
    cluster.apply(job, mk_ns)
    status = cluster.wait_phase(mk_ns, "mk-nolabel", "Failed")
    assert status["message"].startswith("spec.managedBy: kueue.x-k8s.io/multikueue dispatches a queued job's")
    assert not cluster.pods(mk_ns)


def test_managed_by_is_immutable_at_apply(cluster: Cluster, worker: Cluster, mk_ns: str) -> None:
    cluster.apply(dispatched(tf_job("mk-imm", worker=replica(1))), mk_ns)
    patch = json.dumps({"spec": {"managedBy": "disttrain.dev/operator"}})
    proc = cluster.kubectl("patch", "dtj", "mk-imm", "-n", mk_ns, "--type=merge", "-p", patch, check=False)
    assert proc.returncode != 0 and "spec.managedBy can't be changed after the job is created" in proc.stderr
    bad = tf_job("mk-bad", worker=replica(1))
    bad["spec"]["managedBy"] = "not a path"
    proc = cluster.apply(bad, mk_ns, check=False)
    assert proc.returncode != 0 and "spec.managedBy must be a domain-prefixed path" in proc.stderr


def test_a_lost_worker_requeues_the_job_on_the_manager(cluster: Cluster, worker: Cluster, mk_ns: str) -> None:
    from kueue import WORKER_LOST_SECONDS

    cluster.apply(dispatched(tf_job("mk-lost", worker=replica(1, gpus=1))), mk_ns)
    cluster.wait_phase(mk_ns, "mk-lost", "Running", timeout=60)
    pid = worker.local.processes["kube-apiserver"]
    os.killpg(pid, signal.SIGTERM)
    worker.local.children["kube-apiserver"].wait()
    lost = time.monotonic()
    try:
        status = wait_for(lambda: (s := cluster.job_status(mk_ns, "mk-lost")).get("phase") == "Queued" and s,
                          WORKER_LOST_SECONDS + 90, "the job requeued on the manager")
        record_timing("multikueue", "worker API server stopped -> the job Queued on the manager",
                      time.monotonic() - lost)
        print(f"\n[manager] after the worker was lost: {status['reason']}: {status['message']}")
        print(cluster.kubectl("get", "dtj", "-n", mk_ns).stdout)
        assert status["reason"] == "Evicted" and status["ready"] == "0/1", status
        # The eviction's words are its event's; the message then follows Kueue's while it waits (its
        # ClusterQueue inactive while MultiKueue has no worker connected).
        evicted = cluster.wait_event(mk_ns, "mk-lost", lambda e: e.reason == "Evicted", "the Evicted event")
        print(f"[manager] event: {evicted.type} {evicted.reason}: {evicted.message}")
        assert "AdmissionCheck" in evicted.message and "remote lost" in evicted.message, evicted.message
    finally:
        # The worker back (its API server ready), for the module's teardown. MultiKueue dispatches the
        # job to it again once the evicted Workload's requeue backoff (60 s) and its own reconnect
        # backoff have passed; not awaited here: the worker's copy is made anew and waits for the old
        # copy's pods to be garbage-collected, which the worker's controller-manager does in its own
        # time after an API server restart, while both planes' waitForPodsReady (30 s) may evict it
        # meanwhile (seen once in a clean-clone run: two evictions, the next try 120 s later).
        worker.local.spawn("kube-apiserver", worker.local.argv["kube-apiserver"], append=True)
        wait_for(lambda: worker.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 60,
                 "the worker's API server ready again")
