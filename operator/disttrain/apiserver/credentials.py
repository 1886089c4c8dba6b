"""Who the operator is to the API server: kopf's own login, given to kopf and to our client alike.

In a pod, the service account's token and CA, at the address the kubelet put in the environment
(KUBERNETES_SERVICE_HOST/PORT, as client-go's in-cluster config; kopf's default names
kubernetes.default.svc, which a pod on the host network may not resolve). Elsewhere, the
kubeconfig's current context. Not supported, as in kopf: kubeconfig `exec` plugins (a cloud's
CLI login): run the operator in the cluster, or give it a kubeconfig with a token or certificate.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import kopf


def login() -> kopf.ConnectionInfo:
    settings = kopf.OperatorSettings()
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if host:
        info = kopf.login_with_service_account(settings=settings)
        if info is not None:
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            return dataclasses.replace(info, server=server)
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no credentials: neither a service account (in a pod) nor a kubeconfig")
    return _paths_resolved(info)


def _paths_resolved(info: kopf.ConnectionInfo) -> kopf.ConnectionInfo:
    """A kubeconfig's relative file paths are relative to the kubeconfig (as kubectl reads them);
    kopf passes them on as they are."""
    first = (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0]
    base = Path(os.path.expanduser(first)).parent
    relative: dict[str, Any] = {name: str(base / os.fsdecode(value))
                                for name in ("ca_path", "certificate_path", "private_key_path")
                                if (value := getattr(info, name)) and not os.path.isabs(value)}
    return dataclasses.replace(info, **relative) if relative else info
