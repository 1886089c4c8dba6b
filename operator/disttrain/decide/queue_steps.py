"""The reconcile ladder's steps for a queued job (`queueing` builds and reads the Workload).

- hold: no pod until Kueue admits the job's Workload; phase Queued meanwhile, in Kueue's words;
- evicted (preempted, timed out, deactivated): the pods go as for a suspend, no restart counted,
  the admission is handed back once they are gone, and the job starts afresh when admitted again;
- place: an admitted podSet's flavor node labels and tolerations go to its pods;
- report: PodsReady once every pod is Ready (Kueue's waitForPodsReady), Finished when the job is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from disttrain.api.constants import MANAGED_BY_MULTIKUEUE
from disttrain.api.objects import PodKey
from disttrain.api.status import Phase, set_condition, timestamp
from disttrain.decide import checkpoint_steps, name_reuse_steps, queueing
from disttrain.decide.passes import Pass
from disttrain.decide.plan import Event, WorkloadOp
from disttrain.decide.policies import elastic
from disttrain.decide.queueing import ObservedWorkload, QueueState
from disttrain.decide.reasons import Reason


def _pods_left(p: Pass) -> bool:
    """Whether one of the job's own pods still holds what its Workload reserved (running, or going)."""
    return any(pod.active or pod.terminating for pod in p.own)


def hold_in_queue(p: Pass) -> bool:
    """True while the job must wait in its queue (the ladder stops there). Pods it stops, and an
    earlier job's still holding its names, are waited out once it is admitted (name_reuse_steps)."""
    held = _hold_in_queue(p)
    if held:
        name_reuse_steps.track(p, held=name_reuse_steps.names_taken(p))
    return held


def _hold_in_queue(p: Pass) -> bool:
    state = p.job.queue
    if state is None:
        return False
    if state.leaving:
        workload = p.workload
        if workload is not None and workload.true("Evicted") and _pods_left(p):
            return evicted(p, workload)  # Kueue's eviction stands whatever the label says: the preemptor waits on it
        leave(p)
        return False  # its pods (or none) go on as for any job; the Workload follows them until they end
    if state.prebuilt is not None and not adopted(p, state.prebuilt):
        return True
    workload = p.workload
    if workload is None:
        name = queueing.workload_name(p.job.ref)
        p.plan.workload.append(WorkloadOp("create", name, queueing.desired_workload(p.job.ref, p.spec, state)))
        if any(pod.active for pod in p.live):
            # Pods running with no Workload (deleted by someone; the queue label added to a running
            # job) hold resources Kueue doesn't know of: stopped as an eviction (no restart
            # counted), as Kueue's own integrations stop a job whose Workload is gone.
            p.plan.delete = list(p.live)
            p.release_group()
            return queued(p, f"its pods ran with no Workload (deleted, or the queue label added while it ran): "
                             f"they are stopped, and it starts afresh once Workload {name} is admitted")
        return queued(p, f"waiting for Kueue to admit Workload {name}")
    follow_queue(p, workload)
    if workload.true("Evicted") and (_pods_left(p)
                                     or workload.true("QuotaReserved")):
        return evicted(p, workload)
    if workload.admitted:
        if p.phase is Phase.QUEUED:
            where = f" and MultiKueue dispatched it to worker cluster {workload.cluster_name}" \
                if workload.cluster_name else ""
            p.move(Phase.PENDING, Reason.ADMITTED,
                   f"Kueue admitted Workload {workload.name} to ClusterQueue {workload.cluster_queue}{where}")
            p.plan.status["startTime"] = timestamp(p.now)  # the deadline counts from admission
        shrink(p, workload)
        return False
    if workload.podsets_hash != queueing.podsets_hash(queueing.pod_sets(p.spec)):
        if state.prebuilt is not None:
            return out_of_sync(p, workload)
        p.plan.workload.append(WorkloadOp("delete", workload.name, uid=workload.uid))
        return queued(p, f"the job's pod templates changed while it was queued: Workload {workload.name} is "
                         f"replaced")
    if workload.true("QuotaReserved") and (checks := workload.waiting_on_checks()):
        return queued(p, f"Workload {workload.name} has quota in ClusterQueue {workload.cluster_queue}; {checks}")
    return queued(p, workload.said("QuotaReserved") or f"waiting for Kueue to admit Workload {workload.name}")


