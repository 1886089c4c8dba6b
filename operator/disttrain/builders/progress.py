"""What a reporting pod is given to report its training (api/progress.py says which pods report).

One projected volume, mounted read-only in every container at PROGRESS_DIR:
- `token`: a service-account token for the AUDIENCE, bound to the pod (the kubelet requests it
  and renews it before it expires); the operator learns from it which pod reports;
- `url`: where this pod reports, its job's own address on the operator's endpoint;
- `ca.crt`: the CA that signed the endpoint's certificate;
- `role`: training or evaluation.
The last three come from the pod's own annotations (the downward API), so nothing is created per
job and the files are there for every process in the container: an MPI rank that sshd starts has
none of the container's environment, and finds them all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disttrain.api.constants import GROUP, PLURAL, VERSION
from disttrain.api.objects import JobRef
from disttrain.api.progress import AUDIENCE, Role
from disttrain.builders.pods import add_volumes, with_env

PROGRESS_DIR = f"/var/run/secrets/{GROUP}/progress"
DIR_ENV = "DISTTRAIN_PROGRESS_DIR"
URL_ENV = "DISTTRAIN_PROGRESS_URL"  # the same as the url file, for a user's own client (curl)
VOLUME = "disttrain-progress"
URL_ANNOTATION = f"{GROUP}/progress-url"
CA_ANNOTATION = f"{GROUP}/progress-ca"
ROLE_ANNOTATION = f"{GROUP}/progress-role"
TOKEN_SECONDS = 3600  # the kubelet renews it at 80% of its life


@dataclass(frozen=True)
class EndpointPods:
    """The pods that serve the endpoint, as a NetworkPolicy names them (the chart's operator pods):
    a job whose policy limits its egress (`PeersAndDNS`) may still reach them on `port` to report."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    port: int


@dataclass(frozen=True)
class ProgressEndpoint:
    """Where the operator takes reports: its base URL as the pods reach it, its CA (PEM), and the
    pods that serve it (None: not pods, an operator run outside the cluster)."""

    url: str
    ca: str
    pods: EndpointPods | None = None
    hook_image: str | None = None  # the image whose init container brings the hook (builders/hook.py)


def report_url(endpoint: ProgressEndpoint, job: JobRef) -> str:
    return f"{endpoint.url.rstrip('/')}/apis/{GROUP}/{VERSION}/namespaces/{job.namespace}/{PLURAL}/{job.name}/progress"


def pod_additions(pod: Mapping[str, Any], job: JobRef, endpoint: ProgressEndpoint, role: Role) -> dict[str, Any]:
    out, url = dict(pod), report_url(endpoint, job)
    meta = dict(out["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), URL_ANNOTATION: url,
                           CA_ANNOTATION: endpoint.ca, ROLE_ANNOTATION: role.value}
    out["metadata"] = meta

    def annotation(path: str, key: str) -> dict[str, Any]:
        return {"path": path, "fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}
    volume = {"name": VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": TOKEN_SECONDS, "path": "token"}},
        {"downwardAPI": {"items": [annotation("url", URL_ANNOTATION), annotation("ca.crt", CA_ANNOTATION),
                                   annotation("role", ROLE_ANNOTATION)]}}]}}
    out = add_volumes(out, [volume], [{"name": VOLUME, "mountPath": PROGRESS_DIR, "readOnly": True}])
    env = {DIR_ENV: PROGRESS_DIR, URL_ENV: url}
    containers = [with_env(c, env) for c in out["spec"]["containers"]]
    out["spec"] = dict(out["spec"], containers=containers)
    return out
