"""Kueue: a job labelled `kueue.x-k8s.io/queue-name` is queued. The operator manages a Kueue
Workload for it (as Kueue's own job integrations do, from outside Go), makes no pod until Kueue
admits it, and keeps the Workload's status in step with the job (docs/api.md, "Queueing").

Facts of Kueue v0.19.2 this follows: the Workload API is kueue.x-k8s.io/v1beta2 (v1beta1 is
served too, but converted only through a webhook); one podSet per replica type, each with a pod
template and a count; an admission names a ResourceFlavor per resource of each podSet, whose
nodeLabels and tolerations go to that podSet's pods; an evicted Workload keeps its quota until its
job has stopped and the job clears the admission itself; a Workload marked Finished releases its
quota at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from disttrain.api import topology
from disttrain.api.constants import API_VERSION, JOB_NAME_LABEL, KIND, REPLICA_INDEX_LABEL, REPLICA_TYPE_LABEL
from disttrain.api.objects import JobRef, controller_uid, object_meta, owner_reference
from disttrain.api.spec import JobSpec, ReplicaType

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
PODSETS_HASH = "disttrain.dev/podsets-hash"  # the spec a Workload was made from (replaced if it changes)
# MultiKueue's copy of a job on a worker cluster names the Workload it made there first, to be adopted
# rather than made: an annotation since Kueue v0.18 (WorkloadIdentifierAnnotations, beta, on), a
# label before (jobframework/utils.go, PrebuiltWorkloadNameFor reads both).
PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"


@dataclass(frozen=True)
class ObservedWorkload:
    name: str
    uid: str
    owner_uid: str
    podsets_hash: str
    active: bool
    conditions: Mapping[str, Mapping[str, Any]]  # by type
    assignments: Mapping[str, Mapping[str, str]]  # podSet name -> resource -> flavor
    resource_version: str = ""
    cluster_queue: str = ""
    # podSet name -> pods admitted, where Kueue says (partial admission can admit fewer than asked).
    admitted_counts: Mapping[str, int] = field(default_factory=dict)
    # Admission checks (MultiKueue's among them): name -> (state, message).
    checks: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    cluster_name: str = ""  # the worker cluster MultiKueue dispatched it to (status.clusterName)
    topology_placed: frozenset[str] = frozenset()  # podSets Kueue's TAS assigned domains to, for its ungater
    queue_name: str = ""  # spec.queueName
    podset_counts: tuple[tuple[str, int], ...] = ()  # spec.podSets' names and counts, in order
    priority: tuple[str, int] | None = None  # spec.priorityClassRef's WorkloadPriorityClass and spec.priority

    def true(self, ctype: str) -> bool:
        return (self.conditions.get(ctype) or {}).get("status") == "True"

    def said(self, ctype: str) -> str:
        cond = self.conditions.get(ctype) or {}
        return str(cond.get("message") or cond.get("reason") or "")

    def waiting_on_checks(self) -> str:
        """What the admission checks not Ready yet say (MultiKueue: which worker it is trying)."""
        return "; ".join(f"admission check {name} {state}" + (f": {message}" if message else "")
                         for name, (state, message) in sorted(self.checks.items()) if state != "Ready")

    def held(self, podset: str) -> int | None:
        """The pods of a podSet whose quota the Workload holds: what was admitted, or fewer once
        its count was shrunk in place (an elastic job scaled down; Kueue counts the smaller)."""
        admitted = self.admitted_counts.get(podset)
        count = dict(self.podset_counts).get(podset)
        known = [n for n in (admitted, count) if n is not None]
        return min(known) if known else None

    @property
    def admitted(self) -> bool:
        return self.true("Admitted") and not self.true("Evicted") and not self.true("Finished")


@dataclass(frozen=True)
class Flavor:
    node_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    topology: str | None = None  # placement only: the Workload whose TAS assignment places the pod


@dataclass(frozen=True)
class QueueState:
    """What the controller read for a queued job: its Workload (if any), the flavors of its
    admission, and the priority its WorkloadPriorityClass gives."""

    queue: str
    workload: ObservedWorkload | None = None
    flavors: Mapping[str, Flavor] = field(default_factory=dict)
    priority: tuple[str, int] | None = None  # (WorkloadPriorityClass, its value)
    unreadable: str | None = None  # a flavor or priority class that could not be read: pods and Workload wait
    prebuilt: str | None = None  # MultiKueue's worker copy: the Workload made for it, to adopt (never make)
    leaving: bool = False  # the queue label gone while it had a Workload (queue: the Workload's): queue_steps.leave


def queue_name(labels: Mapping[str, str]) -> str | None:
    return labels.get(QUEUE_LABEL) or None


def prebuilt_workload(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    return annotations.get(PREBUILT_WORKLOAD) or labels.get(PREBUILT_WORKLOAD) or None


def workload_name(job: JobRef) -> str:
    """Kueue's own naming: `<kind>-<job>-<hash of the job's identity>`, so a job applied again under
    the same name gets a Workload of its own."""
    digest = hashlib.sha1(f"{KIND}\n{API_VERSION}\n{job.name}\n{job.uid}".encode()).hexdigest()[:5]
    return f"{KIND.lower()}-{job.name}"[:247] + f"-{digest}"


def pod_sets(spec: JobSpec) -> list[dict[str, Any]]:
    """One podSet per replica type: what each pod asks of the scheduler (Kueue reads resources,
    node selectors, affinities and tolerations; metadata may hold labels and annotations only)."""
    sets = []
    for rtype, replica in spec.replicas.items():
        meta = replica.template.get("metadata") or {}
        template: dict[str, Any] = {"spec": dict(replica.template.get("spec") or {})}
        kept = {k: meta[k] for k in ("labels", "annotations") if meta.get(k)}
        if kept:
            template["metadata"] = kept
        podset: dict[str, Any] = {"name": str(rtype), "count": replica.replicas, "template": template}
        request = topology.topology_request(meta.get("annotations") or {}, REPLICA_INDEX_LABEL)
        if request is not None:
            podset["topologyRequest"] = request
        if rtype == ReplicaType.WORKER and spec.mpi is not None and spec.mpi.elastic is not None:
            # Kueue's partial admission (beta, on by default since v0.5): it may admit as few as
            # minReplicas workers when quota is short; the job then runs with what was admitted.
            podset["minCount"] = spec.mpi.elastic.min_replicas
        sets.append(podset)
    return sets


def podsets_hash(sets: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(sets, sort_keys=True).encode()).hexdigest()[:16]


def desired_workload(job: JobRef, spec: JobSpec, state: QueueState) -> dict[str, Any]:
    sets = pod_sets(spec)
    meta = object_meta(job, workload_name(job), {JOB_NAME_LABEL: job.name, JOB_UID_LABEL: job.uid})
    meta["annotations"] = {PODSETS_HASH: podsets_hash(sets)}
    workload_spec: dict[str, Any] = {"queueName": state.queue, "podSets": sets, "active": True}
    if state.priority is not None:
        name, value = state.priority
        meta["labels"][PRIORITY_LABEL] = name
        workload_spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": name}
        workload_spec["priority"] = value
    return {"apiVersion": KUEUE_API, "kind": "Workload", "metadata": meta, "spec": workload_spec}


def observe_workload(body: Mapping[str, Any]) -> ObservedWorkload:
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    admission = status.get("admission") or {}
    return ObservedWorkload(
        name=str(meta.get("name", "")), uid=str(meta.get("uid", "")), owner_uid=controller_uid(meta),
        podsets_hash=str((meta.get("annotations") or {}).get(PODSETS_HASH, "")),
        active=spec.get("active") is not False,
        conditions={c["type"]: c for c in status.get("conditions") or [] if "type" in c},
        assignments={a["name"]: dict(a.get("flavors") or {}) for a in admission.get("podSetAssignments") or []},
        resource_version=str(meta.get("resourceVersion", "")),
        cluster_queue=str(admission.get("clusterQueue") or ""),
        admitted_counts={a["name"]: int(a["count"]) for a in admission.get("podSetAssignments") or []
                         if a.get("count") is not None},
        checks={c["name"]: (str(c.get("state") or ""), str(c.get("message") or ""))
                for c in status.get("admissionChecks") or [] if "name" in c},
        cluster_name=str(status.get("clusterName") or ""),
        topology_placed=frozenset(a["name"] for a in admission.get("podSetAssignments") or []
                                  if a.get("topologyAssignment")),
        queue_name=str(spec.get("queueName") or ""),
        podset_counts=tuple((str(ps.get("name")), int(ps.get("count") or 0)) for ps in spec.get("podSets") or ()),
        priority=_priority(spec),
    )


def _priority(spec: Mapping[str, Any]) -> tuple[str, int] | None:
    ref = spec.get("priorityClassRef") or {}
    if ref.get("kind") != "WorkloadPriorityClass" or not ref.get("name"):
        return None
    return str(ref["name"]), int(spec.get("priority") or 0)


def placement(workload: ObservedWorkload, podset: str, flavors: Mapping[str, Flavor]) -> Flavor:
    """The node labels and tolerations of every flavor the podSet was admitted to, and whether
    Kueue's TAS places its pods in the domains it assigned (`Flavor.topology`: the Workload's name)."""
    labels: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for name in sorted(set((workload.assignments.get(podset) or {}).values())):
        flavor = flavors.get(name) or Flavor()
        labels |= dict(flavor.node_labels)
        tolerations += [t for t in flavor.tolerations if t not in tolerations]
    return Flavor(labels, tolerations, workload.name if podset in workload.topology_placed else None)


def place(pod: Mapping[str, Any], where: Flavor) -> tuple[dict[str, Any], str | None]:
    """The pod with the admission's node labels in its nodeSelector and its tolerations added; or
    why not: a nodeSelector of its own that says otherwise."""
    out = dict(pod)
    pod_spec = dict(out["spec"])
    selector = dict(pod_spec.get("nodeSelector") or {})
    for key, value in where.node_labels.items():
        if key in selector and selector[key] != value:
            return out, (f"the pod template's nodeSelector {key}={selector[key]} conflicts with the ResourceFlavor "
                         f"Kueue admitted it to ({key}={value})")
        selector[key] = value
    if selector:
        pod_spec["nodeSelector"] = selector
    existing = list(pod_spec.get("tolerations") or [])
    added = [dict(t) for t in where.tolerations if t not in existing]
    if added:
        pod_spec["tolerations"] = existing + added
    out["spec"] = pod_spec
    meta = dict(out["metadata"])
    meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k != QUEUE_LABEL}
    out["metadata"] = meta
    if where.topology is not None:
        gate_for_topology(out, where.topology)
    return out, None


def gate_for_topology(pod: dict[str, Any], workload: str) -> None:
    """A pod of a podSet Kueue's TAS placed: held by Kueue's scheduling gate until its
    TopologyUngater has written the assigned domain into the nodeSelector (it finds the pod by the
    Workload annotation and podSet label, and ranks it by the replica-index label named in the
    topologyRequest). A podSet TAS placed without being asked (every flavor of the ClusterQueue has
    a topology) is marked unconstrained, as Kueue marks its own (podset.FromAssignment): a bound
    pod without a TAS annotation would count a second time, as usage Kueue doesn't manage."""
    meta = pod["metadata"]
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    annotations[topology.WORKLOAD_ANNOTATION] = workload
    if not any(annotations.get(k) for k in topology.ASKS):
        annotations[topology.UNCONSTRAINED] = "true"
    meta["labels"][topology.PODSET_LABEL] = meta["labels"][REPLICA_TYPE_LABEL]
    spec = pod["spec"]
    gates = list(spec.get("schedulingGates") or [])
    if {"name": topology.SCHEDULING_GATE} not in gates:
        spec["schedulingGates"] = [*gates, {"name": topology.SCHEDULING_GATE}]


def adoption(job: JobRef, workload: ObservedWorkload) -> dict[str, Any]:
    """The metadata that makes a prebuilt Workload the job's own, as Kueue's integrations take one
    (jobframework EnsurePrebuiltWorkloadOwnership): the job as its controller, the job-uid label."""
    return {"metadata": {"ownerReferences": [owner_reference(job)], "labels": {JOB_UID_LABEL: job.uid},
                         "resourceVersion": workload.resource_version}}


def condition(ctype: str, status: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    return {"type": ctype, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": now}


# Kueue v0.19.2's jobframework generatePodsReadyCondition: its reasons and messages.
NOT_READY = "Not all pods are ready or succeeded"
RECOVERING = "At least one pod has failed, waiting for recovery"
READY = "All pods reached readiness and the workload is running"


def pods_ready_condition(workload: ObservedWorkload, all_ready: bool) -> tuple[str, str, str] | None:
    """(status, reason, message) of the PodsReady condition the Workload should carry, as Kueue's
    own integrations set it: without it going False, waitForPodsReady's timeout and recovery never
    fire for a job that lost a pod or was evicted. None when there is nothing to write: it carries
    that status and reason already, or it has none and the pods aren't ready."""
    current = workload.conditions.get("PodsReady") or {}
    if not current and not all_ready:
        return None  # absent reads as not ready to Kueue (its timeout counts from admission): no write
    wanted = _pods_ready(workload, all_ready, current)
    return None if (current.get("status"), current.get("reason")) == wanted[:2] else wanted


def _pods_ready(workload: ObservedWorkload, all_ready: bool, current: Mapping[str, Any]) -> tuple[str, str, str]:
    if not workload.admitted or workload.true("Evicted"):
        return "False", "WaitForStart", NOT_READY
    if all_ready:
        return "True", "Recovered" if current.get("reason") in ("WaitForRecovery", "Recovered") else "Started", READY
    if current.get("status") == "True" or current.get("reason") == "WaitForRecovery":
        return "False", "WaitForRecovery", RECOVERING
    return "False", "WaitForStart", NOT_READY


def released_admission(workload: ObservedWorkload, now: str) -> dict[str, Any]:
    """The status of an evicted Workload once its job has stopped: the admission cleared, so Kueue
    takes the quota back and queues it again (as Kueue's own job integrations do). Requeued is
    True for a preemption or lost nodes; other evictions (a timeout, a deactivation) Kueue requeues
    itself when their cause passes."""
    evicted = workload.conditions.get("Evicted") or {}
    reason, message = str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "")
    updates = {
        "Requeued": condition("Requeued", reason in ("Preempted", "NodeFailures"), reason, message, now),
        "QuotaReserved": condition("QuotaReserved", False, "Pending", message, now),
        "Admitted": condition("Admitted", False, "NoReservation", "The workload has no reservation", now),
        "PodsReady": condition("PodsReady", False, "WaitForStart", NOT_READY, now),
    }
    kept = [c for t, c in workload.conditions.items() if t not in updates]
    return {"admission": None, "conditions": kept + list(updates.values())}