def follow_queue(p: Pass, workload: ObservedWorkload) -> None:
    """A queue label or priority class changed while the job waits or is suspended reaches its
    Workload (issue 31: queueName was set only when the Workload was made, so the job waited in the
    old queue for ever while its message named the new one)."""
    assert p.job.queue is not None
    change = _queue_changes(workload, p.job.queue)
    if change is not None:
        p.plan.workload.append(WorkloadOp("update", workload.name, change))


def _queue_changes(workload: ObservedWorkload, state: QueueState) -> dict[str, Any] | None:
    """The Workload's writes that follow the job's queue label and WorkloadPriorityClass, as Kueue's
    jobframework does for its own jobs (reconciler.go QueueNameChange, while the Workload has no
    quota; UpdateWorkloadPriority, except adding a class to one that reserved quota without one,
    which the Workload's CEL refuses). None when it follows them already."""
    reserved = workload.true("QuotaReserved")
    spec: dict[str, Any] = {}
    labels: dict[str, str] = {}
    if not reserved and workload.queue_name and workload.queue_name != state.queue:
        spec["queueName"] = state.queue
    if state.priority is not None and workload.priority != state.priority and not (
            reserved and workload.priority is None):
        name, value = state.priority
        spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": name}
        spec["priority"] = value
        labels[queueing.PRIORITY_LABEL] = name
    if not spec:
        return None
    change: dict[str, Any] = {"spec": spec, "metadata": {"resourceVersion": workload.resource_version}}
    if labels:
        change["metadata"]["labels"] = labels
    return change


def shrink(p: Pass, workload: ObservedWorkload) -> None:
    """An admitted elastic job scaled down gives the quota of the workers it let go back: once
    they are gone, its Workload's worker count is lowered in place, as Kueue's own integrations do
    for a scale-down (KEP-77, workloadslicing.go; its webhook allows only a smaller count), and
    Kueue counts the smaller. Issue 31: the job kept all its quota until it ended."""
    names = [name for name, _ in workload.podset_counts]
    # On a MultiKueue manager a smaller count would read to Kueue as a Workload out of sync with its
    # worker's copy (ours are not its elastic-job Workloads), which it deletes and dispatches afresh ...
    if (elastic.settings(p.spec) is None or "worker" not in names or p.spec.managed_by == MANAGED_BY_MULTIKUEUE
            or (p.job.queue is not None and p.job.queue.prebuilt is not None)):
        return  # ... nor on a worker's copy, whose Workload the manager's must match
    index = names.index("worker")
    count = workload.podset_counts[index][1]
    assert p.spec.mpi is not None
    if p.spec.mpi.worker.replicas >= count or any(pod.replica_type == "worker" and pod.index >= p.wanted_workers
                                                  for pod in p.own):
        return  # not scaled down (fewer admitted than asked is Kueue's partial admission), or not yet gone
    # The podsets-hash follows the smaller count: a Workload requeued after an eviction or a suspend is
    # then replaced if the job was scaled back up meanwhile, instead of being admitted at the old count.
    p.plan.workload.append(WorkloadOp("json-patch", workload.name, {"patch": [  # count: wanted <= replicas
        {"op": "test", "path": "/metadata/resourceVersion", "value": workload.resource_version},
        {"op": "test", "path": f"/spec/podSets/{index}/name", "value": "worker"},
        {"op": "replace", "path": f"/spec/podSets/{index}/count", "value": p.wanted_workers},
        {"op": "replace", "path": "/metadata/annotations/" + queueing.PODSETS_HASH.replace("/", "~1"),
         "value": queueing.podsets_hash(queueing.pod_sets(p.spec))}]}, uid=workload.uid))


