"""`disttrain render`: the objects the operator would create for a job, without a cluster,
through the same pure builders the operator uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from disttrain.api.constants import KIND, REPLICA_INDEX_LABEL
from disttrain.api.objects import JobRef
from disttrain.api.parse import parse_spec
from disttrain.api.spec import GangProvider, JobSpec
from disttrain.builders import gang, gloo, render_claims
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.builders.mpi import SSHKeys, slots_per_worker
from disttrain.builders.pods import desired_pod_keys

# `render` shows where the key goes, never a real key: the operator makes one per job.
PLACEHOLDER_KEYS = SSHKeys(private="<a private key made for this job by the operator>",
                           public="ssh-ed25519 <the matching public key>")


def render_objects(job: dict[str, Any], spec: JobSpec | None = None) -> list[dict[str, Any]]:
    """`spec`: the job's, parsed (with what render_claims found), or None to parse it here."""
    meta = job.get("metadata") or {}
    ref = JobRef(name=meta.get("name", "job"), namespace=meta.get("namespace") or "default",
                 uid=meta.get("uid") or "<uid of the DistTrainJob>")
    spec = spec if spec is not None else parse_spec(job.get("spec") or {})
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


def rank_comment(spec: JobSpec, obj: dict[str, Any]) -> str:
    """For a Gloo worker pod, the processes its bootstrap starts and what each adds to the pod's
    environment (as YAML comments: the output stays what the operator creates)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if spec.mpi is None or not spec.mpi.gloo or obj.get("kind") != "Pod" or REPLICA_INDEX_LABEL not in labels:
        return ""
    worker = int(labels[REPLICA_INDEX_LABEL])
    lines = [f"# {obj['metadata']['name']} runs {slots_per_worker(spec.mpi)} process(es) of its command, each with "
             "the pod's env and:"]
    for local_rank in range(slots_per_worker(spec.mpi)):
        env = " ".join(f"{k}={v}" for k, v in gloo.rank_env(spec.mpi, worker, local_rank).items())
        lines.append(f"#   {env}")
    lines.append("#   HOROVOD_GLOO_RENDEZVOUS_ADDR=<worker 0's IP>, HOROVOD_GLOO_IFACE and NCCL_SOCKET_IFNAME=<the "
                 "interface of the pod's IP>")
    return "\n".join(lines) + "\n"


def render(text: str, gpu_device_classes: Iterable[str] = ()) -> str:
    """Other documents of the file (a PVC beside the job, say) are the user's own: not shown; its
    DRA objects (a ResourceClaimTemplate, a DeviceClass) say what the claims give (render_claims.py)."""
    everything = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    found = render_claims.file_claims(everything, gpu_device_classes)
    parts: list[str] = []
    for doc in (d for d in everything if d.get("kind") == KIND):
        spec = render_claims.with_claimed_gpus(parse_spec(doc.get("spec") or {}), found)
        parts.extend(rank_comment(spec, obj) + render_claims.claims_comment(spec, obj, found)
                     + yaml.dump(obj, Dumper=_ManifestDumper, sort_keys=False) for obj in render_objects(doc, spec))
    return "---\n".join(parts)
