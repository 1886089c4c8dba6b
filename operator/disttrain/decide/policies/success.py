"""Success policy: when a job has succeeded (docs/api.md, "Completion").

TensorFlow: the chief; without one, worker 0 (ChiefOrWorker0) or every worker (AllWorkers).
ps and evaluator never decide. MPI: the launcher; with bootstrap Gloo (no launcher), every worker, as
horovodrun --gloo succeeds when every rank does.
"""

from __future__ import annotations

from collections.abc import Sequence

from disttrain.api.observed import ObservedPod
from disttrain.api.spec import JobSpec, ReplicaType, SuccessPolicy


def success_message(spec: JobSpec, pods: Sequence[ObservedPod]) -> str | None:
    """Why the job has succeeded, or None while it hasn't. `pods` are the job's own."""
    done = {(p.replica_type, p.index) for p in pods if p.phase == "Succeeded" and not p.terminating}
    if spec.mpi is not None and spec.mpi.launcher is not None:
        return "the launcher succeeded" if (ReplicaType.LAUNCHER, 0) in done else None
    if spec.mpi is not None:
        return _every_worker(spec, done)
    assert spec.tensorflow is not None
    if ReplicaType.CHIEF in spec.replicas:
        return "the chief succeeded" if (ReplicaType.CHIEF, 0) in done else None
    if spec.tensorflow.success_policy is SuccessPolicy.ALL_WORKERS:
        return _every_worker(spec, done)
    return "worker 0 succeeded" if (ReplicaType.WORKER, 0) in done else None


def _every_worker(spec: JobSpec, done: set[tuple[str, int]]) -> str | None:
    if all((ReplicaType.WORKER, i) in done for i in range(spec.num_workers)):
        return f"all {spec.num_workers} workers succeeded"
    return None
