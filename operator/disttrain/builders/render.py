"""`disttrain render`: the objects the operator would create for a job, without a cluster,
through the same pure builders the operator uses."""

from __future__ import annotations

from typing import Any

import yaml

from disttrain.api.constants import KIND
from disttrain.api.objects import JobRef
from disttrain.api.spec import GangProvider, JobSpec, parse_spec
from disttrain.builders import gang
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.builders.mpi import SSHKeys
from disttrain.builders.pods import desired_pod_keys

# `render` shows where the key goes, never a real key: the operator makes one per job.
PLACEHOLDER_KEYS = SSHKeys(private="<a private key made for this job by the operator>",
                           public="ssh-ed25519 <the matching public key>")


def render_objects(job: dict[str, Any]) -> list[dict[str, Any]]:
    meta = job.get("metadata") or {}
    ref = JobRef(name=meta.get("name", "job"), namespace=meta.get("namespace") or "default",
                 uid=meta.get("uid") or "<uid of the DistTrainJob>")
    spec = parse_spec(job.get("spec") or {})
    workers = range(spec.mpi.worker.replicas) if spec.mpi else ()
    provider = rendered_provider(spec)
    return [*supporting_objects(ref, spec, PLACEHOLDER_KEYS, list(workers), provider),
            *(job_pod(ref, spec, key, provider) for key in desired_pod_keys(spec))]


def rendered_provider(spec: JobSpec) -> GangProvider | None:
    """A gang's provider as the operator would choose it on a cluster serving every gang API (no
    cluster is asked here: Auto shows the choice its schedulerName leads to)."""
    settings = spec.run_policy.scheduling.gang
    if settings is None:
        return None
    return gang.choose(settings, set(gang.API), spec.run_policy.scheduling.scheduler_name)


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings (hostfile, discover_hosts.sh, ssh config) as literal blocks, the way a
    person writes them in a manifest, rather than quoted with a blank line per line break."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # PyYAML falls back to quoting by itself where a literal block can't hold the value
    # (trailing spaces, control characters), so the output always loads back to the same text.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_ManifestDumper.add_representer(str, _string)


def render(text: str) -> str:
    # Other documents of the file (a PVC beside the job, say) are the user's own: not shown.
    docs = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == KIND]
    objects = [obj for doc in docs for obj in render_objects(doc)]
    return yaml.dump_all(objects, Dumper=_ManifestDumper, sort_keys=False)
