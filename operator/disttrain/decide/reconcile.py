"""One reconcile: the job and the pods observed now -> the writes that move it forward.

A pure function. The controller reads the job and its pods from in-memory indexes, calls
`reconcile`, and carries out the returned `Plan`. The decisions are a ladder of named steps, each
asking one policy (`disttrain.decide.policies`) and stopping the ladder once the job's fate for this pass
is decided:

    managed elsewhere? -> (spec.managedBy) only its Workload, for MultiKueue: dispatch_steps
    finished?   -> clean up, delete after the TTL
    suspended?  -> delete the pods, phase Suspended
    otherwise   -> resume, then: too large to start, uncountable GPU claims, queue, gang, deadline, success, fatal
                   failure, restart, stalled training, kubelet backoff, claim objects not there yet, start

Only the job's own pods count: those whose controller reference carries its UID. Pods of an
earlier job of the same name (deleted, its pods not yet collected) are waited out, never counted.
Pod names are deterministic (`<job>-<type>-<index>`), so a repeated create is refused by the API
server rather than duplicating a pod.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from disttrain.api.observed import ObservedPod
from disttrain.api.spec import ReplicaType, RestartScope
from disttrain.api.status import FINISHED, Phase, set_condition, timestamp
from disttrain.builders import gang, mpi
from disttrain.builders.desired import config_map, job_pod
from disttrain.decide import (
    checkpoint_steps,
    claim_steps,
    dispatch_steps,
    elastic_steps,
    final_steps,
    gang_steps,
    name_reuse_steps,
    queue_steps,
    size_steps,
    stall_steps,
    supporting_steps,
)
from disttrain.decide.passes import JobState, Pass
from disttrain.decide.plan import Plan
from disttrain.decide.policies import cleanup, deadline, elastic, failure, startup, success, waiting
from disttrain.decide.reasons import Reason

# How often a gang whose group must be admitted first (Volcano) looks at it again.
GROUP_POLL_SECONDS = 2.0
# The most pods one pass builds: the rest are built by the next (at once, once these are seen).
# A TensorFlow pod's TF_CONFIG lists the whole cluster, up to 128 KiB each: built all at once, a
# 5,000-worker job grew the controller from 57 to 1,081 MB in 20 s (issue 43), quadratic in workers.
MAX_PODS_PER_PASS = 64


def reconcile(job: JobState, pods: Sequence[ObservedPod], now: datetime.datetime,
              ssh_keys: mpi.SSHKeys | None = None) -> Plan:
    """`ssh_keys`: for an MPI job, the key pair its Secret gets if the Secret must be made."""
    p = Pass(job, pods, now, ssh_keys)
    if dispatch_steps.managed_elsewhere(p.spec):  # spec.managedBy: only its Workload here (MultiKueue)
        return dispatch_steps.follow(p)
    stalled = stall_steps.NOT_JUDGED
    if p.phase in FINISHED:
        p.plan.delete = cleanup.pods_to_clean(p.spec.run_policy.clean_pod_policy, p.live)
        p.release_group()
    elif p.spec.run_policy.suspend:
        suspend(p)
    else:
        resume_if_suspended(p)
        stalled = stall_steps.judge(p)
        (size_steps.refuse_too_large(p) or claim_steps.refuse_uncountable(p) or queue_steps.hold_in_queue(p)
         or gang_steps.choose_provider(p) or fail_past_deadline(p) or succeed(p) or fail_fatally(p)
         or restart_failed(p) or restart_below_min(p) or restart_stalled(p, stalled) or fail_kubelet_backoff(p)
         or claim_steps.wait_for_claims(p) or start(p))
    queue_steps.report(p)
    elastic_steps.report(p)
    claim_steps.record(p)
    final_steps.report(p, stalled)
    return p.summarize()


# -- the steps ---------------------------------------------------------------------------------


def suspend(p: Pass) -> None:
    if checkpoint_steps.hold_for_checkpoint(p, "Suspended", "runPolicy.suspend is true"):  # pods, quota stay
        return
    p.plan.delete = list(p.live)
    name_reuse_steps.track(p, held=name_reuse_steps.names_taken(p))
    p.release_group()
    queue_steps.pause(p, active=False)
    if p.phase is not Phase.SUSPENDED:
        p.move(Phase.SUSPENDED, Reason.JOB_SUSPENDED, "runPolicy.suspend is true: the job's pods are deleted")


def resume_if_suspended(p: Pass) -> None:
    if p.phase is Phase.SUSPENDED:
        # Start afresh, and the deadline counts from now (as a Kubernetes Job does).
        p.move(Phase.PENDING, Reason.JOB_RESUMED, "runPolicy.suspend is false again: starting afresh")
        p.plan.status["startTime"] = timestamp(p.now)
    queue_steps.pause(p, active=True)
    if p.job.queue is None and "startTime" not in p.plan.status:  # a queued job starts when admitted
        p.plan.status["startTime"] = timestamp(p.now)  # strftime: formatted only when it is written


def fail_past_deadline(p: Pass) -> bool:
    remaining = deadline.deadline_remaining(p.spec.run_policy, p.plan.status.get("startTime"), p.now)
    if remaining is None:
        return False
    if remaining > 0:
        p.plan.requeue_within(remaining)
        return False
    message = deadline.deadline_message(p.spec.run_policy)
    if p.plan.status.get("reason") == Reason.WAITING_FOR_GANG:
        message += f"; its gang was never scheduled: {p.plan.status.get('message')}"
    return p.finish(Phase.FAILED, Reason.DEADLINE_EXCEEDED, message)


def succeed(p: Pass) -> bool:
    message = success.success_message(p.spec, p.own)
    return message is not None and p.finish(Phase.SUCCEEDED, Reason.JOB_SUCCEEDED, message)


def judged_failures(p: Pass) -> list[ObservedPod]:
    """The failed pods (`Pass.failed`) to judge now. An MPI launcher's failure is its workers' when one of them
    failed or is going too, and a synchronous job's pod that ended by its own verdict is a killed peer's
    when one was; each waits a moment for theirs otherwise (failure.PEER_GRACE)."""
    judged = []
    for pod in p.failed:
        if elastic.surplus(p.spec, pod, p.wanted_workers):  # scaled away: deleted, not judged (start)
            continue
        if failure.caused_by_a_peer(p.spec, pod, p.own):
            continue
        if (left := failure.grace_left(p.spec, pod, p.now)) > 0:
            p.plan.requeue_within(left)
            continue
        judged.append(pod)
    return judged


def fail_fatally(p: Pass) -> bool:
    message = failure.fatal_failure(p.spec, judged_failures(p))
    return message is not None and p.finish(Phase.FAILED, Reason.REPLICA_FAILED, message)


def restart_failed(p: Pass) -> bool:
    """Retryable failures, and pods gone from a running job (deleted by a user, a drain, a node gone; the
    operator deletes pods only as it leaves Running). An elastic job replaces a failed worker alone, the
    others untouched; a worker merely gone is made again uncounted (as a scale-up's new worker)."""
    failed = judged_failures(p)
    present = {pod.name for pod in p.live} | {pod.name for pod in p.failed}
    lost = [name for name in p.wanted if name not in present] if p.phase is Phase.RUNNING else []
    workers_alone = None
    if elastic.settings(p.spec) is not None:
        lost = [name for name in lost if p.wanted[name].replica_type != ReplicaType.WORKER]
        if all(pod.replica_type == ReplicaType.WORKER for pod in failed) and not lost:
            workers_alone = False
    decision = failure.restart(p.spec, p.restarts_so_far, p.kubelet_restarts, failed, lost, whole_job=workers_alone)
    if decision is None:
        return False
    return carry_out(p, decision, failed)


def restart_below_min(p: Pass) -> bool:
    """An elastic job short of minReplicas Ready workers for longer than its grace restarts whole."""
    decision = elastic_steps.below_min_restart(p)
    return decision is not None and carry_out(p, decision, [])


def restart_stalled(p: Pass, stalled: stall_steps.Judged) -> bool:
    """runPolicy.onStall: Restart, as a failure's whole-job restart (decide/stall_steps.py)."""
    decision = stall_steps.restart_decision(p, stalled)
    return decision is not None and carry_out(p, decision, [])


def carry_out(p: Pass, decision: failure.Restart, failed: Sequence[ObservedPod]) -> bool:
    if decision.give_up:
        return p.finish(Phase.FAILED, decision.reason, decision.message)
    if checkpoint_steps.hold_restart(p, decision, failed):  # the peers of a pod ended from outside
        return True
    p.plan.status["operatorRestarts"] = decision.restarts
    # A disrupted pod, already going, is deleted again to name it in deletedPods: never judged twice.
    p.plan.delete = [*p.live, *(pod for pod in failed if pod.terminating)] if decision.whole_job else list(failed)
    if decision.whole_job:
        name_reuse_steps.track(p, held=True)
        p.release_group()
        # `Created` belongs to the attempt: the next one has no pod yet.
        p.plan.status["conditions"] = set_condition(
            list(p.plan.status.get("conditions") or []), "Created", False, decision.reason,
            "the attempt's pods are deleted for a whole-job restart", timestamp(p.now))
    elif elastic.settings(p.spec) is not None and p.phase is Phase.RUNNING:
        # Horovod carries on with the workers left; the job stays Running while the pod is made again.
        p.move(Phase.RUNNING, decision.reason, decision.message + "; the training goes on without it meanwhile",
               warning=True)
        return True
    p.move(Phase.RESTARTING, decision.reason, decision.message, warning=True)
    return True


def fail_kubelet_backoff(p: Pass) -> bool:
    message = failure.kubelet_backoff_exceeded(p.spec, p.restarts_so_far, p.kubelet_restarts)
    return message is not None and p.finish(Phase.FAILED, Reason.BACKOFF_LIMIT_EXCEEDED, message)


def start(p: Pass) -> bool:
    """Create what is missing, then say where the job stands."""
    elastic_steps.scale_down(p)
    create_missing(p)
    if (current := config_map(p.job.ref, p.spec, supporting_steps.running_workers(p))) is not None:
        p.plan.keep_current.append(current)
        if elastic.settings(p.spec) is not None:  # horovodrun reads discover_hosts.sh every second
            p.plan.remount = [pod for pod in p.live if pod.replica_type == ReplicaType.LAUNCHER]
    present = {pod.name for pod in p.own}
    if all(name in present for name in p.wanted) and not any(pod.terminating for pod in p.own):
        p.plan.status["conditions"] = set_condition(
            list(p.plan.status.get("conditions") or []), "Created", True, Reason.PODS_CREATED,
            f"created {len(p.wanted)} pods", timestamp(p.now))
    explain_waiting(p)
    running = {pod.name for pod in p.live if pod.phase in ("Running", "Succeeded")}
    # A failed pod reaching this step awaits its judgment (an MPI launcher's grace): not a change.
    unjudged = {pod.name for pod in p.failed}
    settings = elastic.settings(p.spec)
    if settings is not None:
        # Horovod runs with the workers it has: one being made (a scale-up, a replacement) doesn't
        # stop it, and too few for too long is restart_below_min's to judge.
        if p.phase is not Phase.RUNNING and elastic.is_running(p.live, p.wanted_workers, settings):
            p.move(Phase.RUNNING, Reason.ALL_PODS_RUNNING, f"the launcher and "
                   f"{len(elastic.discovered(p.live, p.wanted_workers))} workers are running")
    elif all(name in running for name in p.wanted):
        if p.phase is not Phase.RUNNING:
            p.move(Phase.RUNNING, Reason.ALL_PODS_RUNNING, f"all {len(p.wanted)} pods are running")
    elif p.phase is Phase.RUNNING and not all(name in running or name in unjudged for name in p.wanted):
        # A pod is back to Pending without our restart (replaced behind our back): say so.
        p.move(Phase.RESTARTING, Reason.PODS_NOT_RUNNING, "some pods are not running", warning=True)
    return True


def create_missing(p: Pass) -> None:
    """After a whole-job restart, nothing is created until every old pod is gone: a new worker
    must not meet an old peer still shutting down. The same while an earlier job of this name
    still holds one of the names (garbage collection is removing its pods): this job's pods start
    together, afresh. Then DNS must forget the old pods (name_reuse_steps.py). A gang's group
    comes first; Volcano's must be in its queue before pods."""
    # A running elastic job's worker going (scaled away, replaced) holds up nothing but its own name.
    whole = p.spec.run_policy.restart_scope is RestartScope.JOB and (
        elastic.settings(p.spec) is None or p.phase is not Phase.RUNNING)
    # restartScope Pod too, when the whole job starts again (a resume): its pods all resolve afresh.
    going = any(pod.terminating for pod in p.own) and (whole or name_reuse_steps.starting_whole(p))
    held = going or bool(waiting.blocked_names(list(p.wanted), p.own, p.foreign))
    name_reuse_steps.track(p, held)
    if held:
        return
    present = {pod.name for pod in p.own}
    to_create = [key for name, key in p.wanted.items()
                 if name not in present and startup.may_start(p.spec, key, p.live, p.wanted_workers)]
    supporting_steps.restore_lost(p)
    if not to_create:
        name_reuse_steps.forget(p)  # a wait nothing is left to make pods after (an operator rolled back and forth)
        return
    if name_reuse_steps.settling(p, p.job.name_reuse_seconds):
        return
    supporting_steps.plan(p)
    # A running job's group was admitted (its phase isn't read again then: control/groups.py); an
    # elastic job's worker added or replaced while it runs joins it.
    if p.provider is not None and p.phase is not Phase.RUNNING and not gang.admitted(p.provider, p.job.group):
        p.plan.requeue_within(GROUP_POLL_SECONDS)  # its phase is read, not watched
        return
    if len(to_create) > MAX_PODS_PER_PASS:
        to_create = to_create[:MAX_PODS_PER_PASS]
        p.plan.requeue_within(0.0)
    for key in to_create:
        pod = queue_steps.place(p, key, job_pod(p.job.ref, p.spec, key, p.provider, p.job.report_to, p.ssh_secret))
        if pod is None:  # the admission contradicts the template: the job has failed
            p.plan.create = []
            return
        p.plan.create.append(pod)


def explain_waiting(p: Pass) -> None:
    """What a pending job waits for, or which container of a running one is stuck, in `message` (no event)."""
    if p.phase is Phase.PENDING:
        found = waiting.why_waiting(p.job.ref.name, p.spec, list(p.wanted), p.own, p.foreign, p.provider, p.job.group)
    elif p.phase in (Phase.RUNNING, Phase.RESTARTING):
        found = waiting.pod_trouble(p.live)
        if found is None and p.phase is Phase.RUNNING and p.plan.status.get("reason") in waiting.POD_TROUBLE:
            p.plan.status["reason"] = Reason.ALL_PODS_RUNNING.value
            p.plan.status["message"] = f"all {len(p.wanted)} pods are running"
    else:
        return
    if found is not None:
        p.plan.status["reason"], p.plan.status["message"] = found.reason.value, found.message