def adopted(p: Pass, name: str) -> bool:
    """MultiKueue's copy of a job on a worker cluster runs under the Workload MultiKueue made for
    it before the job (named by kueue.x-k8s.io/prebuilt-workload-name), never one of its own: True
    once the job controls it; until then the job waits, and the Workload is taken as Kueue's
    integrations take one (the job its controller)."""
    assert p.job.queue is not None
    found = p.job.queue.workload
    if found is not None and found.owner_uid == p.job.ref.uid:
        return True
    if found is None:
        if any(pod.active for pod in p.live):  # gone from under running pods: stopped, as in hold_in_queue
            p.plan.delete = list(p.live)
            p.release_group()
        queued(p, f"waiting for Workload {name} ({queueing.PREBUILT_WORKLOAD}), which MultiKueue makes before the job")
    elif found.owner_uid:
        queued(p, f"Workload {name} ({queueing.PREBUILT_WORKLOAD}) is controlled by another object: it is not this "
                  f"job's to run under")
    else:
        p.plan.workload.append(WorkloadOp("adopt", name, queueing.adoption(p.job.ref, found)))
        queued(p, f"taking Workload {name}, made for it by MultiKueue")
    return False


def out_of_sync(p: Pass, workload: ObservedWorkload) -> bool:
    """A prebuilt Workload whose pod sets differ from the job's is finished, as Kueue's own
    integrations finish one (reason OutOfSync): MultiKueue then dispatches the job afresh."""
    if not workload.true("Finished"):
        p.plan.workload.append(WorkloadOp("condition", workload.name, queueing.condition(
            "Finished", True, "OutOfSync", "The prebuilt workload is out of sync with its user job",
            timestamp(p.now))))
    return queued(p, f"Workload {workload.name} no longer matches the job's pod templates: finished as OutOfSync")


def queued(p: Pass, detail: str) -> bool:
    assert p.job.queue is not None
    message = f"queued in LocalQueue {p.job.queue.queue}: {detail}"
    if p.phase is not Phase.QUEUED:
        p.move(Phase.QUEUED, Reason.QUEUED, message)
    elif p.plan.status.get("message") != message:
        # Kueue's reason changes while the job waits (its scheduler tries the Workload after it
        # is made): the Queued condition says what the message says, as `kubectl describe` shows it.
        p.plan.status["message"] = message
        p.plan.status["conditions"] = set_condition(list(p.plan.status.get("conditions") or []), "Queued", True,
                                                    p.plan.status.get("reason", Reason.QUEUED), message,
                                                    timestamp(p.now))
    return True


def evicted(p: Pass, workload: ObservedWorkload) -> bool:
    cond = workload.conditions.get("Evicted") or {}
    where = f" from worker cluster {workload.cluster_name}" if workload.cluster_name else ""
    said = f"{cond.get('reason', 'Evicted')}: {cond.get('message', '')}"
    cause = f"Kueue evicted Workload {workload.name}{where} ({said})"
    message = f"{cause}; its pods are deleted and it starts afresh once admitted again (no restart counted)"
    # Evicted for pods never ready (Kueue's waitForPodsReady): no training ran to save, and the
    # release is what that timeout exists for (kueue v0.19.2 WorkloadEvictedByPodsReadyTimeout).
    if cond.get("reason") != "PodsReadyTimeout" and checkpoint_steps.hold_for_checkpoint(p, "Evicted", cause):
        return True  # the pods and the quota stay until the checkpoint or its deadline (a bound Kueue waits out)
    p.plan.delete = list(p.live)
    p.release_group()
    hand_back(p, workload)
    if p.phase is not Phase.QUEUED:
        p.move(Phase.QUEUED, Reason.EVICTED, message, warning=True)
    return True


def hand_back(p: Pass, workload: ObservedWorkload) -> None:
    """An evicted Workload's quota goes back to Kueue once none of the job's pods is left."""
    if workload.true("Evicted") and workload.true("QuotaReserved") and \
            not _pods_left(p):
        p.plan.workload.append(WorkloadOp("release", workload.name, queueing.released_admission(
            workload, timestamp(p.now)), resource_version=workload.resource_version))


