"""`disttrain render`: the objects the operator would create for a job, without a cluster,
through the same pure builders the operator uses."""

from __future__ import annotations

from typing import Any

import yaml

from disttrain.builders import JobRef, desired_pod, desired_pod_keys, desired_service
from disttrain.spec import parse_spec


def render_objects(job: dict[str, Any]) -> list[dict[str, Any]]:
    meta = job.get("metadata") or {}
    ref = JobRef(name=meta.get("name", "job"), namespace=meta.get("namespace") or "default",
                 uid=meta.get("uid") or "<uid of the DistTrainJob>")
    spec = parse_spec(job.get("spec") or {})
    return [desired_service(ref, spec), *(desired_pod(ref, spec, key) for key in desired_pod_keys(spec))]


def render(text: str) -> str:
    docs = [d for d in yaml.safe_load_all(text) if d]
    objects = [obj for doc in docs for obj in render_objects(doc)]
    return yaml.safe_dump_all(objects, sort_keys=False)
