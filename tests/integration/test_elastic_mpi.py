"""Elastic MPI jobs (spec.mpi.elastic) on the real control plane with KWOK workers: bounds refused at
`kubectl apply`, `kubectl scale` through the CRD's scale subresource, discover_hosts.sh at each step."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from manifests import mpi_job, mwms_job
from support import Cluster, OperatorProcess, pod_names, wait_for, wait_pods_running

Job = dict[str, Any]


def elastic_job(name: str, workers: int = 2, low: int = 1, high: int = 3, **elastic: int) -> Job:
    job = mpi_job(name, workers=workers, gpus=0)
    job["spec"]["mpi"]["elastic"] = {"minReplicas": low, "maxReplicas": high, **elastic}
    return job


def edited(job: Job, **mpi: Any) -> Job:
    out = copy.deepcopy(job)
    out["spec"]["mpi"].update(mpi)
    return out


@pytest.mark.parametrize(("job", "expected"), [
    (elastic_job("e", workers=1, low=2, high=3), "spec.mpi.worker.replicas must be between"),
    (elastic_job("e", workers=4, low=1, high=3), "spec.mpi.worker.replicas must be between"),
    # Whichever rule the API server reports: no worker count is within bounds like these.
    (elastic_job("e", workers=2, low=3, high=2), ("spec.mpi.elastic.minReplicas is more than maxReplicas",
                                                   "spec.mpi.worker.replicas must be between")),
    (edited(elastic_job("e"), elastic={"minReplicas": 1}), "spec.mpi.elastic.maxReplicas: Required value"),
    (elastic_job("e", low=0), "spec.mpi.elastic.minReplicas: Invalid value"),
], ids=["below min", "above max", "min above max", "no max", "min 0"])
def test_elastic_bounds_are_refused_at_apply(crd: Cluster, namespace: str, job: Job,
                                            expected: str | tuple[str, ...]) -> None:
    result = crd.apply(job, namespace, check=False)
    either = expected if isinstance(expected, tuple) else (expected,)
    assert result.returncode != 0 and any(e in result.stderr for e in either), result.stderr


def test_what_kubectl_scale_may_change(crd: Cluster, namespace: str) -> None:
    crd.apply(mpi_job("fixed", workers=2, gpus=0), namespace)
    fixed = crd.kubectl("scale", "dtj/fixed", "--replicas=3", "-n", namespace, check=False)
    assert fixed.returncode != 0
    assert "spec.mpi.worker.replicas can't be changed after the job is created, unless spec.mpi.elastic is set" \
        in fixed.stderr
    crd.apply(elastic_job("grows"), namespace)
    crd.kubectl("scale", "dtj/grows", "--replicas=3", "-n", namespace)
    assert crd.job(namespace, "grows")["spec"]["mpi"]["worker"]["replicas"] == 3
    beyond = crd.kubectl("scale", "dtj/grows", "--replicas=4", "-n", namespace, check=False)
    assert beyond.returncode != 0 and "must be between spec.mpi.elastic.minReplicas and maxReplicas" in beyond.stderr
    bounds = crd.apply(edited(elastic_job("grows", workers=3), elastic={"minReplicas": 1, "maxReplicas": 5}),
                       namespace, check=False)
    assert bounds.returncode != 0 and "spec.mpi.elastic can't be changed after the job is created" in bounds.stderr
    crd.apply(mwms_job("tf", workers=2), namespace)
    # The scale subresource points at spec.mpi.worker.replicas: kubectl's patch would make a TensorFlow job
    # half an MPI job, which the schema refuses (not in the words one would wish: docs/api.md says so).
    tf = crd.kubectl("scale", "dtj/tf", "--replicas=3", "-n", namespace, check=False)
    assert tf.returncode != 0 and "spec.mpi.worker.template: Required value" in tf.stderr, tf.stderr
    assert crd.job(namespace, "tf")["spec"].get("mpi") is None


def hosts(cluster: Cluster, namespace: str, job: str) -> list[str]:
    script = cluster.core.read_namespaced_config_map(f"{job}-mpi", namespace).data["discover_hosts.sh"]
    return [line.split()[1].split(".")[0] for line in script.splitlines() if line.startswith("echo ")]


def wait_hosts(cluster: Cluster, namespace: str, job: str, expected: list[str]) -> None:
    wait_for(lambda: hosts(cluster, namespace, job) == expected, 30, f"discover_hosts.sh to list {expected}")


def test_kubectl_scale_grows_and_shrinks_the_workers_without_a_restart(
        cluster: Cluster, namespace: str, operator: OperatorProcess) -> None:
    cluster.apply(elastic_job("el", scaleDownDelaySeconds=3), namespace)
    wait_pods_running(cluster, namespace, "el", 3)
    cluster.wait_phase(namespace, "el", "Running")
    wait_hosts(cluster, namespace, "el", ["el-worker-0", "el-worker-1"])
    scale = cluster.kubectl("get", "--raw", f"/apis/disttrain.dev/v1/namespaces/{namespace}/disttrainjobs/el/scale")
    assert '"replicas":2' in scale.stdout and "disttrain.dev/replica-type=worker" in scale.stdout

    cluster.kubectl("scale", "dtj/el", "--replicas=3", "-n", namespace)
    wait_pods_running(cluster, namespace, "el", 4)
    wait_hosts(cluster, namespace, "el", ["el-worker-0", "el-worker-1", "el-worker-2"])
    status = wait_for(lambda: (s := cluster.job_status(namespace, "el")).get("elastic", {}).get("workers") == 3 and s,
                      30, "status.elastic.workers 3")
    assert status["phase"] == "Running" and status["restarts"] == 0
    assert status["elastic"]["wantedWorkers"] == 3

    cluster.kubectl("scale", "dtj/el", "--replicas=1", "-n", namespace)
    # Out of discovery at once; the pods stay for scaleDownDelaySeconds, then the highest go.
    wait_hosts(cluster, namespace, "el", ["el-worker-0"])
    assert {"el-worker-1", "el-worker-2"} <= set(pod_names(cluster, namespace, "el"))
    wait_for(lambda: pod_names(cluster, namespace, "el") == ["el-launcher", "el-worker-0"], 30,
             "workers 1 and 2 deleted after the delay")
    status = cluster.job_status(namespace, "el")
    assert status["phase"] == "Running" and status["restarts"] == 0, status
    assert "scaleDownSince" not in status["elastic"]
    events = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=WorkersScaled",
                             "-o", "jsonpath={.items[*].message}").stdout
    assert "workers wanted: 2 -> 3" in events and "deleting el-worker-1, el-worker-2" in events

    cluster.finish_pod(namespace, "el-launcher", 0)
    cluster.wait_phase(namespace, "el", "Succeeded")


def test_a_killed_worker_is_replaced_alone_and_too_few_for_too_long_restarts_the_job(
        cluster: Cluster, namespace: str, operator: OperatorProcess) -> None:
    cluster.apply(elastic_job("alone", workers=2, low=1, high=3), namespace)
    wait_pods_running(cluster, namespace, "alone", 3)
    # The job Running too: a worker failing before then (the job's pass comes up to 0.25 s after its
    # pods' start, watch/podwatch.py) is replaced with the job Restarting, not Running (a fresh make test).
    cluster.wait_phase(namespace, "alone", "Running")
    launcher = cluster.core.read_namespaced_pod("alone-launcher", namespace).metadata.uid
    cluster.finish_pod(namespace, "alone-worker-1", 137)
    status = wait_for(lambda: (s := cluster.job_status(namespace, "alone")).get("restarts") == 1 and s, 30,
                      "the worker replaced")
    assert status["phase"] == "Running" and status["reason"] == "PodFailed", status
    wait_pods_running(cluster, namespace, "alone", 3)
    wait_hosts(cluster, namespace, "alone", ["alone-worker-0", "alone-worker-1"])
    assert cluster.core.read_namespaced_pod("alone-launcher", namespace).metadata.uid == launcher

    # minReplicas 2 and no grace: the moment a worker is gone, the whole job restarts.
    cluster.apply(elastic_job("short", workers=2, low=2, high=3, belowMinGraceSeconds=0), namespace)
    wait_pods_running(cluster, namespace, "short", 3)
    cluster.wait_phase(namespace, "short", "Running")
    launcher = cluster.core.read_namespaced_pod("short-launcher", namespace).metadata.uid
    cluster.finish_pod(namespace, "short-worker-1", 137)
    cluster.wait_event(namespace, "short", lambda e: e.reason == "BelowMinReplicas", "the whole-job restart", 30)
    status = cluster.wait_phase(namespace, "short", "Running", timeout=60)
    assert status["restarts"] == 2, status
    assert cluster.core.read_namespaced_pod("short-launcher", namespace).metadata.uid != launcher
