"""Reporting progress as a pod would, from a test: the pod's progress volume made by hand (KWOK
pods have no kubelet to make it) from the pod's own annotations and a token the API server binds
to the pod (TokenRequest, as the kubelet asks for the projected one)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench_observe import (  # hack/: /proc's VmRSS and utime+stime, as make bench reads them
    descendants,
    is_endpoint,
    process_usage,
)
from support import Cluster, OperatorProcess, wait_for

AUDIENCE = "disttrain.dev/progress"
FLOOD_TOOL = Path(__file__).resolve().parent / "flood.py"  # tests/flood.py: a bounded connection flood


def pod_token(cluster: Cluster, namespace: str, pod: str, audience: str = AUDIENCE) -> str:
    """A token of the pod's ServiceAccount for `audience`, bound to the pod (its name and uid)."""
    found = cluster.core.read_namespaced_pod(pod, namespace)
    return cluster.kubectl("create", "token", found.spec.service_account_name or "default", "-n", namespace,
                           "--audience", audience, "--bound-object-kind", "Pod", "--bound-object-name", pod,
                           "--bound-object-uid", found.metadata.uid, "--duration", "1h").stdout.strip()


def progress_volume(cluster: Cluster, namespace: str, pod: str, folder: Path, token: str | None = None) -> Path:
    """What the kubelet would mount at the pod's progress volume: url, ca.crt and role from its
    annotations, and its token."""
    annotations = cluster.core.read_namespaced_pod(pod, namespace).metadata.annotations or {}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "url").write_text(annotations["disttrain.dev/progress-url"])
    (folder / "ca.crt").write_text(annotations["disttrain.dev/progress-ca"])
    (folder / "role").write_text(annotations["disttrain.dev/progress-role"])
    (folder / "token").write_text(token or pod_token(cluster, namespace, pod))
    return folder


def post_report(volume: Path, body: Any, url: str | None = None, token: str | None = None) -> tuple[int, str]:
    """POST one report as the volume's pod (or to another `url`, with another `token`): the
    answer's code and message."""
    bearer = token or (volume / "token").read_text()
    request = urllib.request.Request(url or (volume / "url").read_text(), data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {bearer}"})
    context = ssl.create_default_context(cafile=str(volume / "ca.crt"))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, json.loads(answer.read())["message"]
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["message"]


def operator_args(port: int, status_seconds: float = 2.0) -> tuple[str, ...]:
    """`disttrain run`'s progress flags as the chart sets them, for an operator run by the tests
    (pods on this machine reach it at 127.0.0.1; the TLS Secret is the chart's session release's)."""
    from support import OPERATOR_NAMESPACE, OPERATOR_RELEASE

    return ("--progress-port", str(port), "--progress-tls-secret",
            f"{OPERATOR_NAMESPACE}/{OPERATOR_RELEASE}-disttrain-operator-progress-tls",
            "--progress-status-seconds", str(status_seconds))


def rss_mib(pid: int) -> float:
    try:
        return process_usage(pid).rss_bytes / 2**20
    except OSError:
        return 0.0


def cpu_seconds(pid: int) -> float:
    """User and system CPU the process has used so far; 0 once gone."""
    try:
        return process_usage(pid).cpu_seconds
    except OSError:
        return 0.0


def endpoint_pid(operator: OperatorProcess) -> int:
    """The endpoint's process (waited for: it starts with the operator): the operator's child, named
    progress-endpt once it serves (endpoint/prefork.py), or started by exec."""
    assert operator.proc is not None
    pid = operator.proc.pid

    def found() -> int | None:
        return next((child for child in descendants(pid) if is_endpoint(child)), None)
    return wait_for(found, 60, "the operator's progress endpoint process")


def progress_port(operator: OperatorProcess) -> int:
    args = list(operator.extra_args)
    return int(args[args.index("--progress-port") + 1])
