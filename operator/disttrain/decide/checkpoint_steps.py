"""A checkpoint before a stop the operator chooses (issue 33): a Kueue eviction or preemption,
runPolicy.suspend, and the whole-job restart that follows a pod's disruption. Failures stop at
once (there is nothing to save that the training could still save). A disruption (a drain, a taint
eviction, the scheduler's preemption) writes the pod's DisruptionTarget condition and deletes it in
the same breath (k8s 1.36, pkg/registry/core/pod/storage/eviction.go,
pkg/scheduler/framework/preemption/executor.go): that pod hears of it by its SIGTERM alone and saves
within its own grace period (disttrain_progress/keras_checkpoint.py), and its peers, which the
restart would delete next, are asked as for any stop and kept until it is confirmed.

The ladder:
- no request yet: one is made (an id, the deadline `checkpointGraceSeconds` from now) and written to
  `status.checkpoint`; every running pod of the job gets it as its `disttrain.dev/checkpoint-request`
  annotation, which the kubelet writes to the pod's checkpoint-request file within a second of the
  pod's update (a downward-API volume is set up again on every pod sync: k8s 1.36,
  pkg/volume/downwardapi RequiresRemount). No pod needs the API or polls the operator, and every
  rank reads the same request, which a collective save (MultiWorkerMirrored) needs;
- the training saves and reports the checkpoint over the progress endpoint (a report with
  `checkpoint: {request, step, path}`), naming the request, or arriving after it was made (a pod's
  save on its SIGTERM names none it could read): the stop goes on, `status.lastCheckpoint` says what was
  saved, and a Checkpointed event;
- no confirmation by the deadline: the stop goes on, with a Warning event saying so.

Skipped, the stop going on at once: a grace of 0, no progress endpoint to confirm through, or no
pod running to ask. The request lives in the status, so an operator restarted mid-wait keeps the
same deadline; a confirmation that arrived just before the restart is lost with the process's
memory, and the stop then waits for the deadline (a bound, never a hang).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from disttrain.api.observed import ObservedPod
from disttrain.api.status import timestamp
from disttrain.api.times import parse_timestamp
from disttrain.builders.checkpoint import REQUEST_ANNOTATION
from disttrain.decide.passes import Pass
from disttrain.decide.plan import Event
from disttrain.decide.policies.failure import Restart
from disttrain.decide.reasons import Reason

HOLD_WORDS = "the training is asked for a checkpoint first"
ID_FORMAT = "%Y%m%d-%H%M%S-%f"


def hold_for_checkpoint(p: Pass, why: str, cause: str) -> bool:
    """True while the stop waits for the training's checkpoint (the pods stay); False: stop now.
    `why`: Evicted or Suspended, as status.checkpoint.reason says; `cause`, in the job's message
    while it waits (Kueue's own words for an eviction), so that `kubectl describe` says both."""
    p.stopping = True
    pending = p.job.status.get("checkpoint")
    holding = _waiting(p, pending) if pending else _ask(p, why)
    if holding:
        asked = p.plan.status["checkpoint"]
        p.plan.status["message"] = (f"{cause}; {HOLD_WORDS} (request "
                                    f"{asked['request']}), then its pods are stopped, at {asked['deadline']} at the "
                                    f"latest (runPolicy.checkpointGraceSeconds)")
    return holding


def hold_restart(p: Pass, decision: Restart, failed: Sequence[ObservedPod]) -> bool:
    """A whole-job restart for a pod someone else is ending: its peers wait for the checkpoint."""
    disrupted = next((pod for pod in failed if pod.terminating and pod.disruption is not None), None)
    if decision.give_up or not decision.whole_job:
        return False
    if disrupted is not None:
        return hold_for_checkpoint(p, "Disrupted", f"{disrupted.replica_type} {disrupted.index} (pod {disrupted.name})"
                                                   f" is being ended from outside ({disrupted.disruption})")
    # The disrupted pod gone (it saved on its SIGTERM and exited): the request made for it stands.
    pending = p.job.status.get("checkpoint") or {}
    return pending.get("reason") == "Disrupted" and hold_for_checkpoint(p, "Disrupted", "a pod was ended from outside")


def _hearing(p: Pass) -> list[ObservedPod]:
    """The running pods that have the request file (one made by an operator before it has none)."""
    return [pod for pod in p.live if pod.phase == "Running" and pod.hears_checkpoint]


def _ask(p: Pass, why: str) -> bool:
    running = _hearing(p)
    grace = p.spec.run_policy.checkpoint_grace_seconds
    if grace <= 0 or p.job.report_to is None or not running:
        return False
    request = request_id(p.now)
    p.plan.status["checkpoint"] = {"request": request, "reason": why, "requestedAt": timestamp(p.now),
                                   "deadline": timestamp(p.now + datetime.timedelta(seconds=grace))}
    p.plan.annotate = [(pod, {REQUEST_ANNOTATION: request}) for pod in running]
    p.plan.events.append(Event("Normal", Reason.CHECKPOINT_REQUESTED,
                                 f"{why}: asked the training for a checkpoint (request {request}) before its pods "
                                 f"are stopped; waiting up to {grace}s (runPolicy.checkpointGraceSeconds)"))
    p.plan.requeue_within(grace)
    return True


def _waiting(p: Pass, pending: dict[str, str]) -> bool:
    confirmed = p.job.progress.checkpoint if p.job.progress else None
    asked = asked_at(pending) or p.now
    if confirmed is not None and confirmed.report.checkpoint is not None and (
            confirmed.report.checkpoint.request == pending.get("request") or confirmed.at >= asked):
        saved = confirmed.report.checkpoint
        waited = max(0.0, (confirmed.at - asked).total_seconds())
        p.plan.status["lastCheckpoint"] = {"request": saved.request, "step": saved.step, "path": saved.path,
                                           "confirmedAt": timestamp(confirmed.at), "waitedSeconds": round(waited, 3)}
        p.plan.status.pop("checkpoint", None)
        at = f" at step {saved.step}" if saved.step is not None else ""
        as_named = "" if saved.request == pending.get("request") else f" (it names {saved.request})"
        p.plan.events.append(Event("Normal", Reason.CHECKPOINTED,
                                     f"{confirmed.reporter} saved a checkpoint{at} ({saved.path or 'no path given'}) "
                                     f"{waited:.1f}s after request {pending.get('request')}{as_named}: "
                                     f"the pods are stopped now"))
        return False
    deadline = parse_timestamp(pending.get("deadline")) or p.now
    # Asked again while it stands: the controller patches each pod once, so this only repeats a
    # patch that failed, or one a restarted operator can't know was made.
    hearing = _hearing(p)
    p.plan.annotate = [(pod, {REQUEST_ANNOTATION: str(pending.get("request"))}) for pod in hearing]
    if not hearing:  # every pod that could save has ended: nothing to wait for
        p.plan.status.pop("checkpoint", None)
        p.plan.events.append(Event("Warning", Reason.CHECKPOINT_TIMED_OUT,
                                     f"no checkpoint confirmed for request {pending.get('request')}, and no pod is "
                                     f"left running to make one: the stop goes on"))
        return False
    if p.now >= deadline:
        p.plan.status.pop("checkpoint", None)
        p.plan.events.append(Event("Warning", Reason.CHECKPOINT_TIMED_OUT,
                                     f"no checkpoint confirmed for request {pending.get('request')} within "
                                     f"{p.spec.run_policy.checkpoint_grace_seconds}s "
                                     f"(runPolicy.checkpointGraceSeconds): the pods are stopped without it"))
        return False
    p.plan.requeue_within((deadline - p.now).total_seconds())
    return True


def drop_when_not_stopping(p: Pass) -> None:
    """A request whose stop was called off (suspend false again, the eviction gone, the job ended)
    is dropped and the pods' files emptied: a training reading it would save for nothing (the Keras
    hook would, and then wait a minute for a stop that never comes). The emptying is derived from
    the pods' annotations, not from the status alone: the status is written before the pods are
    patched, so a patch that failed (or an operator gone in between) is made by a later pass."""
    if p.stopping:
        return
    pending = bool(p.job.status.get("checkpoint"))
    deleting = {pod.uid for pod in p.plan.delete}
    # Every pod that could have been asked while the request is dropped: the watch may not show
    # this pass the annotation the last one made (the controller patches each pod once).
    hearing = {pod.uid for pod in _hearing(p)} if pending else set()
    asked = [pod for pod in p.live if pod.uid not in deleting and (pod.asked_checkpoint or pod.uid in hearing)]
    p.plan.annotate = [(pod, {REQUEST_ANNOTATION: ""}) for pod in asked]
    if not pending:
        return
    p.plan.status.pop("checkpoint", None)
    if HOLD_WORDS in str(p.plan.status.get("message")):
        p.plan.status["message"] = "the stop was called off before the checkpoint: the training goes on"


def request_id(now: datetime.datetime) -> str:
    """Unique to the job for as long as it lives (one request a stop, never two in a microsecond)."""
    return f"c{now.strftime(ID_FORMAT)}"


def asked_at(pending: dict[str, str]) -> datetime.datetime | None:
    """When the request was made, to the microsecond its id holds (requestedAt has whole seconds)."""
    try:
        made = datetime.datetime.strptime(str(pending.get("request"))[1:], ID_FORMAT)
        return made.replace(tzinfo=datetime.UTC)
    except ValueError:
        return parse_timestamp(pending.get("requestedAt"))
