"""DistTrainJob manifests for integration tests (pods run on KWOK nodes: images never pull)."""

from __future__ import annotations

import copy
from typing import Any


def pod_template(gpus: int = 0, cpu: str | None = "2", command: list[str] | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if cpu:
        limits["cpu"] = cpu
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    container: dict[str, Any] = {"name": "tensorflow", "image": "disttrain/tensorflow:2.21"}
    if command:
        container["command"] = command
    if limits:
        container["resources"] = {"limits": limits}
    return {"spec": {"containers": [container]}}


def replica(n: int, policy: str = "ExitCode", **template: Any) -> dict[str, Any]:
    return {"replicas": n, "restartPolicy": policy, "template": pod_template(**template)}


def tf_job(name: str, run_policy: dict[str, Any] | None = None, **replicas: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"tensorflow": copy.deepcopy(replicas)}
    if run_policy:
        spec["runPolicy"] = run_policy
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name}, "spec": spec}


def mwms_job(name: str = "mwms", workers: int = 4, **run_policy: Any) -> dict[str, Any]:
    return tf_job(name, run_policy or None, worker=replica(workers, gpus=1))


def ps_job(name: str = "ps", **run_policy: Any) -> dict[str, Any]:
    return tf_job(name, run_policy or None, chief=replica(1), ps=replica(2, cpu="1"), worker=replica(3),
                  evaluator=replica(1))


def mpi_job(name: str = "hvd", workers: int = 4, gpus: int = 2, worker_policy: str = "ExitCode",
            worker_node_selector: dict[str, str] | None = None, **run_policy: Any) -> dict[str, Any]:
    worker = replica(workers, worker_policy, gpus=gpus)
    worker["template"]["spec"]["containers"][0]["image"] = "disttrain/horovod:0.28.1"
    if worker_node_selector:
        worker["template"]["spec"]["nodeSelector"] = worker_node_selector
    launcher = replica(1, "Never", cpu="1", command=["mpirun", "python", "/train.py"])
    launcher["template"]["spec"]["containers"][0]["image"] = "disttrain/horovod:0.28.1"
    spec: dict[str, Any] = {"mpi": {"launcher": launcher, "worker": worker}}
    if run_policy:
        spec["runPolicy"] = run_policy
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name}, "spec": spec}
