"""Elastic MPI policy (spec.mpi.elastic): which workers Horovod may use, when the ones scaled away
go, and how long the job may run short of minReplicas.

Horovod's elastic driver (horovodrun --host-discovery-script) runs the launcher's
discover_hosts.sh every second and adds or drops hosts at its workers' next commit; the operator
only decides what that script prints, from the pods as they are (never from memory), and:

- the wanted count is spec.mpi.worker.replicas now, capped by what Kueue admitted for a queued job;
- discovery lists the workers that are Running and Ready (sshd listens) below the wanted count;
- a worker above it has left discovery, and is deleted scaleDownDelaySeconds after the count fell
  (status.elastic.scaleDownSince), highest indexes all at once;
- a worker that fails or is deleted is replaced alone, the launcher untouched (each one counts a
  restart toward backoffLimit); a job with fewer than minReplicas Ready workers for more than
  belowMinGraceSeconds (status.elastic.belowMinSince) is restarted whole, by the normal policy.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from disttrain.api.constants import JOB_NAME_LABEL, REPLICA_TYPE_LABEL
from disttrain.api.observed import ObservedPod
from disttrain.api.spec import Elastic, JobSpec, ReplicaType
from disttrain.api.status import timestamp
from disttrain.api.times import parse_timestamp


def settings(spec: JobSpec) -> Elastic | None:
    return spec.mpi.elastic if spec.mpi is not None else None


def wanted_workers(spec: JobSpec, admitted: int | None) -> int:
    """spec.mpi.worker.replicas, or fewer when Kueue admitted fewer (its partial admission)."""
    assert spec.mpi is not None
    wanted = spec.mpi.worker.replicas
    return wanted if admitted is None else min(wanted, admitted)


def surplus(spec: JobSpec, pod: ObservedPod, wanted: int) -> bool:
    """A worker above the wanted count: scaled away, never judged as a failure."""
    return settings(spec) is not None and pod.replica_type == ReplicaType.WORKER and pod.index >= wanted


def discovered(live: Sequence[ObservedPod], wanted: int) -> list[ObservedPod]:
    """The workers discover_hosts.sh prints: Running and Ready (sshd listens), within the wanted count."""
    return sorted((p for p in live if p.replica_type == ReplicaType.WORKER and p.index < wanted
                   and p.phase == "Running" and p.ready), key=lambda p: p.index)


def bounds(spec: JobSpec) -> str:
    elastic = settings(spec)
    assert elastic is not None
    return f"{elastic.min_replicas}..{elastic.max_replicas}"


def selector(job: str) -> str:
    return f"{JOB_NAME_LABEL}={job},{REPLICA_TYPE_LABEL}={ReplicaType.WORKER}"


@dataclass(frozen=True)
class Timer:
    """A wait that started at `since` (kept in the status, so a restarted operator resumes it)."""
    since: str | None  # None: nothing to wait for
    left: float  # seconds until it is due (<= 0: due now)


def timer(started: str | None, now: datetime.datetime, active: bool, seconds: int) -> Timer:
    if not active:
        return Timer(None, 0.0)
    since = started or timestamp(now)
    begun = parse_timestamp(since) or now
    return Timer(since, (begun + datetime.timedelta(seconds=seconds) - now).total_seconds())


@dataclass(frozen=True)
class Leaving:
    """The workers above the wanted count: since when each left discovery (kept in the status), the
    seconds until the next of them is due (None: none waits), and those to delete now."""
    since: dict[str, str]  # pod name -> when it left discovery
    next_due: float | None
    going: list[ObservedPod]


def scale_down(spec: JobSpec, live: Sequence[ObservedPod], wanted: int, started: Mapping[str, str],
               now: datetime.datetime, legacy: str | None = None) -> Leaving:
    """Each leaving worker waits scaleDownDelaySeconds from when it left discovery, on a timer of
    its own (issue 31: 4 -> 3 at T and 3 -> 2 at T+25 s deleted worker-2 at T+30 s, five seconds
    after it left, on the first one's timer); one that has ended already goes at once (nothing
    left to drain). `legacy`: the one scaleDownSince of a status written before per-worker timers."""
    elastic = settings(spec)
    assert elastic is not None
    leaving = [p for p in live if surplus(spec, p, wanted)]
    running = [p for p in leaving if p.phase not in ("Succeeded", "Failed")]
    since: dict[str, str] = {}
    going = [p for p in leaving if p not in running]
    next_due: float | None = None
    for pod in running:
        wait = timer(started.get(pod.name) or (None if started else legacy), now, True,
                     elastic.scale_down_delay_seconds)
        if wait.left <= 0:
            going.append(pod)
            continue
        since[pod.name] = str(wait.since)
        next_due = wait.left if next_due is None else min(next_due, wait.left)
    return Leaving(since, next_due, going)


def short_of_min(spec: JobSpec, live: Sequence[ObservedPod], wanted: int, started: str | None, running: bool,
                 now: datetime.datetime) -> Timer:
    """How long a running job has had fewer than minReplicas workers in discovery."""
    elastic = settings(spec)
    assert elastic is not None
    below = running and len(discovered(live, wanted)) < elastic.min_replicas
    return timer(started, now, below, elastic.below_min_grace_seconds)


def below_min_message(spec: JobSpec, live: Sequence[ObservedPod], wanted: int) -> str:
    elastic = settings(spec)
    assert elastic is not None
    return (f"only {len(discovered(live, wanted))} of spec.mpi.elastic.minReplicas {elastic.min_replicas} workers "
            f"Ready for more than belowMinGraceSeconds ({elastic.below_min_grace_seconds} s)")


def is_running(live: Sequence[ObservedPod], wanted: int, elastic: Elastic) -> bool:
    """An elastic job runs while its launcher does with at least minReplicas workers Running."""
    launcher = any(p.replica_type == ReplicaType.LAUNCHER and p.phase in ("Running", "Succeeded") for p in live)
    workers = sum(1 for p in live if p.replica_type == ReplicaType.WORKER and p.index < wanted and p.phase == "Running")
    return launcher and workers >= elastic.min_replicas
