"""TF_CONFIG: the cluster every TensorFlow task of a job sees, and its own place in it."""

from __future__ import annotations

import json

from disttrain.naming import pod_fqdn
from disttrain.spec import TensorFlowSpec

# The evaluator is not a member of the training cluster: it reads checkpoints and never serves.
# Measured with TensorFlow 2.21 (tests/integration/test_real_tensorflow.py runs it this way):
# with the evaluator listed in `cluster`, a ParameterServerStrategy chief hangs connecting to
# the evaluator's address (no server there; still waiting after 120 s), while
# MultiWorkerMirroredStrategy tolerates it. Left out, both train and the evaluator still
# learns its role from `task`.
CLUSTER_MEMBER_TYPES = ("chief", "ps", "worker")


def cluster_spec(job: str, namespace: str, tf: TensorFlowSpec) -> dict[str, list[str]]:
    return {
        rtype: [f"{pod_fqdn(job, namespace, rtype, i)}:{tf.port}" for i in range(replica.replicas)]
        for rtype, replica in tf.replicas.items()
        if rtype in CLUSTER_MEMBER_TYPES
    }


def tf_config(cluster: dict[str, list[str]], replica_type: str, index: int) -> str:
    return json.dumps(
        {"cluster": cluster, "task": {"type": replica_type, "index": index}, "environment": "cloud"},
        separators=(",", ":"),
    )
