"""Failure policy: which failed pods are retried, how, and when the job has had enough.

A replica's restartPolicy decides whether its failed pod may be replaced (`is_retryable`);
runPolicy.restartScope whether the pod alone or the whole job is recreated; runPolicy.backoffLimit
how many restarts (the operator's and the kubelet's together) the job may use.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from disttrain.api.observed import ObservedPod
from disttrain.api.spec import JobSpec, ReplicaType, RestartPolicy, RestartScope
from disttrain.api.times import parse_timestamp
from disttrain.decide.reasons import Reason

# How long a failed MPI launcher, or a synchronous job's pod that failed by its own verdict, waits
# to be judged on its own (grace_left). mpirun exits the moment a rank's connection drops; the
# worker whose death caused it is reported by the kubelet as a pod of its own, in the same relist
# (about a second) or the next, so either pod's update may reach us first. (tests/e2e: a Horovod
# worker's sshd SIGKILLed; the job must restart, not fail on mpirun's exit 1. The same for a
# MultiWorkerMirrored peer's exit 1 after a worker's SIGKILL.)
PEER_GRACE = datetime.timedelta(seconds=5)


def is_retryable(policy: RestartPolicy, exit_code: int | None) -> bool:
    """Whether a failed pod may be replaced. With ExitCode, 128+ means the process was killed
    (a signal, OOM, eviction): worth a retry; 1-127 is the program's own verdict. A pod that
    failed with no exit code at all (evicted, node lost) counts as killed."""
    if policy is RestartPolicy.NEVER:
        return False
    if policy is RestartPolicy.EXIT_CODE:
        return exit_code is None or exit_code >= 128
    # OnFailure / Always: the kubelet restarts containers; a pod that fails anyway was evicted.
    return True


def caused_by_a_worker(pod: ObservedPod, pods: Sequence[ObservedPod]) -> bool:
    """An MPI launcher that failed while a worker of its attempt failed or is going away: mpirun
    only reported that worker's end, which decides the job's fate (a restart, or the worker's own
    fatal exit code)."""
    return pod.replica_type == ReplicaType.LAUNCHER and any(
        o.replica_type == ReplicaType.WORKER and (o.phase == "Failed" or o.terminating) for o in pods)


def _own_verdict(spec: JobSpec, pod: ObservedPod) -> bool:
    """A failure its replica's policy doesn't retry (the program's own exit code, or any under Never)."""
    return not is_retryable(spec.replicas[pod.replica_type].restart_policy, pod.exit_code)


def caused_by_a_peer(spec: JobSpec, pod: ObservedPod, pods: Sequence[ObservedPod]) -> bool:
    """An MPI launcher's failure is its workers' (above). Likewise in synchronous training
    (restartScope Job): a peer killed takes the others down by their own exit (TensorFlow's
    collectives: gRPC "Socket closed", exit 1), and the killed peer's retryable failure decides
    (tests/e2e: a MultiWorkerMirrored worker SIGKILLed; its peer's exit 1 failed the job one run
    in three before this)."""
    if caused_by_a_worker(pod, pods):
        return True
    if spec.run_policy.restart_scope is not RestartScope.JOB or not _own_verdict(spec, pod):
        return False
    return any(o is not pod and o.replica_type in spec.replicas and (
        (o.phase == "Failed" and not _own_verdict(spec, o)) or (o.terminating and o.disruption is not None))
        for o in pods)


def grace_left(spec: JobSpec, pod: ObservedPod, now: datetime.datetime) -> float:
    """Seconds until a failed pod may be judged on its own: an MPI launcher, and in a job of several
    pods restarted as a whole a failure by the pod's own verdict (a killed peer's loss, which
    explains it, may reach us a moment later); 0 for any other."""
    waits = pod.replica_type == ReplicaType.LAUNCHER or (
        spec.run_policy.restart_scope is RestartScope.JOB and _own_verdict(spec, pod)
        and sum(r.replicas for r in spec.replicas.values()) > 1)
    finished = parse_timestamp(pod.finished_at) if waits else None
    return 0.0 if finished is None else max(0.0, (finished + PEER_GRACE - now).total_seconds())


def describe_failure(pod: ObservedPod) -> str:
    how = f"exited with code {pod.exit_code}" if pod.exit_code is not None else "failed"
    if pod.init_container:
        how = f"init container {pod.init_container} {how}"
    why = f" ({pod.reason})" if pod.reason else ""
    return f"{pod.replica_type} {pod.index} (pod {pod.name}) {how}{why}"


def fatal_failure(spec: JobSpec, failed: Sequence[ObservedPod]) -> str | None:
    """The message of the first failure its replica's restartPolicy does not retry, if any."""
    for pod in failed:
        policy = spec.replicas[pod.replica_type].restart_policy
        if not is_retryable(policy, pod.exit_code):
            rule = "does not retry exit codes 1-127" if policy is RestartPolicy.EXIT_CODE else "does not retry"
            return f"{describe_failure(pod)}; restartPolicy {policy.value} {rule}"
    return None


@dataclass(frozen=True)
class Restart:
    """What to do about retryable failures: restart (`give_up` False) or fail the job."""

    give_up: bool
    reason: Reason
    message: str
    restarts: int  # operator restarts counted after this decision
    whole_job: bool


def restart(spec: JobSpec, restarts_so_far: int, kubelet_restarts: int,
            failed: Sequence[ObservedPod], lost: Sequence[str], whole_job: bool | None = None) -> Restart | None:
    """The decision for pods that failed retryably or were deleted from under a running job
    (`lost`, by name); None when there are none. `whole_job`: None for runPolicy.restartScope's
    say (an elastic job replaces its workers alone whatever it says)."""
    if not failed and not lost:
        return None
    whole = spec.run_policy.restart_scope is RestartScope.JOB if whole_job is None else whole_job
    what = describe_failure(failed[0]) if failed else f"pod {lost[0]} was deleted"
    return decide(spec, restarts_so_far, kubelet_restarts, what, 1 if whole else len(failed) + len(lost), whole,
                  Reason.POD_FAILED if failed else Reason.POD_DELETED)


def decide(spec: JobSpec, restarts_so_far: int, kubelet_restarts: int, what: str, added: int, whole_job: bool,
           reason: Reason) -> Restart:
    """Restart (`added` restarts more) if runPolicy.backoffLimit allows it, else give up; `what` happened."""
    limit = spec.run_policy.backoff_limit
    if restarts_so_far + kubelet_restarts + added > limit:
        return Restart(True, Reason.BACKOFF_LIMIT_EXCEEDED,
                       f"{what}, and the job has used all {limit} restarts of runPolicy.backoffLimit",
                       restarts_so_far, whole_job)
    scope = "the whole job" if whole_job else ("the pods" if added > 1 else "the pod")
    return Restart(False, reason, f"{what}; restarting {scope} (restart {restarts_so_far + added} of {limit})",
                   restarts_so_far + added, whole_job)


def kubelet_backoff_exceeded(spec: JobSpec, restarts_so_far: int, kubelet_restarts: int) -> str | None:
    """Containers the kubelet restarts (OnFailure / Always) count toward backoffLimit too."""
    limit = spec.run_policy.backoff_limit
    if restarts_so_far + kubelet_restarts > limit:
        return f"containers restarted {kubelet_restarts} times, more than runPolicy.backoffLimit ({limit})"
    return None
