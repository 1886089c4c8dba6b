"""`disttrain render`: the objects the operator would create for a job, without a cluster,
through the same pure builders the operator uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from disttrain import __version__
from disttrain.api.constants import REPLICA_INDEX_LABEL
from disttrain.api.objects import JobRef
from disttrain.api.parse import parse_spec
from disttrain.api.spec import GangProvider, JobSpec
from disttrain.builders import gang, gloo, render_claims, render_input
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.builders.mpi import SSHKeys, secret_name, slots_per_worker
from disttrain.builders.pods import desired_pod_keys
from disttrain.builders.progress import EndpointPods, ProgressEndpoint
from disttrain.builders.tensorflow import tf_config_too_large

# `render` shows where the key goes, never a real key: the operator makes one per job.
PLACEHOLDER_KEYS = SSHKeys(private="<a private key made for this job by the operator>",
                           public="ssh-ed25519 <the matching public key>")

# Where the SSH Secret's name has the first characters of the job's uid, unknown before it is created.
UID_PLACEHOLDER = "<the job's uid, its first 8 characters>"

# The progress endpoint of the chart's operator with its defaults (progress.enabled, port 8443),
# as `helm install RELEASE` in NAMESPACE names it: the pods that report get its volume and address,
# and every pod the checkpoint volume (builders/progress.py, checkpoint.py).
_RELEASE, _NAMESPACE = "<release>-disttrain-operator", "<operator's namespace>"
CHART_ENDPOINT = ProgressEndpoint(
    url=f"https://{_RELEASE}-progress.{_NAMESPACE}.svc:8443",
    ca=f"<the endpoint's CA (PEM), from Secret {_NAMESPACE}/{_RELEASE}-progress-tls>",
    pods=EndpointPods(_NAMESPACE, (("app.kubernetes.io/instance", "<release>"),
                                   ("app.kubernetes.io/name", "disttrain-operator")), 8443),
    hook_image=f"<registry>/disttrain/operator:{__version__}")


def render_objects(job: dict[str, Any], spec: JobSpec | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """`spec`: the job's, parsed (with what render_claims found), or None to parse it here.
    `progress`: as an operator serving the progress endpoint (the chart's default) would make them."""
    meta = job.get("metadata") or {}
    ref = JobRef(name=meta.get("name", "job"), namespace=meta.get("namespace") or "default",
                 uid=meta.get("uid") or "<uid of the DistTrainJob>")
    spec = spec if spec is not None else parse_spec(job.get("spec") or {})
    if spec.tensorflow is not None and (trouble := tf_config_too_large(ref, spec.tensorflow)) is not None:
        raise trouble  # as the operator fails it: before a pod is built
    workers = range(spec.mpi.worker.replicas) if spec.mpi else ()
    provider, endpoint = rendered_provider(spec), CHART_ENDPOINT if progress else None
    # A placeholder no one takes for a real name (it isn't a valid one).
    ssh_secret = secret_name(ref) if meta.get("uid") else f"{ref.name}-ssh-{UID_PLACEHOLDER}"
    return [*supporting_objects(ref, spec, PLACEHOLDER_KEYS, list(workers), provider, ssh_secret=ssh_secret,
                                report_to=endpoint),
            *(job_pod(ref, spec, key, provider, endpoint, ssh_secret) for key in desired_pod_keys(spec))]


def rendered_provider(spec: JobSpec) -> GangProvider | None:
    """A gang's provider as the operator would choose it on a cluster serving every gang API (no
    cluster is asked here: Auto shows the choice its schedulerName leads to)."""
    settings = spec.run_policy.scheduling.gang
    if settings is None:
        return None
    return gang.choose(settings, set(gang.API), spec.run_policy.scheduling.scheduler_name)


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings (hostfile, discover_hosts.sh, ssh config) as literal blocks, the way a
    person writes them in a manifest, rather than quoted with a blank line per line break; an
    object used twice (a NetworkPolicy's peers) written out twice, not as a `&id001` anchor."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


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


def render(text: str, gpu_device_classes: Iterable[str] = (), progress: bool = True) -> str:
    """Other documents of the file (a PVC beside the job, say) are the user's own: not shown; its
    DRA objects (a ResourceClaimTemplate, a DeviceClass) say what the claims give (render_claims.py).
    RenderRefused: no job, or one the API server would refuse (render_input.py)."""
    docs = render_input.documents(text)
    jobs = render_input.jobs(docs)
    found = render_claims.file_claims([d for d in docs if isinstance(d, dict)], gpu_device_classes)
    parts: list[str] = []
    for doc in jobs:
        spec = render_claims.with_claimed_gpus(parse_spec(doc.get("spec") or {}), found)
        parts.extend(rank_comment(spec, obj) + render_claims.claims_comment(spec, obj, found)
                     + yaml.dump(obj, Dumper=_ManifestDumper, sort_keys=False)
                     for obj in render_objects(doc, spec, progress))
    return "---\n".join(parts)
