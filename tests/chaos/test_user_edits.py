"""A user editing a running job (issue 12, item 5): labels and an allowed field apply, an immutable
field is refused with a message even through `--server-side --force-conflicts`, and none of it
disturbs the job: the same pods, no restart."""

from __future__ import annotations

import copy

import yaml
from chaos_support import tf_small

from support import Cluster, OperatorProcess, wait_for, wait_pods_running


def test_editing_a_running_job(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    manifest = tf_small("edited", workers=2)
    cluster.apply(manifest, namespace)
    before = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "edited", 2)}
    cluster.wait_phase(namespace, "edited", "Running")

    cluster.kubectl("label", "dtj", "edited", "-n", namespace, "team=vision")
    allowed = copy.deepcopy(manifest)
    allowed["spec"]["runPolicy"] = {"backoffLimit": 7}
    cluster.apply(allowed, namespace)
    job = cluster.job(namespace, "edited")
    assert job["metadata"]["labels"]["team"] == "vision"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 7
    generation = job["metadata"]["generation"]
    wait_for(lambda: cluster.job_status(namespace, "edited").get("observedGeneration") == generation, 15,
             "the operator saw the edit")

    immutable = copy.deepcopy(allowed)
    immutable["spec"]["tensorflow"]["worker"]["replicas"] = 3
    immutable["spec"]["tensorflow"]["port"] = 3333
    refused = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-n", namespace, "-f", "-",
                              input=yaml.safe_dump(immutable), check=False)
    assert refused.returncode != 0
    assert "the number of worker replicas can't be changed after the job is created" in refused.stderr
    assert "spec.tensorflow.port" in refused.stderr, refused.stderr

    status = cluster.job_status(namespace, "edited")
    assert (status["phase"], status["restarts"]) == ("Running", 0)
    after = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "edited", 2)}
    assert after == before, "an edit restarted pods"
    assert cluster.job(namespace, "edited")["spec"]["tensorflow"]["worker"]["replicas"] == 2
