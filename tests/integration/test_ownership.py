"""A job's children are its own by UID, not by name.

`kubectl delete` of a job and `kubectl apply` of the same file at once: until garbage collection
removes the old job's pods, Service, ConfigMap and Secret (seconds on a busy cluster; here the
controller-manager is paused to make it so), the new job must count none of them, wait for its
names to be free, and then run with pods of its own.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from manifests import mpi_job, replica, tf_job
from support import Cluster, wait_for, wait_pods_running

pytestmark = pytest.mark.usefixtures("operator")
# Delete-and-apply cycles per framework; DISTTRAIN_RECREATE_ROUNDS=10 for the ten-in-a-row check.
ROUNDS = int(os.environ.get("DISTTRAIN_RECREATE_ROUNDS", "3"))


def chief_job(name: str) -> dict[str, Any]:
    return tf_job(name, None, chief=replica(1), worker=replica(2))


def owner_uids(cluster: Cluster, ns: str, job: str) -> set[str]:
    return {ref.uid for p in cluster.pods(ns, f"disttrain.dev/job-name={job}") for ref in p.metadata.owner_references}


def job_uid(cluster: Cluster, ns: str, name: str) -> str:
    return str(cluster.job(ns, name)["metadata"]["uid"])


@pytest.mark.parametrize(("kind", "make", "pods", "decider"), [
    ("tensorflow", chief_job, 3, "chief-0"), ("mpi", lambda n: mpi_job(n, workers=2, gpus=1), 3, "launcher")])
def test_delete_and_apply_again_at_once(cluster: Cluster, namespace: str, kind: str, make: Any, pods: int,
                                        decider: str) -> None:
    name = f"again-{kind}"
    decider_pod = f"{name}-{decider}"
    cluster.apply(make(name), namespace)
    for attempt in range(ROUNDS):
        wait_pods_running(cluster, namespace, name, pods, timeout=60)
        cluster.finish_pod(namespace, decider_pod, 0)
        cluster.wait_phase(namespace, name, "Succeeded")
        old = job_uid(cluster, namespace, name)
        with cluster.paused("kube-controller-manager"):  # garbage collection held back
            cluster.kubectl("delete", "dtj", name, "-n", namespace, "--wait=false")
            wait_for(lambda: "NotFound" in cluster.kubectl("get", "dtj", name, "-n", namespace, check=False).stderr,
                     10, "the old job gone")
            cluster.apply(make(name), namespace)
            new = wait_for(lambda: job_uid(cluster, namespace, name), 10, "the new job")
            assert new != old
            # The operator has judged the new job once it says what it waits for.
            status = wait_for(lambda: (s := cluster.job_status(namespace, name)).get("reason") and s, 15,
                              "the new job's status")
            assert status["phase"] == "Pending", f"round {attempt}: {status}"
            assert owner_uids(cluster, namespace, name) == {old}, "no pod of the new job while the old ones live"
            assert status["reason"] == "WaitingForPreviousJob", status
            assert decider_pod in status["message"]
        pods_now = wait_pods_running(cluster, namespace, name, pods, timeout=60)
        assert {ref.uid for p in pods_now for ref in p.metadata.owner_references} == {new}
        assert cluster.job_status(namespace, name)["restarts"] == 0
    if kind == "mpi":
        secret = cluster.core.read_namespaced_secret(cluster.job_status(namespace, name)["sshSecret"], namespace)
        assert secret.metadata.owner_references[0].uid == job_uid(cluster, namespace, name)


@pytest.mark.parametrize(("kind", "suffix"), [("Pod", "worker-0"), ("ConfigMap", "mpi")])
def test_an_object_of_the_jobs_name_that_is_not_the_jobs_fails_it(cluster: Cluster, namespace: str, kind: str,
                                                                  suffix: str) -> None:
    """Not an earlier job's (those are waited out): anything else's. The create finds the name
    taken, the operator reads whose object it is (the chart grants `get` for exactly this), and
    the job fails naming it, without a pod of its own. (An MPI job's SSH Secret is named for the
    job's uid, so nothing else holds its name: tests/unit/test_controller.py.)"""
    name = f"taken-{kind.lower()}"
    taken = f"{name}-{suffix}"
    body: dict[str, Any] = {"metadata": {"name": taken}}
    if kind == "Pod":
        body["spec"] = {"containers": [{"name": "other", "image": "other"}]}
        cluster.core.create_namespaced_pod(namespace, body)
    else:
        cluster.core.create_namespaced_config_map(namespace, body)
    cluster.apply(mpi_job(name, workers=2, gpus=1), namespace)
    status = cluster.wait_phase(namespace, name, "Failed")
    assert status["reason"] == "ObjectNotOwned", status
    assert f"{kind} {namespace}/{taken} already exists and is not controlled by this DistTrainJob" in status["message"]
    # A pod created beside the refused one (they are created together) goes with the failed job.
    wait_for(lambda: not owner_uids(cluster, namespace, name), 30, "no pod of the failed job left")
