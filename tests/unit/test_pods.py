"""TF_CONFIG, env and pod shape for the TensorFlow half of docs/api.md."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.api.spec import RestartScope
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.builders.pods import desired_pod_keys, omp_num_threads
from disttrain.builders.tensorflow import CLUSTER_ENV, INLINE_CLUSTER_BYTES, cluster_json
from manifests import container, replica, tf_job

REF = JobRef("mnist", "ml", "uid-1")


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_ps_job_tf_config() -> None:
    spec = parse_spec(tf_job(chief=replica(1), ps=replica(2), worker=replica(3), evaluator=replica(1))["spec"])
    pod = job_pod(REF, spec, PodKey("worker", 2))
    config = json.loads(env_of(pod)["TF_CONFIG"])
    assert config["task"] == {"type": "worker", "index": 2}
    assert config["environment"] == "cloud"
    assert config["cluster"] == {
        "chief": ["mnist-chief-0.mnist.ml.svc:2222"],
        "ps": ["mnist-ps-0.mnist.ml.svc:2222", "mnist-ps-1.mnist.ml.svc:2222"],
        "worker": [f"mnist-worker-{i}.mnist.ml.svc:2222" for i in range(3)],
    }
    evaluator = json.loads(env_of(job_pod(REF, spec, PodKey("evaluator", 0)))["TF_CONFIG"])
    assert evaluator["task"] == {"type": "evaluator", "index": 0}
    assert "evaluator" not in evaluator["cluster"]


def test_pod_identity_and_wiring() -> None:
    spec = parse_spec(tf_job(worker=replica(4, "ExitCode", labels={"team": "ml"}, cpu=None))["spec"])
    pod = job_pod(REF, spec, PodKey("worker", 3))
    meta = pod["metadata"]
    assert meta["name"] == "mnist-worker-3"
    assert meta["labels"] == {"team": "ml", "disttrain.dev/job-name": "mnist",
                              "disttrain.dev/replica-type": "worker", "disttrain.dev/replica-index": "3"}
    assert meta["ownerReferences"][0]["uid"] == "uid-1" and meta["ownerReferences"][0]["controller"]
    assert pod["spec"]["hostname"] == "mnist-worker-3"
    assert pod["spec"]["subdomain"] == "mnist"
    assert pod["spec"]["restartPolicy"] == "Never"
    env = env_of(pod)
    assert env["DISTTRAIN_JOB_NAME"] == "mnist"
    assert env["DISTTRAIN_REPLICA_TYPE"] == "worker"
    assert env["DISTTRAIN_REPLICA_INDEX"] == "3"
    assert env["DISTTRAIN_NUM_WORKERS"] == "4"
    assert "OMP_NUM_THREADS" not in env
    assert [k.index for k in desired_pod_keys(spec)] == [0, 1, 2, 3]


def test_user_env_wins_and_template_is_not_mutated() -> None:
    job = tf_job(worker=replica(1))
    job["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "OMP_NUM_THREADS", "value": "7"}]
    spec = parse_spec(job["spec"])
    pod = job_pod(REF, spec, PodKey("worker", 0))
    assert env_of(pod)["OMP_NUM_THREADS"] == "7"
    assert job["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"][0]["env"] == [
        {"name": "OMP_NUM_THREADS", "value": "7"}]


# "a lot": not a quantity, which the CRD lets through and the pod API refuses; no OMP_NUM_THREADS.
@pytest.mark.parametrize(("cpu", "threads"), [("4", 4), ("2500m", 2), ("500m", 1), ("1.9", 1), (8, 8), (None, None),
                                              ("a lot", None)])
def test_omp_num_threads_follows_cpu_limit(cpu: str | None, threads: int | None) -> None:
    assert omp_num_threads(container(cpu=cpu)) == threads


def test_gpu_limits_pass_through_and_scheduling_applies() -> None:
    job = tf_job(worker=replica(2, gpus=4), run_policy={"scheduling": {"schedulerName": "volcano",
                                                                      "priorityClassName": "high"}})
    pod = job_pod(REF, parse_spec(job["spec"]), PodKey("worker", 0))
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["spec"]["priorityClassName"] == "high"


def test_headless_service_publishes_unready_pods() -> None:
    svc = supporting_objects(REF, parse_spec(tf_job(worker=replica(2))["spec"]), None)[0]
    assert svc["metadata"]["name"] == "mnist"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"disttrain.dev/job-name": "mnist"}


def test_restart_scope_defaults_by_shape() -> None:
    assert parse_spec(tf_job(worker=replica(4))["spec"]).run_policy.restart_scope is RestartScope.JOB
    ps = parse_spec(tf_job(ps=replica(1), worker=replica(2))["spec"])
    assert ps.run_policy.restart_scope is RestartScope.POD
    explicit = parse_spec(tf_job(worker=replica(2), run_policy={"restartScope": "Pod"})["spec"])
    assert explicit.run_policy.restart_scope is RestartScope.POD


@given(workers=st.integers(1, 50), ps=st.integers(0, 5), chief=st.integers(0, 1))
def test_every_task_sees_the_same_cluster(workers: int, ps: int, chief: int) -> None:
    replicas = {"worker": replica(workers), "ps": replica(ps)}
    if chief:
        replicas["chief"] = replica(1)
    spec = parse_spec(tf_job("mnist", None, **replicas)["spec"])
    configs = [json.loads(env_of(job_pod(REF, spec, key))["TF_CONFIG"]) for key in desired_pod_keys(spec)]
    assert len(configs) == workers + ps + chief
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert len(configs[0]["cluster"]["worker"]) == workers
    assert ("ps" in configs[0]["cluster"]) == (ps > 0)
    tasks = {(c["task"]["type"], c["task"]["index"]) for c in configs}
    assert len(tasks) == len(configs)


def test_a_small_jobs_pods_hold_their_cluster_and_it_has_no_cluster_config_map() -> None:
    spec = parse_spec(tf_job(chief=replica(1), worker=replica(150))["spec"])
    assert spec.tensorflow is not None
    assert len(cluster_json(REF.name, REF.namespace, spec.tensorflow)) <= INLINE_CLUSTER_BYTES
    assert [o["kind"] for o in supporting_objects(REF, spec, None)] == ["Service"]
    assert len(json.loads(env_of(job_pod(REF, spec, PodKey("worker", 0)))["TF_CONFIG"])["cluster"]["worker"]) == 150


def test_a_large_jobs_pods_read_their_cluster_from_one_config_map_made_before_them() -> None:
    """1,024 workers: the cluster (~40 KB) once, in `<job>-tf-cluster-<uid>`, not in each pod (which would
    hold 40 MB of etcd between them, and make each write to a pod re-encode 40 KB)."""
    spec = parse_spec(tf_job(chief=replica(1), worker=replica(1024))["spec"])
    assert spec.tensorflow is not None
    objects = supporting_objects(REF, spec, None)
    assert [o["kind"] for o in objects] == ["Service", "ConfigMap"]
    made = objects[1]
    assert made["metadata"]["name"] == "mnist-tf-cluster-uid-1"
    assert made["immutable"] is True
    assert made["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert len(json.loads(made["data"]["cluster"])["worker"]) == 1024
    pod = job_pod(REF, spec, PodKey("worker", 1023))
    assert len(json.dumps(pod)) < 4096
    env = pod["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.index(CLUSTER_ENV) < names.index("TF_CONFIG")  # `$(NAME)` reads only what comes before
    assert env[names.index(CLUSTER_ENV)] == {
        "name": CLUSTER_ENV, "valueFrom": {"configMapKeyRef": {"name": "mnist-tf-cluster-uid-1", "key": "cluster"}}}
    template = env[names.index("TF_CONFIG")]["value"]
    assert json.loads(template.replace(f"$({CLUSTER_ENV})", made["data"]["cluster"])) == {
        "cluster": json.loads(made["data"]["cluster"]), "task": {"type": "worker", "index": 1023},
        "environment": "cloud"}


def test_a_tf_config_of_the_users_own_wins_and_its_container_gets_no_cluster_variable() -> None:
    """Nothing would read the cluster there: up to 128 KiB of environment more for nothing, and where
    every container sets its own TF_CONFIG, no ConfigMap to make (or to fail on) at all."""
    mine = {"name": "TF_CONFIG", "value": '{"task": {"type": "worker", "index": 0}}'}
    spec = parse_spec(tf_job(worker=replica(1024, env=[mine]))["spec"])
    env = job_pod(REF, spec, PodKey("worker", 5))["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] in ("TF_CONFIG", CLUSTER_ENV)] == [mine]
    assert [o["kind"] for o in supporting_objects(REF, spec, None)] == ["Service"]

    both = tf_job(worker=replica(1024))
    both["spec"]["tensorflow"]["worker"]["template"]["spec"]["containers"].append(container(name="side", env=[mine]))
    spec = parse_spec(both["spec"])
    trainer, side = job_pod(REF, spec, PodKey("worker", 5))["spec"]["containers"]
    assert [e["name"] for e in trainer["env"] if e["name"] in ("TF_CONFIG", CLUSTER_ENV)] == [CLUSTER_ENV, "TF_CONFIG"]
    assert [e for e in side["env"] if e["name"] in ("TF_CONFIG", CLUSTER_ENV)] == [mine]
    assert [o["kind"] for o in supporting_objects(REF, spec, None)] == ["Service", "ConfigMap"]
