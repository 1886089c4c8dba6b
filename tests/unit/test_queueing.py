"""Kueue: the Workload a queued job gets, how its admission lands on the pods, and the job's life
in a queue (held, admitted, evicted without a restart, finished, suspended, changed while queued);
and why a job waits, from its pods alone."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod, observe_pod
from disttrain.api.parse import parse_spec
from disttrain.api.spec import JobSpec
from disttrain.decide import queueing
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan
from disttrain.decide.queueing import Flavor, ObservedWorkload, QueueState
from disttrain.decide.reconcile import reconcile
from manifests import mpi_job, replica, tf_job

REF = JobRef("mnist", "ml", "uid-1")
NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
SPEC = parse_spec(tf_job("mnist", None, chief=replica(1, cpu="1"), worker=replica(2, gpus=4))["spec"])
FLAVORS = {"a100": Flavor({"gpu-type": "a100"}, [{"key": "nvidia.com/gpu", "operator": "Exists"}])}


def workload(*conditions: tuple[str, bool, str, str], spec: JobSpec = SPEC, active: bool = True,
             owner: str = "uid-1") -> ObservedWorkload:
    sets = queueing.pod_sets(spec)
    return ObservedWorkload(
        name=queueing.workload_name(REF), uid="wl-uid", owner_uid=owner, podsets_hash=queueing.podsets_hash(sets),
        active=active, conditions={t: {"type": t, "status": "True" if s else "False", "reason": r, "message": m}
                                   for t, s, r, m in conditions},
        assignments={s["name"]: {"nvidia.com/gpu": "a100", "cpu": "a100"} for s in sets}, resource_version="7",
        cluster_queue="gpu-cq")


ADMITTED = (("QuotaReserved", True, "QuotaReserved", ""), ("Admitted", True, "Admitted", ""))


def step(status: dict[str, Any] | None = None, wl: ObservedWorkload | None = None,
         pods: list[ObservedPod] | None = None, spec: JobSpec = SPEC) -> Plan:
    state = QueueState("team-gpu", wl, FLAVORS if wl else {})
    return reconcile(JobState(REF, 1, spec, status or {}, queue=state), pods or [], NOW)


def pod(rtype: str, index: int, phase: str = "Running", **extra: Any) -> ObservedPod:
    return ObservedPod(name=f"mnist-{rtype}-{index}", uid=f"u-{rtype}-{index}", owner_uid="uid-1",
                       replica_type=rtype, index=index, phase=phase, ready=phase == "Running", terminating=False,
                       exit_code=None, reason=None, container_restarts=0, scheduled=True, **extra)


def test_the_workload_has_a_pod_set_per_replica_type_and_is_the_jobs() -> None:
    state = QueueState("team-gpu", priority=("high", 1000))
    wl = queueing.desired_workload(REF, SPEC, state)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["metadata"]["name"].startswith("disttrainjob-mnist-") and len(wl["metadata"]["name"]) == 24
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert wl["metadata"]["labels"] == {"disttrain.dev/job-name": "mnist", "kueue.x-k8s.io/job-uid": "uid-1",
                                        "kueue.x-k8s.io/priority-class": "high"}
    assert [(s["name"], s["count"]) for s in wl["spec"]["podSets"]] == [("chief", 1), ("worker", 2)]
    assert wl["spec"]["podSets"][1]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert wl["spec"]["queueName"] == "team-gpu"
    assert wl["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                              "name": "high"}
    assert wl["spec"]["priority"] == 1000


def test_an_mpi_job_is_one_workload_launcher_and_workers_admitted_together() -> None:
    spec = parse_spec(mpi_job("hvd", workers=3, gpus=1)["spec"])
    assert [(s["name"], s["count"]) for s in queueing.pod_sets(spec)] == [("launcher", 1), ("worker", 3)]


def test_a_queued_job_makes_its_workload_and_no_pod() -> None:
    plan = step()
    assert [op.verb for op in plan.workload] == ["create"]
    assert not plan.create
    assert plan.status["phase"] == "Queued" and "startTime" not in plan.status
    assert plan.status["message"].startswith("queued in LocalQueue team-gpu: waiting for Kueue to admit Workload")


def test_a_pending_workload_says_kueues_reason() -> None:
    said = ("couldn't assign flavors to pod set worker: insufficient unused quota for nvidia.com/gpu in flavor a100, "
            "8 more needed")
    plan = step({"phase": "Queued"}, workload(("QuotaReserved", False, "Pending", said)))
    assert plan.status["phase"] == "Queued" and not plan.create and not plan.workload
    assert plan.status["message"] == f"queued in LocalQueue team-gpu: {said}"


def test_admission_starts_the_job_with_the_flavors_node_labels_and_tolerations() -> None:
    plan = step({"phase": "Queued"}, workload(*ADMITTED))
    assert plan.status["phase"] == "Pending" and plan.status["reason"] == "Admitted"
    assert plan.status["message"].endswith("to ClusterQueue gpu-cq") and plan.status["startTime"]
    pods = [o for o in plan.create if o["kind"] == "Pod"]
    assert len(pods) == 3
    assert all(p["spec"]["nodeSelector"] == {"gpu-type": "a100"} for p in pods)
    assert all({"key": "nvidia.com/gpu", "operator": "Exists"} in p["spec"]["tolerations"] for p in pods)


def test_a_template_selector_that_contradicts_the_flavor_fails_the_job() -> None:
    job = tf_job("mnist", None, worker=replica(2, gpus=4))
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["nodeSelector"] = {"gpu-type": "h100"}
    spec = parse_spec(job["spec"])
    plan = step({"phase": "Queued"}, workload(*ADMITTED, spec=spec), spec=spec)
    assert plan.status["phase"] == "Failed" and not [o for o in plan.create if o["kind"] == "Pod"]
    assert plan.status["message"].startswith("spec.tensorflow.worker.template.spec.nodeSelector: the pod "
                                             "template's nodeSelector gpu-type=h100 conflicts")


def test_eviction_stops_the_pods_without_a_restart_then_hands_the_quota_back() -> None:
    evicted = workload(*ADMITTED, ("Evicted", True, "Preempted", "Preempted to accommodate a workload"))
    running = [pod("chief", 0), pod("worker", 0), pod("worker", 1)]
    plan = step({"phase": "Running", "operatorRestarts": 0}, evicted, running)
    assert plan.status["phase"] == "Queued" and plan.status["reason"] == "Evicted"
    assert len(plan.delete) == 3 and plan.status["restarts"] == 0
    assert "Preempted to accommodate" in plan.status["message"] and plan.events[0].type == "Warning"
    assert not [op for op in plan.workload if op.verb == "release"], "not while pods remain"
    gone = step(plan.status, evicted, [])
    [release] = [op for op in gone.workload if op.verb == "release"]
    assert release.resource_version == "7" and release.body["admission"] is None
    conditions = {c["type"]: (c["status"], c["reason"]) for c in release.body["conditions"]}
    assert conditions["Requeued"] == ("True", "Preempted")
    assert conditions["QuotaReserved"] == ("False", "Pending") and conditions["Admitted"] == ("False", "NoReservation")


def test_pods_ready_then_finished_are_reported() -> None:
    running = [pod("chief", 0), pod("worker", 0), pod("worker", 1)]
    plan = step({"phase": "Running"}, workload(*ADMITTED), running)
    assert [(op.verb, op.body["type"]) for op in plan.workload] == [("condition", "PodsReady")]
    ready = workload(*ADMITTED, ("PodsReady", True, "Started", ""))
    done = step({"phase": "Running"}, ready, [pod("chief", 0, "Succeeded"), *running[1:]])
    assert done.status["phase"] == "Succeeded"
    assert [(op.verb, op.body["type"], op.body["reason"]) for op in done.workload] == [
        ("condition", "Finished", "Succeeded")]


def test_suspend_deactivates_the_workload_and_resume_activates_it() -> None:
    job = tf_job("mnist", {"suspend": True}, chief=replica(1, cpu="1"), worker=replica(2, gpus=4))
    spec = parse_spec(job["spec"])
    plan = step({"phase": "Running"}, workload(*ADMITTED, spec=spec), [pod("worker", 0)], spec=spec)
    assert plan.status["phase"] == "Suspended"
    assert [(op.verb, op.body) for op in plan.workload] == [("active", {"active": False})]
    resumed = step(plan.status, workload(spec=SPEC, active=False))
    assert ("active", {"active": True}) in [(op.verb, op.body) for op in resumed.workload]


def test_a_job_changed_while_queued_replaces_its_workload() -> None:
    old = dataclasses.replace(workload(("QuotaReserved", False, "Pending", "")), podsets_hash="from-before")
    plan = step({"phase": "Queued"}, old)
    assert [(op.verb, op.name) for op in plan.workload] == [("delete", old.name)]
    assert "changed while it was queued" in plan.status["message"]


def test_an_earlier_jobs_workload_is_not_this_ones() -> None:
    plan = step({"phase": "Queued"}, workload(*ADMITTED, owner="uid-old"))
    assert [op.verb for op in plan.workload] == ["create"]


# -- why a job waits, from its pods -------------------------------------------------------------


def pending_job(pods: list[ObservedPod]) -> Plan:
    return reconcile(JobState(REF, 1, SPEC, {"phase": "Pending"}), pods, NOW)


def test_an_unschedulable_pod_is_said_in_the_schedulers_words() -> None:
    stuck = dataclasses.replace(pod("worker", 1, "Pending"), scheduled=False,
                                unschedulable="0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
    plan = pending_job([pod("chief", 0), pod("worker", 0), stuck])
    assert plan.status["reason"] == "Unschedulable"
    assert plan.status["message"] == ("pod mnist-worker-1 can't be scheduled: 0/4 nodes are available: "
                                      "4 Insufficient nvidia.com/gpu.")


def waiting_container(image: str, reason: str, message: str) -> ObservedPod:
    """mnist-worker-0, bound, its container waiting for `reason` as the kubelet reports it."""
    return observe_pod({
        "metadata": {"name": "mnist-worker-0", "uid": "u", "labels": {"disttrain.dev/replica-type": "worker"},
                     "ownerReferences": [{"kind": "DistTrainJob", "uid": "uid-1", "controller": True}]},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "tf", "image": image, "state": {
            "waiting": {"reason": reason, "message": message}}}]}})


@pytest.mark.parametrize(("image", "kubelet_reason", "kubelet_message", "reason"), [
    ("tf:nope", "ImagePullBackOff", 'Back-off pulling image "tf:nope"', "ImagePullBackOff"),
    ("tf:2.21", "CreateContainerConfigError", 'secret "s3-keys" not found', "ContainerNotStarting"),
])
def test_a_container_that_cant_start_is_said_in_the_kubelets_words(image: str, kubelet_reason: str,
                                                                    kubelet_message: str, reason: str) -> None:
    plan = pending_job([waiting_container(image, kubelet_reason, kubelet_message)])
    assert plan.status["reason"] == reason
    assert plan.status["message"] == f"pod mnist-worker-0: {kubelet_reason}: container tf: {kubelet_message}"


def test_a_crash_loop_in_a_running_job_is_said_and_unsaid() -> None:
    healthy = [pod("chief", 0), pod("worker", 0), pod("worker", 1)]
    crashing = dataclasses.replace(healthy[2], ready=False, stuck="CrashLoopBackOff: container tf: back-off 20s")
    status = {"phase": "Running", "reason": "AllPodsRunning", "message": "all 3 pods are running"}
    plan = reconcile(JobState(REF, 1, SPEC, status), [*healthy[:2], crashing], NOW)
    assert plan.status["phase"] == "Running" and plan.status["reason"] == "CrashLoopBackOff"
    recovered = reconcile(JobState(REF, 1, SPEC, plan.status), healthy, NOW)
    assert (recovered.status["reason"], recovered.status["message"]) == ("AllPodsRunning", "all 3 pods are running")


def test_the_queued_condition_follows_kueues_reason() -> None:
    first = step()
    said = "couldn't assign flavors to pod set worker: insufficient unused quota for nvidia.com/gpu in flavor a100"
    later = step(first.status, workload(("QuotaReserved", False, "Pending", said)))
    queued = next(c for c in later.status["conditions"] if c["type"] == "Queued")
    assert queued["status"] == "True" and queued["message"] == later.status["message"] == \
        f"queued in LocalQueue team-gpu: {said}"


def pods_ready_ops(plan: Plan) -> list[tuple[str, str]]:
    return [(op.body["status"], op.body["reason"]) for op in plan.workload
            if op.verb == "condition" and op.body["type"] == "PodsReady"]


def test_pods_ready_goes_false_as_kueues_job_framework_sets_it() -> None:
    """Issue 21, defect 8: PodsReady was only ever set True, so after a pod failed, a whole-job
    restart or an eviction it stayed True and Kueue's waitForPodsReady timeout and recovery never
    fired. Now the condition follows jobframework's generatePodsReadyCondition (Kueue v0.19.2)."""
    running = [pod("chief", 0), pod("worker", 0), pod("worker", 1)]
    one_down = [pod("chief", 0), pod("worker", 0), pod("worker", 1, "Pending")]
    started = workload(*ADMITTED, ("PodsReady", True, "Started", ""))
    assert pods_ready_ops(step({"phase": "Running"}, workload(*ADMITTED), one_down)) == [], "absent: not ready"
    assert pods_ready_ops(step({"phase": "Running"}, started, one_down)) == [("False", "WaitForRecovery")]
    recovering = workload(*ADMITTED, ("PodsReady", False, "WaitForRecovery", ""))
    assert pods_ready_ops(step({"phase": "Running"}, recovering, one_down)) == [], "said already"
    assert pods_ready_ops(step({"phase": "Running"}, recovering, running)) == [("True", "Recovered")]
    assert pods_ready_ops(step({"phase": "Running"}, started, running)) == [], "said already"
    evicted = workload(*ADMITTED, ("PodsReady", True, "Started", ""),
                       ("Evicted", True, "PodsReadyTimeout", "Exceeded the PodsReady timeout"))
    assert ("False", "WaitForStart") in pods_ready_ops(step({"phase": "Running"}, evicted, running))


