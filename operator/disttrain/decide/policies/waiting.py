"""Why a pending job waits, said in `status.reason` and `status.message`.

A job that isn't running yet always says what holds it back, from what the operator already
watches (its pods; for Volcano, its group): no extra API reads. The first answer that applies wins:

1. pods of an earlier job of the same name are still being deleted;
2. its gang is not scheduled yet (the scheduler's own words);
3. a pod the scheduler can't place (its words: `0/4 nodes are available: ...`);
4. a container that can't start: its image can't be pulled, its config can't be made, or it keeps
   crashing (the kubelet's words);
5. MPI: the launcher waits for Ready workers.

(Waiting in a Kueue queue is a phase of its own, Queued: queue_steps.py.) A running job says so
too when one of its containers is stuck (`pod_trouble`), and stops saying it once it isn't.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from disttrain.api.observed import ObservedPod
from disttrain.api.spec import GangProvider, JobSpec, ReplicaType
from disttrain.builders import gang
from disttrain.builders.gang import GroupStatus
from disttrain.builders.naming import pod_name
from disttrain.decide.policies import startup
from disttrain.decide.reasons import Reason


@dataclass(frozen=True)
class Waiting:
    reason: Reason
    message: str


def blocked_names(wanted: Sequence[str], own: Sequence[ObservedPod], foreign: Sequence[ObservedPod]) -> list[str]:
    """The job's pod names still held by pods of an earlier job of the same name."""
    present = {p.name for p in own}
    return sorted({p.name for p in foreign if p.name in wanted and p.name not in present})


def earlier_job(job: str, blocked: Sequence[str]) -> Waiting:
    several = len(blocked) > 1
    return Waiting(Reason.WAITING_FOR_PREVIOUS_JOB, (
        f"{'pods' if several else 'pod'} {', '.join(blocked)} of an earlier DistTrainJob named {job} "
        f"{'are' if several else 'is'} still being deleted; this job's pods are created once "
        f"{'they are' if several else 'it is'} gone"))


def why_waiting(job: str, spec: JobSpec, wanted: Sequence[str], own: Sequence[ObservedPod],
                foreign: Sequence[ObservedPod], provider: GangProvider | None,
                group: GroupStatus | None) -> Waiting | None:
    blocked = blocked_names(wanted, own, foreign)
    if blocked:
        return earlier_job(job, blocked)
    settings = spec.run_policy.scheduling.gang
    if settings is not None and provider is not None:
        message = gang.waiting(job, spec, settings, provider, own, group)
        if message is not None:
            return Waiting(Reason.WAITING_FOR_GANG, message)
    live = [p for p in own if not p.terminating]
    trouble = pod_trouble(live)
    if trouble is not None:
        return trouble
    if startup.launcher_waits(spec) and pod_name(job, ReplicaType.LAUNCHER, 0) not in {p.name for p in own}:
        return Waiting(Reason.WAITING_FOR_WORKERS, startup.waiting_for_workers(spec, job, live))
    return None


# The reason a stuck container's kubelet reason is reported under.
STUCK = {"ErrImagePull": Reason.IMAGE_PULL_BACKOFF, "ImagePullBackOff": Reason.IMAGE_PULL_BACKOFF,
         "ErrImageNeverPull": Reason.IMAGE_PULL_BACKOFF, "InvalidImageName": Reason.IMAGE_PULL_BACKOFF,
         "CrashLoopBackOff": Reason.CRASH_LOOP_BACKOFF}
POD_TROUBLE = frozenset({Reason.UNSCHEDULABLE, Reason.IMAGE_PULL_BACKOFF, Reason.CRASH_LOOP_BACKOFF,
                         Reason.CONTAINER_NOT_STARTING})


def pod_trouble(live: Sequence[ObservedPod]) -> Waiting | None:
    """The first pod the scheduler can't place or whose container can't get going."""
    for pod in sorted(live, key=lambda p: p.name):
        if pod.unschedulable and not pod.scheduled:
            return Waiting(Reason.UNSCHEDULABLE, f"pod {pod.name} can't be scheduled: {pod.unschedulable}")
    for pod in sorted(live, key=lambda p: p.name):
        if pod.stuck:
            kind = pod.stuck.split(":", 1)[0]
            return Waiting(STUCK.get(kind, Reason.CONTAINER_NOT_STARTING), f"pod {pod.name}: {pod.stuck}")
    return None
