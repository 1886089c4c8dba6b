"""The Python client and `disttrain logs` on the local plane: a job built from the client's
classes, submitted, waited for through Running to Succeeded (KWOK pods finished by the tests'
finish_pod), its logs asked for, deleted. KWOK pods have no logs to give: here the commands
must say so per pod and end with the job; tests/e2e reads real logs on the real node."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from disttrain.client import Client, Container, Job, JobError, JobStatus, Replica, RestartPolicy, Spec, TensorFlow
from support import Cluster, OperatorProcess, kubectl_binary, wait_for, wait_pods_running


@pytest.fixture
def dt(cluster: Cluster, namespace: str) -> Iterator[Client]:
    with Client(namespace, kubeconfig=str(cluster.kubeconfig)) as client:
        yield client


def two_workers(name: str) -> Job:
    return Job(name, Spec(tensorflow=TensorFlow(worker=Replica(
        replicas=2, restart_policy=RestartPolicy.EXIT_CODE,
        container=Container("disttrain/tensorflow:2.21", command=["python", "/train.py"], cpu=1)))))


def test_submit_wait_and_delete(cluster: Cluster, operator: OperatorProcess, namespace: str, dt: Client) -> None:
    seen: list[JobStatus] = []
    assert dt.submit(two_workers("client-job")) == "client-job"
    running = dt.wait("client-job", until=["Running"], timeout=60, progress=seen.append, interval=0.2)
    assert (running.phase, running.ready, running.restarts) == ("Running", "2/2", 0)
    assert [s.name for s in dt.jobs()] == ["client-job"]
    cluster.finish_pod(namespace, "client-job-worker-0", 0)
    done = dt.wait("client-job", timeout=60, progress=seen.append, interval=0.2)
    assert done.phase == "Succeeded" and done.reason == "JobSucceeded"
    phases = [s.phase for s in seen]
    assert phases.index("Running") < phases.index("Succeeded")
    dt.delete("client-job", wait=True)
    with pytest.raises(JobError, match="not found"):
        dt.get("client-job")


def test_the_api_servers_word_on_a_bad_job(crd: Cluster, namespace: str, dt: Client) -> None:
    job = two_workers("two-chiefs")
    job.spec.tensorflow.chief = Replica(replicas=2, container=Container("x"))  # type: ignore[union-attr]
    with pytest.raises(JobError, match=r"chief\.replicas"):
        dt.submit(job)


def logs_cli(cluster: Cluster, *args: str, kubectl_plugin: bool = False) -> subprocess.Popen[str]:
    """`disttrain logs`, or `kubectl disttrain logs`: kubectl finds the kubectl-disttrain the
    package installs on its PATH."""
    command = [kubectl_binary(), "disttrain"] if kubectl_plugin else [sys.executable, "-m", "disttrain"]
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.Popen([*command, "logs", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**cluster.env(), "PATH": path})


@pytest.mark.parametrize("kubectl_plugin", [False, True], ids=["disttrain", "kubectl-plugin"])
def test_logs_follow_ends_with_the_job(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                       kubectl_plugin: bool) -> None:
    name = "followed"
    cluster.apply(two_workers(name).to_manifest(namespace))
    wait_pods_running(cluster, namespace, name, 2)
    follow = logs_cli(cluster, name, "-n", namespace, "-f", kubectl_plugin=kubectl_plugin)
    try:
        cluster.finish_pod(namespace, f"{name}-worker-0", 0)
        cluster.wait_phase(namespace, name, "Succeeded")
        out, err = follow.communicate(timeout=30)  # ends by itself once the job has
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert all(line.startswith("[worker-") for line in out.splitlines()), out
    # KWOK's pods have no kubelet to stream from: each says so, named, on stderr.
    assert all(line.startswith("[worker-") and "no log from pod" in line for line in err.splitlines()), err


def test_logs_of_a_missing_job(cluster: Cluster, crd: Cluster, namespace: str) -> None:
    proc = logs_cli(cluster, "nothing", "-n", namespace)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and f"no DistTrainJob {namespace}/nothing" in err, err


def test_logs_without_follow_and_with_a_type(cluster: Cluster, operator: OperatorProcess, namespace: str,
                                             dt: Client) -> None:
    dt.submit(two_workers("once"))
    wait_pods_running(cluster, namespace, "once", 2)
    lines = wait_for(lambda: list(dt.logs("once", replica_type="worker")), 10, "log lines")
    assert sorted(line.source for line in lines) == ["worker-0", "worker-1"]
