"""TensorFlow jobs: TF_CONFIG, the cluster every task of a job sees and its own place in it.

Every container of every pod gets TF_CONFIG (docs/api.md, "TF_CONFIG"); a variable the user set
in the template wins.
"""

from __future__ import annotations

import json
from typing import Any

from disttrain.api.constants import TF_CONFIG_ENV
from disttrain.api.objects import JobRef, PodKey
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


def pod_env(job: JobRef, tf: TensorFlowSpec, key: PodKey) -> dict[str, str]:
    return {TF_CONFIG_ENV: tf_config(cluster_spec(job.name, job.namespace, tf), key.replica_type, key.index)}


def service_port(tf: TensorFlowSpec) -> dict[str, Any]:
    return {"name": "tf", "port": tf.port, "targetPort": tf.port}
