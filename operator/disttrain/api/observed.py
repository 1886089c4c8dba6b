"""What the operator keeps of a pod: the few facts reconciling needs.

Pods are held in memory (10,000 of them in the scale benchmark), so the watch holds these
small frozen records rather than whole pod bodies: slots, and the strings many pods share
(their job's UID, replica type, phase) interned. Measured in `make bench`: bytes per pod held.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disttrain.api.constants import (
    CHECKPOINT_FILE_LABEL,
    CHECKPOINT_REQUEST_ANNOTATION,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
)
from disttrain.api.objects import PodKey, controller_uid
from disttrain.api.times import epoch_seconds


@dataclass(frozen=True, slots=True)
class ObservedPod:
    name: str
    uid: str
    owner_uid: str  # the UID of the DistTrainJob that controls it: only that job's pods count for it
    replica_type: str
    index: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool
    terminating: bool
    exit_code: int | None  # of a failed pod: the first non-zero exit code among its containers
    reason: str | None  # why it failed: the pod's reason (Evicted, ...) or the container's (OOMKilled, Error)
    container_restarts: int  # restarts the kubelet made (restartPolicy OnFailure / Always)
    scheduled: bool = False  # bound to a node
    unschedulable: str | None = None  # the scheduler's word on why not (its PodScheduled=False message)
    stuck: str | None = None  # a container that can't start or keeps crashing: "<reason>: <kubelet's message>"
    # Who is ending the pod from outside (its DisruptionTarget condition: a taint eviction, a
    # preemption, a drain, the pod garbage collector): "<reason>: <message>".
    disruption: str | None = None
    finished_at: str | None = None  # when its failed container ended (RFC 3339, the kubelet's clock)
    init_container: str | None = None  # the init container that exited non-zero, when it was one
    hears_checkpoint: bool = False  # has the checkpoint-request file (CHECKPOINT_FILE_LABEL)
    # Its checkpoint-request annotation asks for one: what clears a request is derived from this,
    # not from the job's status alone (a patch that failed after the status dropped it stays).
    asked_checkpoint: bool = False
    # Its hold on the node's GPUs (or CPUs), in seconds since the epoch (decide/policies/usage.py):
    # since its PodScheduled condition turned True, until it ended (a terminal phase: its last
    # container's finishedAt; for a pod gone, control/tombstones.py sets when it went). Floats, not
    # the API's strings: held for every pod.
    scheduled_at: float | None = None
    ended_at: float | None = None

    @property
    def active(self) -> bool:
        return not self.terminating and self.phase in ("Pending", "Running", "Unknown")

    @classmethod
    def expected(cls, name: str, key: PodKey, owner_uid: str, uid: str = "") -> ObservedPod:
        """A pod we created whose watch event hasn't arrived yet: it counts as Pending. `uid`: the
        create's answer ("" while the create is in flight)."""
        return cls(name=name, uid=uid, owner_uid=owner_uid, replica_type=key.replica_type, index=key.index,
                   phase="Pending", ready=False, terminating=False, exit_code=None, reason=None,
                   container_restarts=0)


def observe_pod(pod: Mapping[str, Any]) -> ObservedPod:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    statuses = list(status.get("containerStatuses") or [])
    exit_code: int | None = None
    finished_at: str | None = None
    # Who ended the pod from outside, when the pod itself doesn't say (the pod garbage collector
    # for a node deleted: "DeletionByPodGC: PodGC: node no longer exists"; a taint manager's eviction).
    disruption: str | None = next(
        (f"{c.get('reason')}: {c.get('message')}" if c.get("message") else c.get("reason")
         for c in conditions if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)
    reason: str | None = status.get("reason") or disruption
    init_container: str | None = None
    # Init containers first: one that failed ended the pod before its containers ran (a dataset
    # download exiting 1 is the program's verdict, not a kill to retry).
    inits = [(cs, True) for cs in status.get("initContainerStatuses") or []]
    for cs, is_init in [*inits, *((cs, False) for cs in statuses)]:
        terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            exit_code = int(terminated["exitCode"])
            finished_at = terminated.get("finishedAt")
            reason = reason or terminated.get("reason")
            init_container = cs.get("name") if is_init else None
            break
    return ObservedPod(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        owner_uid=sys.intern(controller_uid(meta)),
        replica_type=sys.intern(labels.get(REPLICA_TYPE_LABEL, "")),
        index=replica_index(labels),
        phase=sys.intern(status.get("phase") or "Pending"),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        terminating=meta.get("deletionTimestamp") is not None,
        exit_code=exit_code,
        reason=reason,
        container_restarts=sum(int(cs.get("restartCount") or 0) for cs in statuses),
        scheduled=bool((pod.get("spec") or {}).get("nodeName")),
        unschedulable=next((c.get("message") or c.get("reason") for c in conditions
                            if c.get("type") == "PodScheduled" and c.get("status") == "False"), None),
        stuck=stuck_container(status),
        disruption=disruption,
        finished_at=finished_at,
        init_container=init_container,
        hears_checkpoint=labels.get(CHECKPOINT_FILE_LABEL) == "true",
        asked_checkpoint=bool((meta.get("annotations") or {}).get(CHECKPOINT_REQUEST_ANNOTATION)),
        scheduled_at=scheduled_at(status),
        ended_at=ended_at(status),
    )


def scheduled_at(status: Mapping[str, Any]) -> float | None:
    """When the pod was bound to its node: its PodScheduled condition's time (the API server sets
    it with the binding), else the kubelet's startTime."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
            return epoch_seconds(cond.get("lastTransitionTime")) or epoch_seconds(status.get("startTime"))
    return None


def ended_at(status: Mapping[str, Any]) -> float | None:
    """When a pod in a terminal phase ended: its last container's finishedAt (the kubelet frees its
    devices then, and the scheduler stops counting it), an init container's when its containers never
    ran, else its conditions' last change (a pod the kubelet refused ran nothing: its scheduling);
    None while it may still run."""
    if status.get("phase") not in ("Succeeded", "Failed"):
        return None
    statuses = [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]
    ends = [epoch_seconds(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")) for cs in statuses]
    known = [end for end in ends if end is not None]
    if not known:
        known = [t for c in status.get("conditions") or [] if (t := epoch_seconds(c.get("lastTransitionTime")))]
    return max(known) if known else None


# Container waiting reasons that hold a pod back until someone acts (the kubelet retries them).
STUCK_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                           "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError"})


def replica_index(labels: Mapping[str, str]) -> int:
    """The pod's replica index from its label; -1 for a value that is not a number (edited by hand)."""
    try:
        return int(labels.get(REPLICA_INDEX_LABEL, "0"))
    except ValueError:
        return -1


def stuck_container(status: Mapping[str, Any]) -> str | None:
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            message = waiting.get("message") or f"image {cs.get('image', '')}"
            return f"{waiting['reason']}: container {cs.get('name')}: {message}"
    return None
