"""DistTrainJob manifests for every test, unit and integration, built one way.

Pods of integration tests run on KWOK nodes, so images never pull; the defaults are what a small
real job would ask for: 2 CPUs, the TensorFlow image, restartPolicy ExitCode. The images are named as
the local plane's registry serves them, which the real node pulls them from (hack/registry.py).
"""

from __future__ import annotations

import copy
from typing import Any

from registry import local

TF_IMAGE = local("disttrain/tensorflow:2.21")
HOROVOD_IMAGE = local("disttrain/horovod:0.28.1")


def container(cpu: str | int | None = "2", gpus: int = 0, command: list[str] | None = None,
              image: str = TF_IMAGE, name: str = "tensorflow", **extra: Any) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits["cpu"] = cpu
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    c: dict[str, Any] = {"name": name, "image": image, **extra}
    if command:
        c["command"] = command
    if limits:
        c["resources"] = {"limits": limits}
    return c


def pod_template(labels: dict[str, str] | None = None, **container_args: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"containers": [container(**container_args)]}}
    if labels:
        template["metadata"] = {"labels": dict(labels)}
    return template


def replica(n: int, policy: str = "ExitCode", labels: dict[str, str] | None = None,
            **container_args: Any) -> dict[str, Any]:
    return {"replicas": n, "restartPolicy": policy, "template": pod_template(labels, **container_args)}


def job(name: str, framework: dict[str, Any], run_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = copy.deepcopy(framework)
    if run_policy:
        spec["runPolicy"] = dict(run_policy)
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name}, "spec": spec}


def tf_job(name: str = "mnist", run_policy: dict[str, Any] | None = None, **replicas: Any) -> dict[str, Any]:
    return job(name, {"tensorflow": replicas}, run_policy)


def mwms_job(name: str = "mwms", workers: int = 4, **run_policy: Any) -> dict[str, Any]:
    return tf_job(name, run_policy or None, worker=replica(workers, gpus=1))


def ps_job(name: str = "ps", **run_policy: Any) -> dict[str, Any]:
    return tf_job(name, run_policy or None, chief=replica(1), ps=replica(2, cpu="1"), worker=replica(3),
                  evaluator=replica(1))


def mpi_job(name: str = "hvd", workers: int = 4, gpus: int = 2, worker_policy: str = "ExitCode",
            worker_node_selector: dict[str, str] | None = None, **run_policy: Any) -> dict[str, Any]:
    worker = replica(workers, worker_policy, gpus=gpus, image=HOROVOD_IMAGE)
    if worker_node_selector:
        worker["template"]["spec"]["nodeSelector"] = worker_node_selector
    launcher = replica(1, "Never", cpu="1", command=["mpirun", "python", "/train.py"], image=HOROVOD_IMAGE)
    return job(name, {"mpi": {"launcher": launcher, "worker": worker}}, run_policy or None)


def gloo_job(name: str = "hvd", workers: int = 3, gpus: int = 0, worker_policy: str = "ExitCode",
             **run_policy: Any) -> dict[str, Any]:
    """Horovod without SSH (spec.mpi.bootstrap Gloo): no launcher, each worker runs the training."""
    worker = replica(workers, worker_policy, gpus=gpus, image=HOROVOD_IMAGE, command=["python", "/train.py"])
    return job(name, {"mpi": {"bootstrap": "Gloo", "worker": worker}}, run_policy or None)


def with_field(manifest: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `manifest` with the field at the dotted `path` set to `value`."""
    out = copy.deepcopy(manifest)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    node[last] = value
    return out
