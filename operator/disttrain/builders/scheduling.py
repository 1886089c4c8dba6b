"""Where scheduling plugs in: the fields every pod gets from `runPolicy.scheduling`, and the
objects a scheduling provider makes before the pods.

The gang providers (`gang`: a PodGroup per job) plug in here; `desired` calls `objects` and
`pod_fields` for every job, with the provider the job's status records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.api.objects import JobRef
from disttrain.api.spec import GangProvider, JobSpec
from disttrain.builders import gang


def pod_fields(job: JobRef, spec: JobSpec, provider: GangProvider | None, pod: Mapping[str, Any]) -> dict[str, Any]:
    """schedulerName and priorityClassName for every pod, unless its template names its own; the
    gang's group and scheduler when the job is a gang."""
    out = dict(pod)
    pod_spec = dict(out["spec"])
    scheduling = spec.run_policy.scheduling
    if scheduling.scheduler_name and not pod_spec.get("schedulerName"):
        pod_spec["schedulerName"] = scheduling.scheduler_name
    if scheduling.priority_class_name and not pod_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    out["spec"] = pod_spec
    if spec.run_policy.scheduling.gang is not None and provider is not None:
        return gang.pod_fields(job, spec, provider, out)
    return out


def objects(job: JobRef, spec: JobSpec, provider: GangProvider | None, api: str | None = None) -> list[dict[str, Any]]:
    """What scheduling needs to exist before the pods: the gang's group, if any (`api`: the
    version of the provider's API chosen with it)."""
    settings = spec.run_policy.scheduling.gang
    if settings is None or provider is None:
        return []
    return gang.objects(job, spec, settings, provider, api)
