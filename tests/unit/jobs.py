"""Job manifests for unit tests."""

from __future__ import annotations

from typing import Any


def container(cpu: str | None = None, gpus: int = 0, **extra: Any) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits["cpu"] = cpu
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    c: dict[str, Any] = {"name": "tensorflow", "image": "tf:latest", **extra}
    if limits:
        c["resources"] = {"limits": limits}
    return c


def replica(n: int, policy: str = "Never", **container_args: Any) -> dict[str, Any]:
    return {"replicas": n, "restartPolicy": policy,
            "template": {"metadata": {"labels": {"team": "ml"}}, "spec": {"containers": [container(**container_args)]}}}


def tf_job(name: str = "mnist", run_policy: dict[str, Any] | None = None, **replicas: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob",
            "metadata": {"name": name, "namespace": "ml", "uid": "uid-1", "generation": 1},
            "spec": {"tensorflow": dict(replicas), "runPolicy": run_policy or {}}}
