"""runPolicy.cleanPodPolicy: which pods to delete when the job finishes. Running (the default)
ends what would otherwise run forever: parameter servers and workers in server.join(), the
evaluator, MPI workers in sshd."""

from __future__ import annotations

from collections.abc import Sequence

from disttrain.api.observed import ObservedPod
from disttrain.api.spec import CleanPodPolicy


def pods_to_clean(policy: CleanPodPolicy, pods: Sequence[ObservedPod]) -> list[ObservedPod]:
    if policy is CleanPodPolicy.ALL:
        return [p for p in pods if not p.terminating]
    if policy is CleanPodPolicy.RUNNING:
        return [p for p in pods if p.active]
    return []
