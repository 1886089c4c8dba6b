"""Every reason the operator gives: in `status.reason`, in conditions, on events, in metrics.

One enum, so a reason a user reads in `kubectl describe` is the one a dashboard counts. docs/api.md
lists them with their meaning.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # The job moves forward.
    PODS_CREATED = "PodsCreated"
    ALL_PODS_RUNNING = "AllPodsRunning"
    JOB_SUCCEEDED = "JobSucceeded"
    JOB_SUSPENDED = "JobSuspended"
    JOB_RESUMED = "JobResumed"
    # The job waits, and says for what.
    QUEUED = "Queued"  # in a Kueue LocalQueue, not admitted yet
    ADMITTED = "Admitted"
    EVICTED = "Evicted"  # by Kueue (preemption, a timeout...): pods stopped, queued again, no restart spent
    LEFT_QUEUE = "LeftQueue"  # the queue label removed: its Workload deleted once the pods are gone
    # Before a stop it chooses, the operator asks for a checkpoint (events): decide/checkpoint_steps.py.
    CHECKPOINT_REQUESTED = "CheckpointRequested"
    CHECKPOINTED = "Checkpointed"
    CHECKPOINT_TIMED_OUT = "CheckpointTimedOut"
    WAITING_FOR_WORKERS = "WaitingForWorkers"
    WAITING_FOR_PREVIOUS_JOB = "WaitingForPreviousJob"
    WAITING_FOR_GANG = "WaitingForGang"
    WAITING_FOR_CLAIMS = "WaitingForClaims"  # a ResourceClaim(Template) its workers name is not there yet
    UNSCHEDULABLE = "Unschedulable"  # a pod the scheduler can't place (its own words follow)
    IMAGE_PULL_BACKOFF = "ImagePullBackOff"  # a container image that can't be pulled
    CRASH_LOOP_BACKOFF = "CrashLoopBackOff"  # a container that keeps crashing
    CONTAINER_NOT_STARTING = "ContainerNotStarting"  # its config can't be made (a missing Secret, ...)
    POD_CREATE_REFUSED = "PodCreateRefused"  # admission said no (quota, PriorityClass...): create_refusals.py
    CREATE_REFUSED = "CreateRefused"  # the same for a Service, ConfigMap, Secret, NetworkPolicy or gang group
    GANG_SCHEDULING = "GangScheduling"  # the provider chosen (an event)
    API_REQUEST_RETRIED = "APIRequestRetried"  # a pass the API server failed (429, 5xx, RBAC): retried (an event)
    # The job restarts (pods or the whole job recreated; counted toward backoffLimit).
    POD_FAILED = "PodFailed"
    POD_DELETED = "PodDeleted"
    PODS_NOT_RUNNING = "PodsNotRunning"
    BELOW_MIN_REPLICAS = "BelowMinReplicas"  # an elastic job short of minReplicas workers too long
    TRAINING_STALLED = "TrainingStalled"  # runPolicy.onStall: Restart, for a stall (decide/stall_steps.py)
    # The Stalled condition: the training's reported step stood still past its timeout (and the Warning
    # event of a job left running), then its end. Not a restart: the transitions metric counts it apart.
    STALLED = "Stalled"
    TRAINING_ADVANCED = "TrainingAdvanced"
    # An elastic MPI job's workers change (events): spec.mpi.worker.replicas, and the pods scaled away.
    WORKERS_SCALED = "WorkersScaled"
    # The job fails.
    REPLICA_FAILED = "ReplicaFailed"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    INVALID_SPEC = "InvalidSpec"
    INVALID_POD_TEMPLATE = "InvalidPodTemplate"
    INVALID_OBJECT = "InvalidObject"  # the API server rejects a supporting object the operator made
    OBJECT_NOT_OWNED = "ObjectNotOwned"
    GANG_UNAVAILABLE = "GangUnavailable"
    WORKLOAD_FINISHED = "WorkloadFinished"  # MultiKueue: Kueue finished the Workload with no verdict copied


FAILURES = frozenset({Reason.REPLICA_FAILED, Reason.BACKOFF_LIMIT_EXCEEDED, Reason.DEADLINE_EXCEEDED,
                      Reason.INVALID_SPEC, Reason.INVALID_POD_TEMPLATE, Reason.INVALID_OBJECT, Reason.OBJECT_NOT_OWNED,
                      Reason.GANG_UNAVAILABLE, Reason.WORKLOAD_FINISHED})
RESTARTS = frozenset({Reason.POD_FAILED, Reason.POD_DELETED, Reason.BELOW_MIN_REPLICAS,
                      Reason.TRAINING_STALLED})
REFUSED = frozenset({Reason.POD_CREATE_REFUSED, Reason.CREATE_REFUSED})  # waited out: create_refusals.py
