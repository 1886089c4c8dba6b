"""TensorFlow jobs through their whole lifecycle, on the real control plane with KWOK pods."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest

from manifests import mwms_job, ps_job, replica, tf_job
from support import Cluster, OperatorProcess, job_columns, pod_names, tf_config, wait_for, wait_pods_running

pytestmark = pytest.mark.usefixtures("operator")


def has_reason(reason: str, event: Any) -> bool:
    return bool(event.reason == reason)


def test_mwms_job_runs_to_success(cluster: Cluster, namespace: str) -> None:
    start = time.monotonic()
    cluster.apply(mwms_job("mwms", workers=4), namespace)
    pods = wait_pods_running(cluster, namespace, "mwms", 4)
    print(f"apply -> 4 pods Running: {time.monotonic() - start:.2f}s")
    status = cluster.wait_phase(namespace, "mwms", "Running")
    assert status["ready"] == "4/4"
    cols = job_columns(cluster, namespace, "mwms")
    assert (cols["PHASE"], cols["READY"], cols["RESTARTS"], cols["FRAMEWORK"]) == ("Running", "4/4", "0", "tensorflow")
    config = tf_config(next(p for p in pods if p.metadata.name == "mwms-worker-2"))
    assert config["task"] == {"type": "worker", "index": 2}
    assert config["cluster"]["worker"][0] == f"mwms-worker-0.mwms.{namespace}.svc:2222"
    svc = cluster.core.read_namespaced_service("mwms", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    for i in range(4):
        cluster.finish_pod(namespace, f"mwms-worker-{i}", 0)
    status = cluster.wait_phase(namespace, "mwms", "Succeeded")
    assert status["completionTime"] and status["startTime"]
    cols = job_columns(cluster, namespace, "mwms")
    assert (cols["PHASE"], cols["RESTARTS"]) == ("Succeeded", "0")
    for reason in ("AllPodsRunning", "JobSucceeded"):
        cluster.wait_event(namespace, "mwms", partial(has_reason, reason), f"event {reason}")


def test_ps_job_succeeds_and_ps_evaluator_are_deleted(cluster: Cluster, namespace: str) -> None:
    cluster.apply(ps_job("psjob"), namespace)
    wait_pods_running(cluster, namespace, "psjob", 7)
    status = cluster.wait_phase(namespace, "psjob", "Running")
    assert status["ready"] == "7/7"
    assert status["replicaStatuses"]["ps"] == {"active": 2, "ready": 2, "succeeded": 0, "failed": 0}
    for i in range(3):
        cluster.finish_pod(namespace, f"psjob-worker-{i}", 0)
    # The fake kubelet ends a container a moment after it is told to: a worker still Running when
    # the chief's success decides the job is one cleanPodPolicy Running deletes (as it should).
    wait_for(lambda: all(p.status.phase == "Succeeded" for p in cluster.pods(namespace, "disttrain.dev/job-name=psjob")
                         if "-worker-" in p.metadata.name), 30, "the workers Succeeded")
    cluster.finish_pod(namespace, "psjob-chief-0", 0)
    cluster.wait_phase(namespace, "psjob", "Succeeded")
    wait_for(lambda: not [n for n in pod_names(cluster, namespace, "psjob") if "-ps-" in n or "-evaluator-" in n],
             30, "ps and evaluator pods deleted")
    remaining = pod_names(cluster, namespace, "psjob")
    assert remaining == ["psjob-chief-0", "psjob-worker-0", "psjob-worker-1", "psjob-worker-2"]
    cols = wait_for(lambda: (c := job_columns(cluster, namespace, "psjob"))["READY"] == "0/7" and c, 10)
    assert (cols["PHASE"], cols["RESTARTS"]) == ("Succeeded", "0")


def test_exit_137_restarts_whole_job_then_succeeds(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mwms_job("retry", workers=3), namespace)
    before = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "retry", 3)}
    cluster.wait_phase(namespace, "retry", "Running")
    cluster.finish_pod(namespace, "retry-worker-1", 137)

    def recreated() -> dict[str, str] | None:
        pods = wait_pods_running(cluster, namespace, "retry", 3)
        uids = {p.metadata.name: p.metadata.uid for p in pods}
        return uids if all(uids[n] != before[n] for n in before) else None
    wait_for(recreated, 30, "every pod recreated (restartScope Job)")
    status = cluster.wait_phase(namespace, "retry", "Running")
    assert status["restarts"] == 1
    cluster.wait_event(namespace, "retry", lambda e: e.reason == "PodFailed" and e.type == "Warning",
                       "a PodFailed warning")
    cluster.finish_pod(namespace, "retry-worker-0", 0)
    status = cluster.wait_phase(namespace, "retry", "Succeeded")
    assert status["restarts"] == 1
    assert job_columns(cluster, namespace, "retry")["RESTARTS"] == "1"


def test_exit_137_with_ps_restarts_only_that_pod(cluster: Cluster, namespace: str) -> None:
    cluster.apply(ps_job("podscope"), namespace)
    before = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "podscope", 7)}
    cluster.wait_phase(namespace, "podscope", "Running")
    cluster.finish_pod(namespace, "podscope-worker-1", 137)

    def replaced() -> dict[str, str] | None:
        uids = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "podscope", 7)}
        return uids if uids["podscope-worker-1"] != before["podscope-worker-1"] else None
    after = wait_for(replaced, 30, "worker 1 replaced")
    assert {n: u for n, u in after.items() if n != "podscope-worker-1"} == {
        n: u for n, u in before.items() if n != "podscope-worker-1"}
    status = cluster.wait_phase(namespace, "podscope", "Running")
    assert status["restarts"] == 1


def test_exit_1_fails_the_job_naming_the_replica(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mwms_job("fatal", workers=2), namespace)
    wait_pods_running(cluster, namespace, "fatal", 2)
    cluster.finish_pod(namespace, "fatal-worker-1", 1)
    status = cluster.wait_phase(namespace, "fatal", "Failed")
    assert status["reason"] == "ReplicaFailed"
    assert status["message"] == ("worker 1 (pod fatal-worker-1) exited with code 1 (Error); restartPolicy ExitCode "
                                 "does not retry exit codes 1-127")
    cluster.wait_event(namespace, "fatal", lambda e: e.type == "Warning" and "fatal-worker-1" in e.message,
                       "a warning naming the replica")
    wait_for(lambda: pod_names(cluster, namespace, "fatal") == ["fatal-worker-1"], 30, "running pods cleaned up")


def test_restarts_beyond_backoff_limit_fail(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mwms_job("backoff", workers=2, backoffLimit=1), namespace)
    wait_pods_running(cluster, namespace, "backoff", 2)
    cluster.wait_phase(namespace, "backoff", "Running")
    cluster.finish_pod(namespace, "backoff-worker-0", 137)
    wait_for(lambda: cluster.job_status(namespace, "backoff").get("restarts") == 1, 30)
    cluster.wait_phase(namespace, "backoff", "Running")
    wait_pods_running(cluster, namespace, "backoff", 2)
    cluster.finish_pod(namespace, "backoff-worker-1", 137)
    status = cluster.wait_phase(namespace, "backoff", "Failed")
    assert status["reason"] == "BackoffLimitExceeded"
    assert "runPolicy.backoffLimit" in status["message"]


def test_active_deadline(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mwms_job("deadline", workers=2, activeDeadlineSeconds=3), namespace)
    wait_pods_running(cluster, namespace, "deadline", 2)
    status = cluster.wait_phase(namespace, "deadline", "Failed", timeout=20)
    assert status["reason"] == "DeadlineExceeded"
    wait_for(lambda: not pod_names(cluster, namespace, "deadline"), 30, "pods deleted")


def test_ttl_deletes_finished_job(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mwms_job("ttl", workers=1, ttlSecondsAfterFinished=2), namespace)
    wait_pods_running(cluster, namespace, "ttl", 1)
    cluster.finish_pod(namespace, "ttl-worker-0", 0)
    cluster.wait_phase(namespace, "ttl", "Succeeded")

    def gone() -> bool:
        return "ttl" not in cluster.kubectl("get", "dtj", "-n", namespace, "-o", "name").stdout
    wait_for(gone, 30, "the job deleted by its TTL")


def test_suspend_then_resume(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mwms_job("pause", workers=2), namespace)
    wait_pods_running(cluster, namespace, "pause", 2)
    cluster.kubectl("patch", "dtj", "pause", "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":true}}}')
    status = cluster.wait_phase(namespace, "pause", "Suspended")
    assert any(c["type"] == "Suspended" and c["status"] == "True" for c in status["conditions"])
    wait_for(lambda: not pod_names(cluster, namespace, "pause"), 30, "pods deleted while suspended")
    cluster.kubectl("patch", "dtj", "pause", "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":false}}}')
    wait_pods_running(cluster, namespace, "pause", 2)
    status = cluster.wait_phase(namespace, "pause", "Running")
    assert any(c["type"] == "Suspended" and c["status"] == "False" for c in status["conditions"])


def test_pod_deleted_from_running_job_is_replaced(cluster: Cluster, namespace: str) -> None:
    cluster.apply(ps_job("lost"), namespace)
    wait_pods_running(cluster, namespace, "lost", 7)
    cluster.wait_phase(namespace, "lost", "Running")
    old = cluster.core.read_namespaced_pod("lost-worker-2", namespace).metadata.uid
    cluster.core.delete_namespaced_pod("lost-worker-2", namespace)
    wait_for(lambda: any(p.metadata.name == "lost-worker-2" and p.metadata.uid != old and p.status.phase == "Running"
                         for p in cluster.pods(namespace, "disttrain.dev/job-name=lost")), 30, "worker 2 back")
    status = cluster.wait_phase(namespace, "lost", "Running")
    assert status["restarts"] == 1


def test_scheduling_fields_reach_pods(cluster: Cluster, namespace: str) -> None:
    job = tf_job("sched", {"scheduling": {"priorityClassName": "system-node-critical"}}, worker=replica(1))
    cluster.apply(job, namespace)
    pod = wait_for(lambda: cluster.pods(namespace, "disttrain.dev/job-name=sched"), 30)[0]
    assert pod.spec.priority_class_name == "system-node-critical"


def test_operator_restart_mid_job(cluster: Cluster, namespace: str, operator: OperatorProcess) -> None:
    cluster.apply(ps_job("survivor"), namespace)
    before = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "survivor", 7)}
    cluster.wait_phase(namespace, "survivor", "Running")
    operator.kill()
    try:
        # Things happen while it is down: the workers and chief finish.
        for i in range(3):
            cluster.finish_pod(namespace, f"survivor-worker-{i}", 0)
        workers = "disttrain.dev/job-name=survivor,disttrain.dev/replica-type=worker"
        wait_for(lambda: all(p.status.phase == "Succeeded" for p in cluster.pods(namespace, workers)), 30,
                 "the workers to finish while the operator is down")
    finally:
        operator.start()
    cluster.finish_pod(namespace, "survivor-chief-0", 0)
    status = cluster.wait_phase(namespace, "survivor", "Succeeded")
    assert status["restarts"] == 0
    pods = cluster.pods(namespace, "disttrain.dev/job-name=survivor")
    names = [p.metadata.name for p in pods]
    assert len(names) == len(set(names)), "no duplicate pods"
    for p in pods:
        assert before[p.metadata.name] == p.metadata.uid, f"{p.metadata.name} was recreated"


def test_template_only_the_pod_api_rejects_fails_the_job_naming_the_field(cluster: Cluster, namespace: str) -> None:
    # The CRD's schema checks types and names of fields; the pod API also checks values
    # (a container name must be a DNS label). The operator turns that into a Failed job.
    job = mwms_job("badname", workers=1)
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"][0]["name"] = "TF_Main"
    cluster.apply(job, namespace)
    status = cluster.wait_phase(namespace, "badname", "Failed")
    assert status["reason"] == "InvalidPodTemplate"
    assert status["message"].startswith("spec.tensorflow.worker.template: ")
    assert "containers[0].name" in status["message"]
    cluster.wait_event(namespace, "badname", lambda e: e.type == "Warning" and e.reason == "InvalidPodTemplate",
                       "an InvalidPodTemplate warning")
    assert not pod_names(cluster, namespace, "badname")
