"""TensorFlow jobs: TF_CONFIG, the cluster every task of a job sees and its own place in it.

Every container of every pod gets TF_CONFIG (docs/api.md, "TF_CONFIG"); a variable the user set
in the template wins.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from disttrain.api.constants import TF_CONFIG_ENV
from disttrain.api.crd_size import MAX_ENV_BYTES, tf_members_fit
from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import SpecError
from disttrain.api.spec import CLUSTER_MEMBER_TYPES, TensorFlowSpec
from disttrain.builders.naming import pod_fqdn, pod_name, service_name


def _members(tf: TensorFlowSpec) -> tuple[tuple[str, int], ...]:
    return tuple((rtype, count) for rtype, count in _sizes(tf) if rtype in CLUSTER_MEMBER_TYPES)


def _cluster(job: str, namespace: str, members: tuple[tuple[str, int], ...], port: int, short: bool) -> str:
    def host(rtype: str, i: int) -> str:
        return f"{pod_name(job, rtype, i)}.{service_name(job)}" if short else pod_fqdn(job, namespace, rtype, i)

    return json.dumps({rtype: [f"{host(rtype, i)}:{port}" for i in range(count)] for rtype, count in members},
                      separators=(",", ":"))


def tf_config(cluster: str, replica_type: str, index: int) -> str:
    """One pod's TF_CONFIG around the job's `cluster` (JSON, the same for every pod of the job), as
    json.dumps writes the whole, without building the cluster again for each of a large job's pods."""
    return f'{{"cluster":{cluster},"task":{{"type":"{replica_type}","index":{index}}},"environment":"cloud"}}'


def _largest(cluster: str, sizes: tuple[tuple[str, int], ...]) -> int:
    """The bytes of the largest TF_CONFIG of the job's pods as a process's variable (`NAME=value` NUL)."""
    return max(len(TF_CONFIG_ENV) + 2 + len(tf_config(cluster, rtype, count - 1)) for rtype, count in sizes)


# A large job's pods are made 64 a pass (decide/reconcile.py), each with the same cluster: built once.
@functools.lru_cache(maxsize=8)
def _cluster_for(job: str, namespace: str, members: tuple[tuple[str, int], ...], port: int,
                 sizes: tuple[tuple[str, int], ...]) -> str:
    full = _cluster(job, namespace, members, port, short=False)
    return full if _largest(full, sizes) <= MAX_ENV_BYTES else _cluster(job, namespace, members, port, short=True)


def _sizes(tf: TensorFlowSpec) -> tuple[tuple[str, int], ...]:
    return tuple((str(rtype), replica.replicas) for rtype, replica in tf.replicas.items())


def cluster_json(job: str, namespace: str, tf: TensorFlowSpec) -> str:
    """The `cluster` of the job's TF_CONFIG: each member `<pod>.<job>.<ns>.svc:<port>`, or, where that
    passes what one environment variable holds (api/crd_size.py), `<pod>.<job>:<port>`, which the pod's
    DNS search path (`<ns>.svc.cluster.local` first) resolves in its own namespace. The CRD's rules let
    no job be applied that the short names don't fit."""
    return _cluster_for(job, namespace, _members(tf), tf.port, _sizes(tf))


def tf_config_too_large(job: JobRef, tf: TensorFlowSpec) -> SpecError | None:
    """Why no pod of this job could start, if its TF_CONFIG can't be a process's environment variable
    even by short names: a job stored before the CRD's size rules (api/crd_size.py) came."""
    if all(_sets_tf_config(r.template) for r in tf.replicas.values()):
        return None  # a TF_CONFIG of the user's own in every container wins over ours (pods.with_env)
    members = sum(count for _, count in _members(tf))
    # Each member's entry is `"<job>-<type>-<i>.<job>.<ns>.svc:<port>",`: under 2 x the job's name,
    # the namespace and 40 more; most jobs are decided without building the cluster.
    if members * (2 * len(job.name) + len(job.namespace) + 40) + 256 < MAX_ENV_BYTES:
        return None
    size = _largest(cluster_json(job.name, job.namespace, tf), _sizes(tf))
    if size <= MAX_ENV_BYTES:
        return None
    most = max(tf.replicas, key=lambda t: tf.replicas[t].replicas)
    return SpecError(f"spec.tensorflow.{most}.replicas", (
        f"TF_CONFIG lists all {members} members of the cluster in {size:,} bytes, and a process's environment "
        f"variable holds at most {MAX_ENV_BYTES:,} (Linux's MAX_ARG_STRLEN): no pod of this job could start. "
        f"At most {tf_members_fit(len(job.name), members)} members fit with this job's name"))


def _sets_tf_config(template: Mapping[str, Any]) -> bool:
    containers = (template.get("spec") or {}).get("containers") or []
    return bool(containers) and all(any(isinstance(e, Mapping) and e.get("name") == TF_CONFIG_ENV
                                        for e in c.get("env") or []) for c in containers if isinstance(c, Mapping))


def pod_env(job: JobRef, tf: TensorFlowSpec, key: PodKey) -> dict[str, str]:
    return {TF_CONFIG_ENV: tf_config(cluster_json(job.name, job.namespace, tf), key.replica_type, key.index)}


def service_port(tf: TensorFlowSpec) -> dict[str, Any]:
    return {"name": "tf", "port": tf.port, "targetPort": tf.port}
