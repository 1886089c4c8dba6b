"""A job's supporting objects in a pass's plan (builders/desired.py), before its pods, and asked for
again where a container waits for one that is gone.

They are made before a job's first pods, once per operator process (control/children.py remembers
whose exist). A ConfigMap a container reads when it starts can be deleted by hand after that: the
kubelet reads a large TensorFlow job's cluster (builders/tensorflow.py, `valueFrom`) at every start
of a container, an in-place restart (`OnFailure`, `Always`) included, and a container whose ConfigMap
is gone waits in CreateContainerConfigError (`configmap "<name>" not found`), with no pod missing for
the operator to make. Such a wait has the ConfigMap it names made again, whether or not this process
made it before (`Plan.restore`), and nothing else: ~2 requests a pass while the kubelet's message
stands (it retries the container within seconds of the ConfigMap's return).
"""

from __future__ import annotations

from typing import Any

from disttrain.api.spec import ReplicaType
from disttrain.builders import tensorflow
from disttrain.builders.desired import supporting_objects
from disttrain.decide.passes import Pass
from disttrain.decide.policies import elastic

CONFIG_ERROR = "CreateContainerConfigError"


def plan(p: Pass) -> None:
    p.plan.create.extend(_objects(p))


def restore_lost(p: Pass) -> None:
    """The job's ConfigMaps a container waits for, in the kubelet's words (`configmap "<name>" not
    found`: k8s pkg/kubelet/util/manager/watch_based_manager.go), to be made again; only those."""
    waits = [pod.stuck for pod in p.live if pod.stuck and pod.stuck.startswith(CONFIG_ERROR)]
    # A TensorFlow job's only: MPI's and Gloo's ConfigMaps are volumes, whose loss is a mount's wait.
    made = tensorflow.desired_config_map(p.job.ref, p.spec.tensorflow) if waits and p.spec.tensorflow else None
    if made is not None and any(f'configmap "{made["metadata"]["name"]}" not found' in w for w in waits):
        p.plan.restore = [made]


def running_workers(p: Pass) -> list[int]:
    """discover_hosts.sh's workers: an elastic job's in discovery, else every Running one."""
    if elastic.settings(p.spec) is not None:
        return [pod.index for pod in elastic.discovered(p.live, p.wanted_workers)]
    return sorted(pod.index for pod in p.live if pod.replica_type == ReplicaType.WORKER and pod.phase == "Running")


def _objects(p: Pass) -> list[dict[str, Any]]:
    return supporting_objects(p.job.ref, p.spec, p.ssh_keys, running_workers(p), p.provider, p.gang_api,
                              p.ssh_secret, p.job.report_to)
