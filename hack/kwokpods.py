"""Finishing KWOK pods on a kubelet's behalf: the one place that reports a container's exit.

KWOK nodes run no containers. A pod finishes when it carries the annotation
`kwok.disttrain.dev/exit-code: "<code>"` (hack/kwok/stages.yaml): 0 gives phase Succeeded,
anything else Failed with that exit code. The demo's kubelet stand-in, the tests and the
benchmark all finish pods through `finish_pod`, because each of them races the operator the
same way: the moment one pod's exit makes the job finish, the operator deletes the job's other
pods (cleanPodPolicy: Running), or replaces them on a restart. A pod that is gone, going, or
replaced by a newer pod of the same name has simply ended; a kubelet would stop its container
and report nothing, and so does this.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

EXIT_CODE_ANNOTATION = "kwok.disttrain.dev/exit-code"


def ended_otherwise(status: int, with_uid: bool) -> bool:
    """Whether an API error on the exit-code patch means the pod had already ended: deleted (404),
    being deleted (409), or replaced by a newer pod of its name (422 on the uid, when one was sent)."""
    return status in (404, 409) or (with_uid and status == 422)


def finish_pod(core: Any, namespace: str, name: str, exit_code: int, uid: str | None = None) -> bool:
    """Make the pod's containers exit with `exit_code`. True if that will be the pod's end;
    False if the pod had already ended otherwise: deleted (404), being deleted, or (with `uid`)
    replaced by another pod of the same name: the uid in the patch must match, and kube-apiserver
    v1.36 refuses a different one as an immutable-field change (422, measured in
    tests/integration/test_control_plane.py). Our patch adds one annotation: nothing else in it
    can be invalid.

    `core` is a `kubernetes.client.CoreV1Api`."""
    metadata: dict[str, Any] = {"annotations": {EXIT_CODE_ANNOTATION: str(exit_code)}}
    if uid is not None:
        metadata["uid"] = uid
    try:
        pod = core.patch_namespaced_pod(name, namespace, {"metadata": metadata})
    except ApiException as err:
        if ended_otherwise(err.status, uid is not None):
            return False
        raise
    return pod.metadata.deletion_timestamp is None
