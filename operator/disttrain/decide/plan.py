"""A reconcile's output: the writes that move a job forward, for the controller to carry out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from disttrain.api.observed import ObservedPod
from disttrain.decide.reasons import Reason


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: Reason
    message: str


@dataclass(frozen=True)
class WorkloadOp:
    """A write to a queued job's Kueue Workload."""

    verb: str  # create | delete | condition (server-side apply of one) | release (status) | active (spec)
    # | adopt (metadata: a prebuilt Workload made the job's own)
    # | update (queueName and priority: queue_steps.follow_queue)
    name: str
    body: dict[str, Any] = field(default_factory=dict)
    uid: str = ""
    resource_version: str = ""


@dataclass
class Plan:
    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)  # supporting objects first, then pods
    # Supporting objects to make even if this process made them before: a container waits for one that
    # is gone (decide/supporting_steps.py).
    restore: list[dict[str, Any]] = field(default_factory=list)
    delete: list[ObservedPod] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None  # seconds until a deadline or TTL falls due
    # Objects to keep current while the job runs (MPI's discover_hosts.sh follows the workers).
    keep_current: list[dict[str, Any]] = field(default_factory=list)
    # Pods that mount what keep_current writes and must see it at once: their annotations are touched
    # after a write, since the kubelet refreshes a ConfigMap volume when it syncs the pod (at an update,
    # else every syncFrequency, a minute by default).
    remount: list[ObservedPod] = field(default_factory=list)
    # Supporting objects to delete (a gang's group when the job finishes, is suspended or restarts).
    delete_objects: list[dict[str, Any]] = field(default_factory=list)
    workload: list[WorkloadOp] = field(default_factory=list)
    # Annotations to set on running pods (a checkpoint request: decide/checkpoint_steps.py).
    annotate: list[tuple[ObservedPod, dict[str, str]]] = field(default_factory=list)
    # status.usage's count (decide/usage_steps.py) goes out within these seconds even if nothing else
    # changed; None: only along with a write the pass makes anyway.
    usage_write: float | None = None

    def requeue_within(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)
