"""The schema of a DistTrainJob's `spec.runPolicy`: restarts, deadlines, cleanup, suspension,
network isolation and scheduling (gang scheduling and its size rule), with their defaults."""

from __future__ import annotations

from disttrain.api import defaults
from disttrain.api.crd_spec import Schema, enum_field, immutable, int_field, string_field
from disttrain.api.spec import CleanPodPolicy, Egress, GangProvider, OnStall, RestartScope


def run_policy_schema() -> Schema:
    return {
        "type": "object",
        "description": "How the job is run: restarts, deadlines, cleanup, suspension and scheduling.",
        "default": {},
        "properties": {
            "backoffLimit": int_field("Restarts (pod- or job-level, and kubelet container restarts) allowed before "
                                 "the job fails.", minimum=0, default=defaults.BACKOFF_LIMIT),
            "restartScope": enum_field(
                "Pod: recreate only the failed pod. Job: delete and recreate every pod of the job. Default: Job "
                "for synchronous training (tensorflow without ps, and mpi), Pod for tensorflow with ps.",
                [s.value for s in RestartScope]),
            "activeDeadlineSeconds": {"type": "integer", "format": "int64", "minimum": 1, "description":
                                      "Seconds the job may run (from its start or resume) before it fails with "
                                      "reason DeadlineExceeded."},
            "ttlSecondsAfterFinished": {"type": "integer", "format": "int64", "minimum": 0, "description":
                                        "Seconds after the job finishes when the DistTrainJob itself (and "
                                        "everything it owns) is deleted."},
            "cleanPodPolicy": enum_field(
                "Which pods to delete when the job finishes: Running (those still running, such as parameter "
                "servers and evaluators), All, or None.", [c.value for c in CleanPodPolicy],
                defaults.CLEAN_POD_POLICY),
            "suspend": {"type": "boolean", "default": defaults.SUSPEND, "description":
                        "true: delete the job's pods and hold it in phase Suspended; false again: start afresh."},
            "checkpointGraceSeconds": int_field(
                "Before the operator stops the job's pods for a reason that is not a failure (a Kueue eviction "
                "or preemption, suspend, the whole-job restart after a pod was drained), it asks the training "
                "to save a checkpoint and waits this long for its confirmation; 0 stops at once.",
                minimum=0, maximum=defaults.MAX_CHECKPOINT_GRACE_SECONDS,
                default=defaults.CHECKPOINT_GRACE_SECONDS),
            "injectProgressHook": {"type": "boolean", "default": defaults.INJECT_PROGRESS_HOOK, "description":
                                   "true: where the operator has a hook image (the chart's default), every pod "
                                   "gets disttrain_progress and its zero-code Keras hook from an init container, "
                                   "whatever its image; false: the pods run their image as it is."},
            **stall_schema(),
            "scheduling": scheduling_schema(),
            "networkPolicy": immutable(network_policy_schema(), "runPolicy.networkPolicy"),
        },
    }


def stall_schema() -> Schema:
    """runPolicy.stallTimeoutSeconds and onStall (decide/policies/stall.py)."""
    return {
        "stallTimeoutSeconds": int_field(
            "Seconds a Running job's reported training step (or epoch) may stay the same before the job is "
            "Stalled (each attempt's first step, and the time past the last, get three times as long). Unset: three "
            "times the longest its step stood before moving on within an attempt (status.progress.advanced), "
            "never under 10 minutes, judged once the step has moved. A job that never reports a step or an "
            "epoch is never Stalled.",
            minimum=defaults.MIN_STALL_TIMEOUT_SECONDS, maximum=defaults.MAX_STALL_TIMEOUT_SECONDS),
        "onStall": enum_field(
            "What a Stalled job gets. Report: the Stalled condition, a Warning event and the "
            "disttrain_job_stalled gauge. Restart: besides, the whole job is restarted (counted toward "
            "backoffLimit, whatever the replicas' restartPolicy; none left: Failed), resuming from the last "
            "checkpoint its training saved (none is asked for first).", [o.value for o in OnStall],
            defaults.ON_STALL),
    }


