"""A job's supporting objects in a pass's plan (builders/desired.py), before its pods, and asked for
again where a container waits for one that is gone.

They are made before a job's first pods, once per operator process (control/children.py remembers
whose exist). A ConfigMap a container reads when it starts can be deleted by hand after that: the
kubelet reads a large TensorFlow job's cluster (builders/tensorflow.py, `valueFrom`) at every start
of a container, an in-place restart (`OnFailure`, `Always`) included, and a container whose ConfigMap
is gone waits in CreateContainerConfigError (`configmap "<name>" not found`), with no pod missing for
the operator to make. Such a wait puts the objects in the plan even with no pod to create, and has
them made even if this process made them before (`Plan.ensure_supporting`).
"""

from __future__ import annotations

from typing import Any

from disttrain.api.spec import ReplicaType
from disttrain.builders.desired import supporting_objects
from disttrain.decide.passes import Pass
from disttrain.decide.policies import elastic

CONFIG_ERROR = "CreateContainerConfigError"


def plan(p: Pass) -> None:
    objects = _objects(p)
    p.plan.create.extend(objects)
    p.plan.ensure_supporting = _one_is_lost(p, objects)


def restore_lost(p: Pass) -> None:
    """With no pod to create: the objects, only where a container waits for one that is gone."""
    if any(pod.stuck and pod.stuck.startswith(CONFIG_ERROR) for pod in p.live) and _one_is_lost(p, _objects(p)):
        plan(p)


def running_workers(p: Pass) -> list[int]:
    """discover_hosts.sh's workers: an elastic job's in discovery, else every Running one."""
    if elastic.settings(p.spec) is not None:
        return [pod.index for pod in elastic.discovered(p.live, p.wanted_workers)]
    return sorted(pod.index for pod in p.live if pod.replica_type == ReplicaType.WORKER and pod.phase == "Running")


def _objects(p: Pass) -> list[dict[str, Any]]:
    return supporting_objects(p.job.ref, p.spec, p.ssh_keys, running_workers(p), p.provider, p.gang_api,
                              p.ssh_secret, p.job.report_to)


def _one_is_lost(p: Pass, objects: list[dict[str, Any]]) -> bool:
    """A container of the job waits for one of these ConfigMaps, in the kubelet's words."""
    names = [f'"{o["metadata"]["name"]}"' for o in objects if o["kind"] == "ConfigMap"]
    return any(pod.stuck.startswith(CONFIG_ERROR) and "not found" in pod.stuck and any(n in pod.stuck for n in names)
               for pod in p.live if pod.stuck)
