"""Pure builders: a job in, the Kubernetes objects it should own out.

Objects are plain dicts, not kubernetes-client models: the pod templates come from the user
and the API server may know fields that the Python models don't, which a round trip through
the models would silently drop.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from disttrain.constants import (
    API_VERSION,
    JOB_NAME_ENV,
    KIND,
    NUM_WORKERS_ENV,
    OMP_NUM_THREADS_ENV,
    REPLICA_INDEX_ENV,
    REPLICA_TYPE_ENV,
    TF_CONFIG_ENV,
)
from disttrain.naming import job_labels, pod_name, replica_labels, service_name
from disttrain.spec import JobSpec, RestartPolicy
from disttrain.tfconfig import cluster_spec, tf_config


@dataclass(frozen=True)
class JobRef:
    """What the builders need to know about the job object itself."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class PodKey:
    replica_type: str
    index: int


def owner_reference(job: JobRef) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(job: JobRef, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner_reference(job)],
    }


def desired_service(job: JobRef, spec: JobSpec) -> dict[str, Any]:
    """The headless Service that gives every pod its DNS name. It publishes pods before they
    are Ready: peers must resolve each other while TensorFlow or sshd is still starting."""
    port = (
        {"name": "tf", "port": spec.tensorflow.port, "targetPort": spec.tensorflow.port}
        if spec.tensorflow is not None
        else {"name": "ssh", "port": 22, "targetPort": 22}
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(job, service_name(job.name), job_labels(job.name)),
        "spec": {
            "clusterIP": "None",
            "selector": job_labels(job.name),
            "publishNotReadyAddresses": True,
            "ports": [port],
        },
    }


def desired_pod_keys(spec: JobSpec) -> list[PodKey]:
    return [
        PodKey(rtype, index) for rtype, replica in spec.replicas.items() for index in range(replica.replicas)
    ]


# Replica policies that the kubelet carries out itself; the others (Never, ExitCode) leave a
# failed pod for the operator to judge.
_POD_RESTART_POLICY = {
    RestartPolicy.NEVER: "Never",
    RestartPolicy.EXIT_CODE: "Never",
    RestartPolicy.ON_FAILURE: "OnFailure",
    RestartPolicy.ALWAYS: "Always",
}


def desired_pod(
    job: JobRef, spec: JobSpec, key: PodKey, extra_env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    replica = spec.replicas[key.replica_type]
    template = copy.deepcopy(dict(replica.template))
    name = pod_name(job.name, key.replica_type, key.index)

    meta = dict(template.get("metadata") or {})
    meta.pop("name", None)
    meta.pop("namespace", None)
    labels = dict(meta.get("labels") or {}) | replica_labels(job.name, key.replica_type, key.index)
    meta.update(object_meta(job, name, labels))

    pod_spec = dict(template.get("spec") or {})
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = service_name(job.name)
    pod_spec["restartPolicy"] = _POD_RESTART_POLICY[replica.restart_policy]
    scheduling = spec.run_policy.scheduling
    if scheduling.scheduler_name and not pod_spec.get("schedulerName"):
        pod_spec["schedulerName"] = scheduling.scheduler_name
    if scheduling.priority_class_name and not pod_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = scheduling.priority_class_name

    env = {
        JOB_NAME_ENV: job.name,
        REPLICA_TYPE_ENV: key.replica_type,
        REPLICA_INDEX_ENV: str(key.index),
        NUM_WORKERS_ENV: str(spec.num_workers),
    }
    if spec.tensorflow is not None:
        env[TF_CONFIG_ENV] = tf_config(
            cluster_spec(job.name, job.namespace, spec.tensorflow), key.replica_type, key.index
        )
    env.update(extra_env or {})
    pod_spec["containers"] = [with_env(c, env) for c in pod_spec.get("containers") or []]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def with_env(container: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The container with our variables added. A variable the user set wins: it is theirs to
    override (a hand-written TF_CONFIG for debugging, a tuned OMP_NUM_THREADS)."""
    out = dict(container)
    current = list(out.get("env") or [])
    taken = {e.get("name") for e in current}
    wanted = dict(env)
    threads = omp_num_threads(out)
    if threads is not None:
        wanted[OMP_NUM_THREADS_ENV] = str(threads)
    current.extend({"name": k, "value": v} for k, v in wanted.items() if k not in taken)
    out["env"] = current
    return out


def omp_num_threads(container: Mapping[str, Any]) -> int | None:
    """The container's CPU limit rounded down, at least 1; None when it has no limit.
    OpenMP otherwise starts a thread per *node* core and a 4-CPU pod on a 96-core node thrashes."""
    cpu = ((container.get("resources") or {}).get("limits") or {}).get("cpu")
    if cpu is None:
        return None
    cores: Decimal = parse_quantity(cpu)  # type: ignore[no-untyped-call]
    return max(1, math.floor(cores))
