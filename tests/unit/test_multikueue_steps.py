"""MultiKueue, decided purely: on the manager a job with `spec.managedBy: kueue.x-k8s.io/multikueue`
gets its Workload and no pod, and its status is written only while it waits there; on the worker
its copy adopts the Workload MultiKueue made for it and never makes one."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from disttrain.api.objects import JobRef
from disttrain.api.parse import parse_spec
from disttrain.decide import queueing
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan
from disttrain.decide.queueing import ObservedWorkload, QueueState, observe_workload
from disttrain.decide.reconcile import reconcile
from manifests import replica, tf_job

REF = JobRef("mnist", "ml", "uid-1")
NOW = datetime.datetime(2026, 11, 25, 12, 0, 0, tzinfo=datetime.UTC)
MANAGED = tf_job("mnist", None, worker=replica(2, gpus=4))
MANAGED["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
SPEC = parse_spec(MANAGED["spec"])
LOCAL = parse_spec(tf_job("mnist", None, worker=replica(2, gpus=4))["spec"])
# What the worker's operator wrote, as Kueue copied it onto the manager's job.
WORKERS = {"phase": "Running", "reason": "AllPodsRunning", "message": "all 2 pods are running", "ready": "2/2",
           "restarts": 1, "operatorRestarts": 0, "replicaStatuses": {"worker": {"active": 2, "ready": 2}},
           "observedGeneration": 1, "framework": "tensorflow"}


def workload(*conditions: tuple[str, bool, str], owner: str = "uid-1", checks: dict[str, Any] | None = None,
             cluster: str = "") -> ObservedWorkload:
    return ObservedWorkload(
        name=queueing.workload_name(REF), uid="wl-uid", owner_uid=owner,
        podsets_hash=queueing.podsets_hash(queueing.pod_sets(SPEC)), active=True,
        conditions={t: {"type": t, "status": "True" if s else "False", "message": m} for t, s, m in conditions},
        assignments={"worker": {"nvidia.com/gpu": "default"}}, resource_version="9", cluster_queue="cq",
        checks=checks or {}, cluster_name=cluster)


def manager(status: dict[str, Any] | None = None, wl: ObservedWorkload | None = None, queue: str | None = "gpus",
            spec: Any = SPEC) -> Plan:
    state = QueueState(queue, wl) if queue else None
    return reconcile(JobState(REF, 1, spec, dict(status or {}), queue=state), [], NOW)


def test_the_manager_queues_its_workload_and_makes_no_pod() -> None:
    plan = manager()
    assert [op.verb for op in plan.workload] == ["create"] and not plan.create
    assert plan.status["phase"] == "Queued"
    assert plan.workload[0].body["spec"]["podSets"][0]["count"] == 2


def test_while_multikueue_looks_for_a_worker_the_reason_is_its_admission_checks() -> None:
    wl = workload(("QuotaReserved", True, "Quota reserved in ClusterQueue cq"),
                  checks={"multikueue": ("Pending", 'The workload got reservation on "worker-1"')})
    plan = manager({"phase": "Queued", "reason": "Queued"}, wl)
    assert plan.status["message"] == (f"queued in LocalQueue gpus: Workload {wl.name} has quota in ClusterQueue cq; "
                                      f'admission check multikueue Pending: The workload got reservation on "worker-1"')


def test_dispatch_is_said_once_then_the_workers_status_is_left_as_kueue_copied_it() -> None:
    wl = workload(("QuotaReserved", True, ""), ("Admitted", True, ""), cluster="worker-1",
                  checks={"multikueue": ("Ready", "")})
    plan = manager({"phase": "Queued", "reason": "Queued"}, wl)
    assert plan.status["phase"] == "Pending" and plan.status["message"].endswith(
        "and MultiKueue dispatched it to worker cluster worker-1")
    assert not plan.create and not plan.workload
    again = manager(WORKERS, wl)
    assert again.status == WORKERS, "no count of the manager's (it has no pod) over the worker's"
    assert not again.events
    # PodsReady off the copied counts, as Kueue's integrations do on a manager (waitForPodsReady).
    assert [(op.verb, op.body["type"], op.body["status"]) for op in again.workload] == [
        ("condition", "PodsReady", "True")]
    lost_one = {**WORKERS, "replicaStatuses": {"worker": {"active": 2, "ready": 1}}}
    ready = dataclasses.replace(wl, conditions={**wl.conditions, "PodsReady": {"type": "PodsReady", "status": "True",
                                                                               "reason": "Started"}})
    assert [(op.body["status"], op.body["reason"]) for op in manager(lost_one, ready).workload] == [
        ("False", "WaitForRecovery")]


def test_a_finished_copy_is_left_alone() -> None:
    done = {**WORKERS, "phase": "Succeeded", "completionTime": "2026-11-25T11:00:00Z"}
    wl = workload(("Admitted", True, ""), ("Finished", True, ""))
    plan = manager(done, wl)
    assert plan.status == done and not plan.workload


def test_a_lost_worker_evicts_the_workload_and_the_job_waits_for_another() -> None:
    wl = workload(("QuotaReserved", True, ""), ("Admitted", False, ""),
                  ("Evicted", True, 'Workload evicted on worker cluster: "worker-1", resetting for re-admission'))
    wl = dataclasses.replace(wl, cluster_name="worker-1")
    plan = manager(WORKERS, wl)
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == "Evicted"
    assert "from worker cluster worker-1" in plan.status["message"]
    assert plan.status["ready"] == "0/2", "the lost worker's counts are not kept"
    assert [op.verb for op in plan.workload] == ["release"], "no pod here: the quota goes back at once"


def test_suspend_deactivates_it_and_resume_queues_it_again() -> None:
    suspended = dataclasses.replace(SPEC, run_policy=dataclasses.replace(SPEC.run_policy, suspend=True))
    wl = workload(("QuotaReserved", True, ""), ("Admitted", True, ""))
    plan = manager(WORKERS, wl, spec=suspended)
    assert plan.status["phase"] == "Suspended"
    assert [(op.verb, op.body) for op in plan.workload] == [("active", {"active": False})]


def test_without_the_queue_label_it_fails_naming_the_field() -> None:
    plan = manager(queue=None)
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "InvalidSpec"
    assert plan.status["message"].startswith("spec.managedBy: kueue.x-k8s.io/multikueue dispatches a queued job's")
    assert plan.events[0].type == "Warning"


def test_another_controllers_job_is_not_touched() -> None:
    spec = dataclasses.replace(SPEC, managed_by="example.com/other")
    plan = manager({"phase": "Running", "ready": "1/2"}, spec=spec, queue=None)
    assert plan.status == {"phase": "Running", "ready": "1/2"}
    assert not plan.create and not plan.workload and not plan.events and not plan.delete


def worker(wl: ObservedWorkload | None, status: dict[str, Any] | None = None) -> Plan:
    state = QueueState("gpus", wl, {"default": queueing.Flavor()} if wl else {}, prebuilt=queueing.workload_name(REF))
    return reconcile(JobState(REF, 1, LOCAL, dict(status or {}), queue=state), [], NOW)


def test_the_workers_copy_adopts_the_prebuilt_workload_and_makes_none() -> None:
    assert not worker(None).workload, "MultiKueue makes it before the job: waited for"
    assert "which MultiKueue makes before the job" in worker(None).status["message"]
    orphan = workload(("QuotaReserved", True, ""), ("Admitted", True, ""), owner="")
    plan = worker(orphan)
    assert [op.verb for op in plan.workload] == ["adopt"] and not plan.create
    assert plan.workload[0].body == {"metadata": {
        "ownerReferences": [{"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "name": "mnist",
                             "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}],
        "labels": {"kueue.x-k8s.io/job-uid": "uid-1"}, "resourceVersion": "9"}}
    owned = workload(("QuotaReserved", True, ""), ("Admitted", True, ""))
    started = worker(owned, plan.status)
    assert sorted(o["metadata"]["name"] for o in started.create if o["kind"] == "Pod") == [
        "mnist-worker-0", "mnist-worker-1"]


def test_a_prebuilt_workload_another_object_controls_is_not_taken() -> None:
    plan = worker(workload(("Admitted", True, ""), owner="someone-else"))
    assert not plan.workload and not plan.create
    assert "is controlled by another object" in plan.status["message"]


def test_a_prebuilt_workload_out_of_sync_is_finished_not_replaced() -> None:
    stale = dataclasses.replace(workload(("QuotaReserved", False, "")), podsets_hash="other")
    plan = worker(stale, {"phase": "Queued", "reason": "Queued"})
    assert [(op.verb, op.body.get("reason")) for op in plan.workload] == [("condition", "OutOfSync")]


def test_a_workload_is_read_with_its_checks_and_worker_cluster() -> None:
    seen = observe_workload({"metadata": {"name": "w"}, "status": {
        "clusterName": "worker-1", "admissionChecks": [{"name": "multikueue", "state": "Ready", "message": "ok"}]}})
    assert seen.cluster_name == "worker-1" and seen.checks == {"multikueue": ("Ready", "ok")}
    assert queueing.prebuilt_workload({}, {"kueue.x-k8s.io/prebuilt-workload-name": "w"}) == "w"
    assert queueing.prebuilt_workload({"kueue.x-k8s.io/prebuilt-workload-name": "old"}, {}) == "old"


def test_pods_left_without_their_prebuilt_workload_are_stopped() -> None:
    from disttrain.api.observed import ObservedPod

    running = [ObservedPod(name=f"mnist-worker-{i}", uid=f"u{i}", owner_uid="uid-1", replica_type="worker", index=i,
                           phase="Running", ready=True, terminating=False, exit_code=None, reason=None,
                           container_restarts=0, scheduled=True) for i in range(2)]
    state = QueueState("gpus", None, prebuilt=queueing.workload_name(REF))
    plan = reconcile(JobState(REF, 1, LOCAL, dict(WORKERS), queue=state), running, NOW)
    assert sorted(p.name for p in plan.delete) == ["mnist-worker-0", "mnist-worker-1"]
    assert plan.status["phase"] == "Queued" and not plan.workload


def test_a_workload_finished_without_a_copied_verdict_fails_the_managers_job() -> None:
    """Issue 31: Kueue finishes the manager's Workload when the worker's finishes; with no verdict
    copied (an elastic Workload's remote OutOfSync, a Workload finished by hand) the job stayed
    Queued for ever, as nothing runs a finished Workload again."""
    wl = workload(("QuotaReserved", True, ""), ("Admitted", True, ""),
                  ("Finished", True, "The prebuilt workload is out of sync with its user job"))
    wl = dataclasses.replace(wl, conditions={**wl.conditions, "Finished": {**wl.conditions["Finished"],
                                                                           "reason": "OutOfSync"}})
    plan = manager({"phase": "Queued", "reason": "Queued"}, wl)
    assert (plan.status["phase"], plan.status["reason"]) == ("Failed", "WorkloadFinished")
    assert plan.status["message"] == (
        f"Kueue finished Workload {wl.name} (OutOfSync: The prebuilt workload is out of sync with its user job) "
        f"before the job had a verdict from its worker cluster: it is not dispatched again")


def test_pods_ready_on_the_manager_counts_what_kueue_admitted_not_the_spec() -> None:
    """Issue 31: a partially admitted elastic job (3 of 4 workers) never reached spec's 5 pods, so its
    PodsReady never went True and a manager's waitForPodsReady evicted it in a loop."""
    from manifests import mpi_job

    job = mpi_job("mnist", workers=4, gpus=0)
    job["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    job["spec"]["mpi"]["elastic"] = {"minReplicas": 2, "maxReplicas": 4}
    spec = parse_spec(job["spec"])
    wl = observe_workload({
        "metadata": {"name": queueing.workload_name(REF), "uid": "wl", "resourceVersion": "9",
                     "annotations": {queueing.PODSETS_HASH: queueing.podsets_hash(queueing.pod_sets(spec))},
                     "ownerReferences": [{"uid": "uid-1", "controller": True}]},
        "spec": {"active": True, "queueName": "gpus", "podSets": [{"name": "launcher", "count": 1},
                                                                  {"name": "worker", "count": 4}]},
        "status": {"clusterName": "worker-1", "conditions": [
            {"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "launcher", "count": 1, "flavors": {}}, {"name": "worker", "count": 3, "flavors": {}}]}}})
    copied = {**WORKERS, "replicaStatuses": {"launcher": {"active": 1, "ready": 1},
                                             "worker": {"active": 3, "ready": 3}}}
    plan = manager(copied, wl, spec=spec)
    assert [(op.body["type"], op.body["status"]) for op in plan.workload] == [("PodsReady", "True")]


def test_ttl_leaves_another_controllers_job_alone() -> None:
    """Issue 31: docs/api.md says nothing of a job another controller manages is touched; its
    ttlSecondsAfterFinished deleted it all the same."""
    job = tf_job("mnist", {"ttlSecondsAfterFinished": 0}, worker=replica(2))
    job["spec"]["managedBy"] = "example.com/other"
    done = {"phase": "Succeeded", "completionTime": "2026-11-25T11:00:00Z"}
    plan = manager(done, spec=parse_spec(job["spec"]), queue=None)
    assert not plan.delete_job
