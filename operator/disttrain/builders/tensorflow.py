"""TensorFlow jobs: TF_CONFIG, the cluster every task of a job sees and its own place in it.

Every container of every pod gets TF_CONFIG (docs/api.md, "TF_CONFIG"); a variable the user set
in the template wins.

A large job's cluster is not written into each of its pods. Each pod's TF_CONFIG lists every
member, so a job's pods held its cluster once per pod: 1,024 workers, ~40 KB a pod, 40 MB in etcd,
and every write to one of them (the checkpoint request's annotation) re-encodes 40 KB: annotating
1,024 such pods took 4.4 s where 1,025 small MPI pods took 2.0 (issue 45's bench). Past
INLINE_CLUSTER_BYTES the cluster is one ConfigMap, `<job>-tf-cluster-<uid>`, made before the pods, that
each container reads as DISTTRAIN_TF_CLUSTER (`valueFrom.configMapKeyRef`), and TF_CONFIG names it
as `$(DISTTRAIN_TF_CLUSTER)`, which the kubelet expands when the container starts (a dependent
environment variable: k8s pkg/kubelet/kubelet_pods.go makeEnvironmentVariables, then
third_party/forked/golang/expansion). The process sees the same TF_CONFIG either way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from disttrain.api.constants import TF_CONFIG_ENV
from disttrain.api.crd_size import MAX_ENV_BYTES, tf_members_fit
from disttrain.api.objects import JobRef, PodKey, object_meta
from disttrain.api.parse import SpecError
from disttrain.api.spec import CLUSTER_MEMBER_TYPES, TensorFlowSpec
from disttrain.builders.naming import job_labels, pod_fqdn, pod_name, service_name, with_uid
from disttrain.builders.pods import EnvValue

# The largest cluster (JSON bytes) written into each pod's TF_CONFIG: about 200 members. Past it the
# pods read it from the job's ConfigMap, so what a job's pods hold grows with its size, not its square.
INLINE_CLUSTER_BYTES = 8_192
CLUSTER_ENV = "DISTTRAIN_TF_CLUSTER"
CLUSTER_KEY = "cluster"


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


def pod_env(job: JobRef, tf: TensorFlowSpec, key: PodKey) -> dict[str, EnvValue]:
    cluster = cluster_json(job.name, job.namespace, tf)
    if len(cluster) <= INLINE_CLUSTER_BYTES:
        return {TF_CONFIG_ENV: tf_config(cluster, key.replica_type, key.index)}
    # The referenced variable first: `$(NAME)` expands only a variable defined before it.
    return {CLUSTER_ENV: {"configMapKeyRef": {"name": cluster_config_map_name(job), "key": CLUSTER_KEY}},
            TF_CONFIG_ENV: tf_config(f"$({CLUSTER_ENV})", key.replica_type, key.index)}


def without_unread_cluster(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod with DISTTRAIN_TF_CLUSTER taken out of each container whose TF_CONFIG is the user's:
    nothing there reads it, and up to 128 KiB more of environment is not to be added for nothing."""
    def keeps(container: Mapping[str, Any]) -> bool:  # none, or ours: TF_CONFIG after it (pods.with_env)
        names = [e.get("name") for e in container.get("env") or []]
        return CLUSTER_ENV not in names or TF_CONFIG_ENV in names[names.index(CLUSTER_ENV):]

    containers = pod["spec"]["containers"]
    if not all(keeps(c) for c in containers):
        pod["spec"]["containers"] = [
            c if keeps(c) else {**c, "env": [e for e in c["env"] if e.get("name") != CLUSTER_ENV]} for c in containers]
    return pod


def cluster_config_map_name(job: JobRef) -> str:
    """Named for the job's uid too, as its SSH Secret is (naming.with_uid)."""
    return with_uid(f"{job.name}-tf-cluster", job.uid)


def desired_config_map(job: JobRef, tf: TensorFlowSpec) -> dict[str, Any] | None:
    """The ConfigMap a large job's pods read their cluster from; None where it is in their TF_CONFIG,
    or where every container sets its own. Made once, before the first pod, and immutable: a job's
    members never change, and the kubelet stops watching an immutable ConfigMap once read (k8s
    pkg/kubelet/util/manager/watch_based_manager.go), where each node running a pod of the job would
    otherwise keep a watch on up to 128 KiB."""
    if all(_sets_tf_config(r.template) for r in tf.replicas.values()):
        return None
    cluster = cluster_json(job.name, job.namespace, tf)
    if len(cluster) <= INLINE_CLUSTER_BYTES:
        return None
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": object_meta(job, cluster_config_map_name(job), job_labels(job.name)),
            "immutable": True, "data": {CLUSTER_KEY: cluster}}


def service_port(tf: TensorFlowSpec) -> dict[str, Any]:
    return {"name": "tf", "port": tf.port, "targetPort": tf.port}
