"""A large TensorFlow job's cluster comes from its ConfigMap (builders/tensorflow.py), and a real
kubelet gives the process the same TF_CONFIG as if it were written into the pod.

KWOK starts no container, so only the real node can show that `valueFrom.configMapKeyRef` and the
`$(DISTTRAIN_TF_CLUSTER)` in TF_CONFIG become the whole TF_CONFIG in the process's environment. The
ConfigMap and the pod are the builders' own (desired.supporting_objects, desired.job_pod), made
without an operator: their owner, a job that doesn't exist, is left out, so nothing collects them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.builders import desired, tensorflow
from e2e_support import pinned_namespace
from manifests import replica, tf_job
from support import Cluster, wait_for

pytestmark = pytest.mark.e2e

PRINT_TF_CONFIG = ["python", "-c", "import os; print(os.environ['TF_CONFIG'])"]


@pytest.fixture
def namespace(cluster: Cluster, real_node: str) -> Iterator[str]:
    ns = pinned_namespace(cluster, f"e2e-tfcm-{uuid.uuid4().hex[:6]}")
    yield ns
    cluster.core.delete_namespace(ns)


def test_a_large_jobs_pod_sees_its_whole_tf_config_from_the_cluster_config_map(cluster: Cluster,
                                                                               namespace: str) -> None:
    spec = parse_spec(tf_job("big", chief=replica(1, cpu=None), worker=replica(299, cpu=None,
                                                                                command=PRINT_TF_CONFIG))["spec"])
    assert spec.tensorflow is not None
    ref = JobRef("big", namespace, str(uuid.uuid4()))
    cluster_json = tensorflow.cluster_json(ref.name, ref.namespace, spec.tensorflow)
    assert len(cluster_json) > tensorflow.INLINE_CLUSTER_BYTES  # the ConfigMap's way, not the inline one
    objects = [o for o in desired.supporting_objects(ref, spec, None) if o["kind"] == "ConfigMap"]
    pod = desired.job_pod(ref, spec, PodKey("worker", 298))
    env = pod["spec"]["containers"][0]["env"]
    assert json.loads(next(e["value"] for e in env if e["name"] == "TF_CONFIG")
                      .replace(f"$({tensorflow.CLUSTER_ENV})", "{}"))["task"] == {"type": "worker", "index": 298}
    for obj in [*objects, pod]:
        obj["metadata"].pop("ownerReferences")
        cluster.apply(obj, server_side=False)

    def ended() -> bool:
        phase = cluster.core.read_namespaced_pod(pod["metadata"]["name"], namespace).status.phase
        assert phase != "Failed", cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout
        return bool(phase == "Succeeded")
    wait_for(ended, 180, "the pod printing its TF_CONFIG to end")
    printed = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout.strip()
    assert printed == tensorflow.tf_config(cluster_json, "worker", 298)
    assert len(json.loads(printed)["cluster"]["worker"]) == 299
