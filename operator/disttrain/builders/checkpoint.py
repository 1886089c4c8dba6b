"""What every pod of a job is given to hear a checkpoint request (decide/checkpoint_steps.py).

A downward-API volume, mounted read-only in every container at CHECKPOINT_DIR, whose one file
`request` holds the pod's `disttrain.dev/checkpoint-request` annotation: empty until the operator
asks, then the request's id. The kubelet rewrites the file when the pod's annotations change (a
pod update makes it sync the pod, and a downward-API volume is set up again at every sync), so
every rank of every pod sees the same request within a second of the operator's patch, with no
access to the API and no polling of the operator. Files, not variables, for the same reason as
the progress volume: MPI ranks that sshd starts have none of the container's environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.api.constants import CHECKPOINT_FILE_LABEL, CHECKPOINT_REQUEST_ANNOTATION, GROUP
from disttrain.builders.pods import add_volumes, with_env

CHECKPOINT_DIR = f"/var/run/{GROUP}/checkpoint"
DIR_ENV = "DISTTRAIN_CHECKPOINT_DIR"
VOLUME = "disttrain-checkpoint"
REQUEST_ANNOTATION = CHECKPOINT_REQUEST_ANNOTATION


def pod_additions(pod: Mapping[str, Any]) -> dict[str, Any]:
    volume = {"name": VOLUME, "downwardAPI": {"items": [
        {"path": "request", "fieldRef": {"fieldPath": f"metadata.annotations['{REQUEST_ANNOTATION}']"}}]}}
    out = add_volumes(pod, [volume], [{"name": VOLUME, "mountPath": CHECKPOINT_DIR, "readOnly": True}])
    spec = dict(out["spec"])
    spec["containers"] = [with_env(c, {DIR_ENV: CHECKPOINT_DIR}) for c in spec["containers"]]
    out["spec"] = spec
    meta = dict(out.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), CHECKPOINT_FILE_LABEL: "true"}
    out["metadata"] = meta
    return out
