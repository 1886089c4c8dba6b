"""The pod and Service every job gets, whatever its framework.

Objects are plain dicts, not kubernetes-client models: the pod templates come from the user
and the API server may know fields that the Python models don't, which a round trip through
the models would silently drop.

The framework modules (`tensorflow`, `mpi`) add their own env, volumes and objects on top;
`desired` puts the pieces together.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from disttrain.api.constants import (
    JOB_NAME_ENV,
    NUM_WORKERS_ENV,
    OMP_NUM_THREADS_ENV,
    REPLICA_INDEX_ENV,
    REPLICA_TYPE_ENV,
)
from disttrain.api.objects import JobRef, PodKey, object_meta
from disttrain.api.spec import JobSpec, RestartPolicy
from disttrain.builders.naming import job_labels, pod_name, replica_labels, service_name
from disttrain.builders.resources import cpu_limit_cores

# Replica policies that the kubelet carries out itself; the others (Never, ExitCode) leave a
# failed pod for the operator to judge.
_POD_RESTART_POLICY = {
    RestartPolicy.NEVER: "Never",
    RestartPolicy.EXIT_CODE: "Never",
    RestartPolicy.ON_FAILURE: "OnFailure",
    RestartPolicy.ALWAYS: "Always",
}


def desired_pod_keys(spec: JobSpec) -> list[PodKey]:
    return [PodKey(rtype, index) for rtype, replica in spec.replicas.items() for index in range(replica.replicas)]


def headless_service(job: JobRef, port: Mapping[str, Any]) -> dict[str, Any]:
    """The Service that gives every pod its DNS name. It publishes pods before they are Ready:
    peers must resolve each other while TensorFlow or sshd is still starting."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(job, service_name(job.name), job_labels(job.name)),
        "spec": {
            "clusterIP": "None",
            "selector": job_labels(job.name),
            "publishNotReadyAddresses": True,
            "ports": [dict(port)],
        },
    }


# A variable's value: a string, or where the kubelet reads it at the container's start (an
# EnvVarSource, such as a ConfigMap's key), written as `valueFrom`.
EnvValue = str | Mapping[str, Any]


def common_env(job: JobRef, spec: JobSpec, key: PodKey) -> dict[str, EnvValue]:
    return {
        JOB_NAME_ENV: job.name,
        REPLICA_TYPE_ENV: str(key.replica_type),
        REPLICA_INDEX_ENV: str(key.index),
        NUM_WORKERS_ENV: str(spec.num_workers),
    }


def base_pod(job: JobRef, spec: JobSpec, key: PodKey, env: Mapping[str, EnvValue]) -> dict[str, Any]:
    """The replica's template made into pod `<job>-<type>-<index>`: its identity, its DNS name
    (hostname + subdomain), the kubelet's share of the restart policy, and `env` in every container."""
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
    pod_spec["containers"] = [with_env(c, env) for c in pod_spec.get("containers") or []]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def with_env(container: Mapping[str, Any], env: Mapping[str, EnvValue]) -> dict[str, Any]:
    """The container with our variables added, after the user's and in `env`'s order (a value's
    `$(NAME)` reads only the variables before it). A variable the user set wins: it is theirs to
    override (a hand-written TF_CONFIG for debugging, a tuned OMP_NUM_THREADS)."""
    out = dict(container)
    current = list(out.get("env") or [])
    taken = {e.get("name") for e in current}
    wanted = dict(env)
    threads = omp_num_threads(out)
    if threads is not None:
        wanted[OMP_NUM_THREADS_ENV] = str(threads)
    current.extend(({"name": k, "value": v} if isinstance(v, str) else {"name": k, "valueFrom": copy.deepcopy(dict(v))})
                   for k, v in wanted.items() if k not in taken)
    out["env"] = current
    return out


def omp_num_threads(container: Mapping[str, Any]) -> int | None:
    """The container's CPU limit (see `cpu_limit_cores`). OpenMP otherwise starts a thread per
    *node* core, and a 4-CPU pod on a 96-core node thrashes."""
    return cpu_limit_cores(container)


def add_volumes(pod: Mapping[str, Any], volumes: list[dict[str, Any]], mounts: list[dict[str, Any]],
                first_only: bool = False) -> dict[str, Any]:
    """The pod with `volumes` added, and mounted with `mounts` in every container (`first_only`:
    in the first alone)."""
    out = dict(pod)
    spec = dict(out["spec"])
    spec["volumes"] = list(spec.get("volumes") or []) + volumes
    spec["containers"] = [dict(c, volumeMounts=list(c.get("volumeMounts") or []) + mounts)
                          if i == 0 or not first_only else c for i, c in enumerate(spec.get("containers") or [])]
    out["spec"] = spec
    return out
