"""Startup policy: which pods may be created now.

MPI's launcher waits for every worker to be Ready unless told to start immediately
(spec.mpi.launcherStart): mpirun fails at once if a worker's sshd isn't listening yet.

With gang scheduling this must not deadlock: a PodGroup whose minMember counted the launcher
would hold the workers until the launcher exists, while the launcher waits for Ready workers.
So a gang is the pods created together: the workers, plus the launcher only with
launcherStart: Immediately; a launcher created later joins the already-admitted group.
"""

from __future__ import annotations

from collections.abc import Sequence

from disttrain.api.constants import JOB_NAME_LABEL, REPLICA_TYPE_LABEL
from disttrain.api.objects import PodKey
from disttrain.api.observed import ObservedPod
from disttrain.api.spec import JobSpec, LauncherStart, ReplicaType


def launcher_waits(spec: JobSpec) -> bool:
    return (spec.mpi is not None and spec.mpi.launcher is not None
            and spec.mpi.launcher_start is LauncherStart.WHEN_WORKERS_READY)


def may_start(spec: JobSpec, key: PodKey, live: Sequence[ObservedPod], workers: int | None = None) -> bool:
    """`workers`: how many the launcher waits for (default spec's; an elastic job's wanted count)."""
    if key.replica_type != ReplicaType.LAUNCHER or not launcher_waits(spec):
        return True
    ready = ready_workers(live)
    return all(i in ready for i in range(spec.num_workers if workers is None else workers))


def ready_workers(live: Sequence[ObservedPod]) -> set[int]:
    """Indexes of the workers that are Running and Ready: what the MPI launcher waits for."""
    return {p.index for p in live if p.replica_type == ReplicaType.WORKER and p.ready and p.phase == "Running"}


def waiting_for_workers(spec: JobSpec, job: str, live: Sequence[ObservedPod]) -> str:
    """What a job whose launcher waits says in `status.message`. The count moves only as
    workers become Ready, so this writes rarely and never flaps."""
    return (f"{len(ready_workers(live))}/{spec.num_workers} workers Ready; the launcher starts when all are "
            f"(launcherStart: WhenWorkersReady). Pending workers: kubectl describe pod -l "
            f"{JOB_NAME_LABEL}={job},{REPLICA_TYPE_LABEL}={ReplicaType.WORKER}")