def place(p: Pass, key: PodKey, pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod where its podSet was admitted; None (the job has failed) if its template says otherwise."""
    workload = p.workload
    if p.job.queue is None or workload is None:
        return pod
    placed, conflict = queueing.place(pod, queueing.placement(workload, str(key.replica_type), p.job.queue.flavors))
    if conflict is None:
        return placed
    p.finish(Phase.FAILED, Reason.INVALID_SPEC,
             f"spec.{p.spec.framework.value}.{key.replica_type}.template.spec.nodeSelector: {conflict}")
    return None


def report(p: Pass) -> None:
    """PodsReady as Kueue's job framework sets it (True once every pod is Ready or done, False
    again when one is not, or the Workload is evicted); Finished once the job is (idempotent:
    repeated until the Workload shows it)."""
    workload = p.workload
    if workload is None:
        return
    now = timestamp(p.now)
    phase = Phase(p.plan.status.get("phase") or Phase.PENDING)
    if phase in (Phase.SUCCEEDED, Phase.FAILED):
        if not workload.true("Finished"):
            reason = "Succeeded" if phase is Phase.SUCCEEDED else "Failed"
            p.plan.workload.append(WorkloadOp("condition", workload.name, queueing.condition(
                "Finished", True, reason, str(p.plan.status.get("message") or reason), now)))
        return
    ready = {pod.name for pod in p.live if pod.ready or pod.phase == "Succeeded"}
    report_pods_ready(p, workload, all(name in ready for name in p.wanted))


def report_pods_ready(p: Pass, workload: ObservedWorkload, all_ready: bool) -> None:
    wanted = queueing.pods_ready_condition(workload, all_ready)
    if wanted is not None:
        p.plan.workload.append(WorkloadOp("condition", workload.name, queueing.condition(
            "PodsReady", wanted[0] == "True", wanted[1], wanted[2], timestamp(p.now))))


def leave(p: Pass) -> None:
    """A job that left its queue (the label removed while it had a Workload) deletes the
    Workload once none of its pods is left: Kueue then takes the quota back, as it does for a
    Workload gone. Until then its pods hold what the Workload reserved. From that pass on it is a
    job without Kueue (runs as one never labelled, or stays suspended). Issue 43: the Workload was
    no longer looked at, and an evicted one kept QuotaReserved=True, its preemptor never admitted."""
    workload = p.workload
    if workload is None or _pods_left(p):
        return
    assert p.job.queue is not None
    queue = p.job.queue.queue
    p.plan.workload.append(WorkloadOp("delete", workload.name, uid=workload.uid))
    p.plan.events.append(Event("Normal", Reason.LEFT_QUEUE, f"left LocalQueue {queue} (its "
                               f"{queueing.QUEUE_LABEL} label removed): Workload {workload.name} is deleted"))
    p.job = dataclasses.replace(p.job, queue=None)  # the rest of the pass: a job outside Kueue
    if p.phase is Phase.QUEUED:  # evicted, or never admitted: it starts now, its deadline from now
        p.move(Phase.PENDING, Reason.LEFT_QUEUE, f"left LocalQueue {queue}: starting without Kueue")
        p.plan.status["startTime"] = timestamp(p.now)
    elif p.phase is not Phase.SUSPENDED:
        p.plan.status.setdefault("startTime", timestamp(p.now))  # as for a job never queued (resume_if_suspended)


def pause(p: Pass, active: bool) -> None:
    """runPolicy.suspend wins over Kueue: a suspended job's Workload is deactivated (its quota
    goes back) and activated again on resume."""
    workload = p.workload
    if workload is None:
        return
    if p.job.queue is not None and p.job.queue.leaving:
        if not active:  # resumed, hold_in_queue leaves
            leave(p)
        return
    if workload.active != active:
        p.plan.workload.append(WorkloadOp("active", workload.name, {"active": active}))
    if not active and p.job.queue is not None:
        follow_queue(p, workload)
    if not active:
        hand_back(p, workload)
