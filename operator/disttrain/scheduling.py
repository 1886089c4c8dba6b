"""Where scheduling plugs in: the fields every pod gets from `runPolicy.scheduling`, and the
objects a scheduling provider makes before the pods.

This is the seam for gang scheduling (a PodGroup per job) and queueing (a Kueue Workload): a
provider adds objects to `objects` (made with the Service, before any pod) and fields to
`pod_fields` (a group name, a scheduler). `desired` calls both for every job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.objects import JobRef
from disttrain.spec import JobSpec


def pod_fields(spec: JobSpec, pod: Mapping[str, Any]) -> dict[str, Any]:
    """schedulerName and priorityClassName for every pod, unless its template names its own."""
    out = dict(pod)
    pod_spec = dict(out["spec"])
    scheduling = spec.run_policy.scheduling
    if scheduling.scheduler_name and not pod_spec.get("schedulerName"):
        pod_spec["schedulerName"] = scheduling.scheduler_name
    if scheduling.priority_class_name and not pod_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    out["spec"] = pod_spec
    return out


def objects(job: JobRef, spec: JobSpec) -> list[dict[str, Any]]:
    """What scheduling needs to exist before the pods: nothing without a provider."""
    return []
