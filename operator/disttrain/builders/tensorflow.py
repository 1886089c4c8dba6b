"""TensorFlow jobs: TF_CONFIG, the cluster every task of a job sees and its own place in it.

Every container of every pod gets TF_CONFIG (docs/api.md, "TF_CONFIG"); a variable the user set
in the template wins.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from disttrain.api.constants import TF_CONFIG_ENV
from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import SpecError
from disttrain.api.spec import ReplicaType, TensorFlowSpec
from disttrain.builders.naming import pod_fqdn

# The evaluator is not a member of the training cluster: it reads checkpoints and never serves.
# Measured with TensorFlow 2.21 (tests/integration/test_real_tensorflow.py runs it this way):
# with the evaluator listed in `cluster`, a ParameterServerStrategy chief hangs connecting to
# the evaluator's address (no server there; still waiting after 120 s), while
# MultiWorkerMirroredStrategy tolerates it. Left out, both train and the evaluator still
# learns its role from `task`.
CLUSTER_MEMBER_TYPES = (ReplicaType.CHIEF, ReplicaType.PS, ReplicaType.WORKER)


def cluster_spec(job: str, namespace: str, tf: TensorFlowSpec) -> dict[str, list[str]]:
    return {
        str(rtype): [f"{pod_fqdn(job, namespace, rtype, i)}:{tf.port}" for i in range(replica.replicas)]
        for rtype, replica in tf.replicas.items()
        if rtype in CLUSTER_MEMBER_TYPES
    }


def tf_config(cluster: dict[str, list[str]], replica_type: str, index: int) -> str:
    return json.dumps(
        {"cluster": cluster, "task": {"type": str(replica_type), "index": index}, "environment": "cloud"},
        separators=(",", ":"),
    )


# A process's environment variable (`TF_CONFIG=<value>` and its NUL) holds at most 131,072 bytes
# on Linux (MAX_ARG_STRLEN, 32 pages: include/uapi/linux/binfmts.h). Past it, execve fails with
# E2BIG ("argument list too long"): no container of the job could start.
MAX_ENV_BYTES = 131_072


def tf_config_too_large(job: JobRef, tf: TensorFlowSpec) -> SpecError | None:
    """Why no pod of this job could start, if its TF_CONFIG can't be a process's environment
    variable: it lists every member of the cluster by a name that holds the job's name and its
    namespace, so the bound depends on both (the CRD's rules can't see the namespace)."""
    if all(_sets_tf_config(r.template) for r in tf.replicas.values()):
        return None  # a TF_CONFIG of the user's own in every container wins over ours (pods.with_env)
    members = sum(r.replicas for t, r in tf.replicas.items() if t in CLUSTER_MEMBER_TYPES)
    # Each member's entry is `"<job>-<type>-<i>.<job>.<ns>.svc:<port>",`: under 2 x the job's name,
    # the namespace and 40 more; most jobs are decided without building the cluster.
    if members * (2 * len(job.name) + len(job.namespace) + 40) + 256 < MAX_ENV_BYTES:
        return None
    cluster = cluster_spec(job.name, job.namespace, tf)
    size = len(TF_CONFIG_ENV) + 2 + max(len(tf_config(cluster, str(t), r.replicas - 1)) for t, r in tf.replicas.items())
    if size <= MAX_ENV_BYTES:
        return None
    most = max(tf.replicas, key=lambda t: tf.replicas[t].replicas)
    fit = members * (MAX_ENV_BYTES - 256) // size
    return SpecError(f"spec.tensorflow.{most}.replicas", (
        f"TF_CONFIG lists all {members} members of the cluster in {size:,} bytes, and a process's environment "
        f"variable holds at most {MAX_ENV_BYTES:,} (Linux's MAX_ARG_STRLEN): no pod of this job could start. "
        f"About {fit} members fit with this job's name and namespace"))


def _sets_tf_config(template: Mapping[str, Any]) -> bool:
    containers = (template.get("spec") or {}).get("containers") or []
    return bool(containers) and all(any(isinstance(e, Mapping) and e.get("name") == TF_CONFIG_ENV
                                        for e in c.get("env") or []) for c in containers if isinstance(c, Mapping))


def pod_env(job: JobRef, tf: TensorFlowSpec, key: PodKey) -> dict[str, str]:
    return {TF_CONFIG_ENV: tf_config(cluster_spec(job.name, job.namespace, tf), key.replica_type, key.index)}


def service_port(tf: TensorFlowSpec) -> dict[str, Any]:
    return {"name": "tf", "port": tf.port, "targetPort": tf.port}