def test_a_running_job_whose_workload_is_gone_stops_its_pods_and_queues_again() -> None:
    """Issue 21, defect 7: a Workload deleted under a running job (an admin; the queue label added
    to a running job) put the job in Queued while its pods kept running without quota. Kueue's
    own integrations stop such a job: its pods are deleted (no restart counted), a new Workload is
    made, and the job starts afresh once admitted."""
    running = [pod("chief", 0), pod("worker", 0), pod("worker", 1)]
    plan = step({"phase": "Running", "startTime": "2026-11-22T11:00:00Z", "operatorRestarts": 0}, None, running)
    assert plan.status["phase"] == "Queued"
    assert {p.name for p in plan.delete} == {p.name for p in running}, "no pod runs without quota"
    assert plan.status["restarts"] == 0
    assert [op.verb for op in plan.workload] == ["create"]
    assert "no Workload" in plan.status["message"], plan.status["message"]


def test_a_queue_label_changed_while_queued_or_suspended_reaches_the_workload() -> None:
    """Issue 31: queueName was written only when the Workload was made: a job relabelled while it
    waited stayed in the old queue for ever, its message naming the new one. Kueue's jobframework
    moves a Workload without quota to the job's new queue (QueueNameChange), and so do we."""
    waiting = dataclasses.replace(workload(("QuotaReserved", False, "Pending", "")), queue_name="team-cpu")
    plan = step({"phase": "Queued"}, waiting)  # the job's label now says team-gpu
    assert [(op.verb, op.body) for op in plan.workload] == [
        ("update", {"spec": {"queueName": "team-gpu"}, "metadata": {"resourceVersion": "7"}})]
    assert plan.status["message"].startswith("queued in LocalQueue team-gpu")
    job = tf_job("mnist", {"suspend": True}, chief=replica(1, cpu="1"), worker=replica(2, gpus=4))
    spec = parse_spec(job["spec"])
    suspended = dataclasses.replace(workload(spec=spec, active=False), queue_name="team-cpu")
    assert ("update", {"spec": {"queueName": "team-gpu"}, "metadata": {"resourceVersion": "7"}}) in [
        (op.verb, op.body) for op in step({"phase": "Suspended"}, suspended, spec=spec).workload]
    admitted = dataclasses.replace(workload(*ADMITTED), queue_name="team-cpu")
    assert not [op for op in step({"phase": "Running"}, admitted, [pod("worker", 0)]).workload
                if op.verb == "update"], "an admitted Workload keeps its queue, as in Kueue"


def test_a_priority_class_changed_while_queued_reaches_the_workload() -> None:
    waiting = dataclasses.replace(workload(("QuotaReserved", False, "Pending", "")), queue_name="team-gpu",
                                  priority=("low", 10))
    state = QueueState("team-gpu", waiting, {}, priority=("high", 1000))
    plan = reconcile(JobState(REF, 1, SPEC, {"phase": "Queued"}, queue=state), [], NOW)
    assert [(op.verb, op.body) for op in plan.workload] == [("update", {
        "spec": {"priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"},
                 "priority": 1000},
        "metadata": {"resourceVersion": "7", "labels": {"kueue.x-k8s.io/priority-class": "high"}}})]
