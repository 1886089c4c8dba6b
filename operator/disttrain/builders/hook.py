"""The progress and checkpoint hook in a pod whose image doesn't have it (spec.runPolicy.injectProgressHook).

Our images carry `disttrain_progress` and a `.pth` file that starts its zero-code Keras hook; a
user's own TensorFlow image has neither. An init container, from the operator's image (`disttrain
run --hook-image`), copies the package into an emptyDir (`python -m disttrain_progress.install`),
and every container of the pod mounts it read-only as its PYTHONUSERBASE: Python adds the folder's
user site-packages at start-up and runs the `.pth` there (disttrain_progress/install.py says what
it does). The image's own PYTHONPATH and sitecustomize are untouched; an image that has
disttrain_progress in its site-packages (ours) keeps its own copy. A container whose template sets
PYTHONUSERBASE keeps it, and has no hook; one whose image sets it (ENV) loses it to ours: such a job
opts out (docs/api.md, "The hook in any image").

An init container rather than an `image` volume: it needs no runtime support (image volumes need
containerd 2.1 or CRI-O 1.31, and a feature gate before Kubernetes 1.35), and it pulls the image
with the pod's own pull secrets, as its other images. It asks for little (the pod's request is the
larger of it and the sum of the containers': unchanged but for the smallest pods), runs as the
image's non-root user with nothing granted, and writes under 1 MiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.api.constants import GROUP
from disttrain.builders.pods import add_volumes, with_env

HOOK_DIR = f"/var/run/{GROUP}/hook"
VOLUME = "disttrain-hook"
INIT_CONTAINER = "disttrain-hook"
USER_BASE_ENV = "PYTHONUSERBASE"
RESOURCES = {"cpu": "100m", "memory": "64Mi"}
HOOK_UID = 65532  # the operator image's user (images/operator/Dockerfile)


def init_container(image: str) -> dict[str, Any]:
    return {
        "name": INIT_CONTAINER, "image": image,
        "command": ["python", "-m", "disttrain_progress.install", HOOK_DIR],
        "imagePullPolicy": "IfNotPresent",
        # Requests equal to limits: a Guaranteed pod stays Guaranteed (QoS counts init containers), and
        # a LimitRange's request-to-limit ratio has nothing to refuse.
        "resources": {"requests": dict(RESOURCES), "limits": dict(RESOURCES)},
        # What PodSecurity's restricted level asks, so a namespace that enforces it admits the pod; its
        # own user, so a pod that runs as root (runAsUser: 0) doesn't make it break runAsNonRoot.
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "runAsUser": HOOK_UID, "runAsGroup": HOOK_UID,
                            "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": VOLUME, "mountPath": HOOK_DIR}],
    }


def pod_additions(pod: Mapping[str, Any], image: str) -> dict[str, Any]:
    volume = {"name": VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}
    out = add_volumes(pod, [volume], [{"name": VOLUME, "mountPath": HOOK_DIR, "readOnly": True}])
    spec = dict(out["spec"])
    spec["initContainers"] = [*(spec.get("initContainers") or []), init_container(image)]
    spec["containers"] = [with_env(c, {USER_BASE_ENV: HOOK_DIR}) for c in spec["containers"]]
    out["spec"] = spec
    return out