def advanced_schema() -> Schema:
    """status.progress.advanced: what a stall is judged by (decide/policies/stall.py advance)."""
    def count(what: str) -> Schema:
        return {"type": "integer", "format": "int64", "minimum": 0, "description": what}
    return {"type": "object", "description": "The step or epoch reported last changed to, and since when (stalls).",
            "properties": {"at": string_field("Since when.", format="date-time"), "epoch": count("Its epoch."),
                           "step": count("Its step."), "longestStillSeconds": {
                               "type": "number", "description": "The longest a position stood before moving on "
                                                                "within one attempt: the job's pace."}}}


def network_policy_schema() -> Schema:
    return {
        "type": "object",
        "description": "Opt-in network isolation: a NetworkPolicy <job>-peers, made before the pods, lets the "
                       "job's pods accept connections only from each other. Present (even empty, {}) turns it "
                       "on; add a NetworkPolicy of your own to let more in (policies add up). Enforced only by a "
                       "network plugin that implements NetworkPolicy (Calico, Cilium, ...); elsewhere it is "
                       "stored and does nothing.",
        "properties": {
            "egress": enum_field(
                "Where the pods may connect. All: anywhere (datasets and checkpoints in object storage). "
                "PeersAndDNS: only to each other, to DNS (port 53) and to the operator's progress endpoint "
                "(where the chart runs it).", [e.value for e in Egress],
                defaults.NETWORK_EGRESS),
        },
    }


def scheduling_schema() -> Schema:
    return {
        "type": "object",
        "description": "Scheduling of the job's pods.",
        "properties": {
            "schedulerName": string_field("Scheduler for every pod (for example volcano), unless a template names "
                                          "its own."),
            "gang": immutable(gang_schema(), "runPolicy.scheduling.gang"),
            "queue": string_field("Volcano queue of the job's PodGroup (gang provider Volcano; Volcano's default "
                                  "queue if unset)."),
            "priorityClassName": string_field("PriorityClass for every pod, unless a template names its own."),
        },
    }


def gang_schema() -> Schema:
    return {
        "type": "object",
        "description": "Gang scheduling: the pods created together (every pod; for MPI the workers, and the "
                       "launcher only with launcherStart Immediately) are scheduled all at once or not at all, so "
                       "jobs never hold part of the GPUs each. Present (even empty, {}) turns it on. A PodGroup is "
                       "made before the pods, deleted when the job finishes or is suspended, and made afresh on a "
                       "whole-job restart.",
        "properties": {
            "provider": enum_field(
                "Which scheduler's API: Kubernetes (scheduling.k8s.io/v1alpha2 Workload and PodGroup, kube-scheduler's "
                "GangScheduling), SchedulerPlugins (scheduling.x-k8s.io PodGroup, Coscheduling), Volcano "
                "(scheduling.volcano.sh PodGroup). Auto: the one schedulerName points at, else Kubernetes', else "
                "whichever the cluster serves; an event says which.",
                [p.value for p in GangProvider], defaults.GANG_PROVIDER),
            "minAvailable": int_field("Pods that must be scheduled together. Default: every pod created together.",
                                      minimum=1),
            "timeoutSeconds": int_field("How long the scheduler holds a partly placed gang before it lets go "
                                        "(SchedulerPlugins' scheduleTimeoutSeconds; Kubernetes waits a fixed 5 "
                                        "minutes, Volcano until resources free up).", minimum=1),
        },
    }


def gang_size_rule() -> Schema:
    """minAvailable counts pods created together: more could never be scheduled at once."""
    gang = "self.runPolicy.scheduling.gang"
    tf = " + ".join(f"(has(self.tensorflow.{t}) ? self.tensorflow.{t}.replicas : 0)"
                    for t in ("chief", "ps", "worker", "evaluator"))
    # An elastic job's gang is its fewest workers: a worker added later is scheduled on its own.
    mpi = ("(has(self.mpi.elastic) ? self.mpi.elastic.minReplicas : self.mpi.worker.replicas) + "
           "(self.mpi.launcherStart == 'Immediately' ? 1 : 0)")
    return {
        "rule": f"!has(self.runPolicy) || !has(self.runPolicy.scheduling) || !has({gang}) || "
                f"!has({gang}.minAvailable) || {gang}.minAvailable <= (has(self.tensorflow) ? {tf} : {mpi})",
        "message": "runPolicy.scheduling.gang.minAvailable is more than the pods created together (every pod; for "
                   "MPI the workers, or elastic.minReplicas of them, plus the launcher with launcherStart Immediately)",
        "fieldPath": ".runPolicy.scheduling.gang.minAvailable",
    }
