"""Gang scheduling on the real schedulers: Kubernetes' own (GangScheduling), scheduler-plugins'
Coscheduling and Volcano, all running beside each other on the local plane (KWOK nodes).

Each test gets a KWOK node of its own with 8 GPUs; the jobs ask for it by a node selector. The
deadlock: two jobs of 6 one-GPU pods. Without gang scheduling they can each end up holding part of
the GPUs; here the interleaving a busy cluster produces by chance is made certain: the chief and ps
templates carry a scheduling gate, so both jobs' 4 workers are placed first (8 GPUs), and the test
then lifts the gates.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from manifests import mpi_job, replica, tf_job
from support import Cluster, record_timing, wait_for

pytestmark = pytest.mark.usefixtures("operator")
PROVIDERS = ["Kubernetes", "SchedulerPlugins", "Volcano"]


@pytest.fixture
def gpu_node(cluster: Cluster, namespace: str) -> Iterator[dict[str, str]]:
    """A KWOK node with 8 GPUs for this test alone; returns the node selector that reaches it."""
    from localcluster import FAKE_NODE_ANNOTATION

    name = f"gang-{namespace}"
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    cluster.core.create_node({"metadata": {"name": name, "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                                           "labels": {"gang-pool": name, "type": "kwok-gang"}},
                              "status": {"capacity": capacity, "allocatable": capacity}})
    wait_for(lambda: any(c.type == "Ready" and c.status == "True"
                         for c in cluster.core.read_node(name).status.conditions or []), 30, "the node Ready")
    yield {"gang-pool": name}
    cluster.core.delete_node(name)


def lift_gates(cluster: Cluster, ns: str, job: str) -> None:
    for pod in cluster.pods(ns, f"disttrain.dev/job-name={job}"):
        if pod.spec.scheduling_gates:
            lift = [{"op": "remove", "path": "/spec/schedulingGates"}]
            cluster.core.patch_namespaced_pod(pod.metadata.name, ns, lift)


def pinned(rep: dict[str, Any], selector: dict[str, str], gated: bool = False) -> dict[str, Any]:
    spec = rep["template"]["spec"]
    spec["nodeSelector"] = dict(selector)
    if gated:
        spec["schedulingGates"] = [{"name": "test.disttrain.dev/later"}]
    return rep


def six_pod_job(name: str, selector: dict[str, str], provider: str | None, hold: bool = False) -> dict[str, Any]:
    """chief + ps + 4 workers, one GPU each. `hold`: the chief and ps wait for their gates to be lifted."""
    run_policy = {"scheduling": {"gang": {"provider": provider}}} if provider else None
    return tf_job(name, run_policy, chief=pinned(replica(1, gpus=1, cpu="1"), selector, hold),
                  ps=pinned(replica(1, gpus=1, cpu="1"), selector, hold),
                  worker=pinned(replica(4, gpus=1, cpu="1"), selector))


def bound(cluster: Cluster, ns: str, job: str) -> int:
    return sum(1 for p in cluster.pods(ns, f"disttrain.dev/job-name={job}") if p.spec.node_name
               and not p.metadata.deletion_timestamp)


def unschedulable(cluster: Cluster, ns: str, job: str) -> list[str]:
    return [c.message for p in cluster.pods(ns, f"disttrain.dev/job-name={job}")
            for c in p.status.conditions or [] if c.type == "PodScheduled" and c.status == "False"]


def judged(cluster: Cluster, ns: str, job: str, count: int) -> bool:
    return len(unschedulable(cluster, ns, job)) == count


def test_without_gang_two_jobs_deadlock(cluster: Cluster, namespace: str, gpu_node: dict[str, str]) -> None:
    for name in ("first", "second"):
        cluster.apply(six_pod_job(name, gpu_node, None, hold=True), namespace)
    wait_for(lambda: bound(cluster, namespace, "first") + bound(cluster, namespace, "second") == 8, 30, "8 GPUs taken")
    for name in ("first", "second"):
        lift_gates(cluster, namespace, name)
    # The scheduler has judged the rest: no GPU is left for either job's chief and ps.
    for name in ("first", "second"):
        wait_for(partial(judged, cluster, namespace, name, 2), 30, f"{name}'s chief and ps unschedulable")
        assert "Insufficient nvidia.com/gpu" in unschedulable(cluster, namespace, name)[0]
        assert bound(cluster, namespace, name) == 4, "each job holds part of the GPUs"
        assert cluster.job_status(namespace, name)["phase"] == "Pending", "and neither can start"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gang_lets_one_job_run_and_the_other_wait(cluster: Cluster, namespace: str, gpu_node: dict[str, str],
                                                  provider: str) -> None:
    started = time.monotonic()
    for name in ("first", "second"):
        cluster.apply(six_pod_job(name, gpu_node, provider), namespace)
    running = wait_for(lambda: next((n for n in ("first", "second") if bound(cluster, namespace, n) == 6), None),
                       60, "one gang placed whole")
    record_timing("gang", f"{provider}: apply -> 6-pod gang bound", time.monotonic() - started)
    waiting = "second" if running == "first" else "first"
    status = wait_for(lambda: (s := cluster.job_status(namespace, waiting)).get("reason") == "WaitingForGang" and s,
                      30, "the other job to say it waits for its gang")
    assert bound(cluster, namespace, waiting) == 0 and status["phase"] == "Pending"
    assert status["message"].startswith(f"waiting for gang scheduling ({provider}): 0/6 pods scheduled")
    # ... and, once its scheduler has judged the gang, in the scheduler's own words.
    status = wait_for(lambda: "; " in (s := cluster.job_status(namespace, waiting)).get("message", "") and s, 60,
                      "the scheduler's words in the message")
    print(f"{provider}: {waiting} says: {status['message']}")
    cluster.wait_event(namespace, running, lambda e: e.reason == "GangScheduling" and provider in e.message, "choice")

    cluster.wait_phase(namespace, running, "Running")
    cluster.finish_pod(namespace, f"{running}-chief-0", 0)
    cluster.wait_phase(namespace, running, "Succeeded")
    wait_for(lambda: bound(cluster, namespace, waiting) == 6, 60, "the second gang placed once the first is done")
    cluster.wait_phase(namespace, waiting, "Running")
    cluster.finish_pod(namespace, f"{waiting}-chief-0", 0)
    cluster.wait_phase(namespace, waiting, "Succeeded")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_mpi_workers_gang_and_the_launcher_follows(cluster: Cluster, namespace: str, gpu_node: dict[str, str],
                                                   provider: str) -> None:
    jobs = []
    for name in ("hvd-a", "hvd-b"):
        job = mpi_job(name, workers=6, gpus=1, scheduling={"gang": {"provider": provider}})
        for rep in job["spec"]["mpi"].values():
            pinned(rep, gpu_node)
        cluster.apply(job, namespace)
        jobs.append(name)
    first = wait_for(lambda: next((n for n in jobs if bound(cluster, namespace, n) == 7), None), 60,
                     "one job's 6 workers, then its launcher, placed")
    second = next(n for n in jobs if n != first)
    assert bound(cluster, namespace, second) == 0
    # Its status may not be written yet when the first gang binds (a new job's first status follows
    # its pods' creation): wait for it, the reason it must say unchanged.
    wait_for(lambda: cluster.job_status(namespace, second).get("reason") == "WaitingForGang", 30,
             f"{second} saying WaitingForGang")
    cluster.finish_pod(namespace, f"{first}-launcher", 0)
    cluster.wait_phase(namespace, first, "Succeeded")
    wait_for(lambda: bound(cluster, namespace, second) == 7, 60, "the other job placed, launcher included")
    cluster.finish_pod(namespace, f"{second}-launcher", 0)
    cluster.wait_phase(namespace, second, "Succeeded")


def group_uid(cluster: Cluster, ns: str, name: str) -> str | None:
    from localcluster import gang_api

    group, version = gang_api().split("/")  # the plane's Kubernetes minor serves one (v1alpha2, v1beta1)
    groups = cluster.custom.list_namespaced_custom_object(group, version, ns, "podgroups")["items"]
    return next((g["metadata"]["uid"] for g in groups if g["metadata"]["name"] == name
                 and not g["metadata"].get("deletionTimestamp")), None)


def test_restart_makes_the_group_afresh_and_suspend_deletes_it(cluster: Cluster, namespace: str,
                                                               gpu_node: dict[str, str]) -> None:
    job = tf_job("again", {"scheduling": {"gang": {}}}, worker=pinned(replica(3, gpus=1), gpu_node))
    cluster.apply(job, namespace)
    cluster.wait_phase(namespace, "again", "Running")
    before = group_uid(cluster, namespace, "again")
    assert before is not None
    cluster.finish_pod(namespace, "again-worker-1", 137)
    wait_for(lambda: group_uid(cluster, namespace, "again") not in (None, before), 60, "a new group")
    status = cluster.wait_phase(namespace, "again", "Running", timeout=60)
    assert status["restarts"] == 1
    cluster.kubectl("patch", "dtj", "again", "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":true}}}')
    cluster.wait_phase(namespace, "again", "Suspended")
    wait_for(lambda: group_uid(cluster, namespace, "again") is None, 30, "the group deleted while suspended")
    cluster.kubectl("patch", "dtj", "again", "-n", namespace, "--type=merge", "-p",
                    '{"spec":{"runPolicy":{"suspend":false}}}')
    cluster.wait_phase(namespace, "again", "Running", timeout=60)
    assert group_uid(cluster, namespace, "again") is not None
    cluster.finish_pod(namespace, "again-worker-0", 0)
    cluster.wait_phase(namespace, "again", "Succeeded")
    wait_for(lambda: group_uid(cluster, namespace, "again") is None, 30, "the group deleted when the job finished")


def test_a_gang_that_never_fits_fails_at_its_deadline_naming_the_gang(cluster: Cluster, namespace: str,
                                                                      gpu_node: dict[str, str]) -> None:
    job = tf_job("toobig", {"scheduling": {"gang": {}}, "activeDeadlineSeconds": 8},
                 worker=pinned(replica(10, gpus=1), gpu_node))
    cluster.apply(job, namespace)
    status = cluster.wait_phase(namespace, "toobig", "Failed", timeout=40)
    assert status["reason"] == "DeadlineExceeded"
    assert "its gang was never scheduled: waiting for gang scheduling (Kubernetes): 0/10 pods scheduled" in \
        status["message"], status["message"]
    assert bound(cluster, namespace, "toobig") == 0


def test_invalid_gangs_are_refused_at_apply(crd: Cluster, namespace: str) -> None:
    too_many = tf_job(f"g-{uuid.uuid4().hex[:4]}", {"scheduling": {"gang": {"minAvailable": 5}}}, worker=replica(2))
    result = crd.apply(too_many, namespace, check=False)
    assert result.returncode != 0 and "minAvailable is more than the pods created together" in result.stderr
    unknown = tf_job("g-unknown", {"scheduling": {"gang": {"provider": "Yunikorn"}}}, worker=replica(2))
    result = crd.apply(unknown, namespace, check=False)
    assert result.returncode != 0 and "spec.runPolicy.scheduling.gang.provider" in result.stderr


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_elastic_jobs_gang_is_its_fewest_workers_and_it_grows_past_them(cluster: Cluster, namespace: str,
                                                                           gpu_node: dict[str, str],
                                                                           provider: str) -> None:
    """spec.mpi.elastic: the group asks for minReplicas workers together; a worker added by
    `kubectl scale` joins the placed group and is scheduled on its own."""
    job = mpi_job("el", workers=2, gpus=1, scheduling={"gang": {"provider": provider}})
    job["spec"]["mpi"]["elastic"] = {"minReplicas": 2, "maxReplicas": 4}
    for rep in job["spec"]["mpi"].values():
        if isinstance(rep, dict) and "template" in rep:
            pinned(rep, gpu_node)
    cluster.apply(job, namespace)
    status = cluster.wait_phase(namespace, "el", "Running", timeout=60)
    assert status["gang"]["minAvailable"] == 2, status["gang"]
    cluster.kubectl("scale", "dtj/el", "--replicas=4", "-n", namespace)
    wait_for(lambda: bound(cluster, namespace, "el") == 5, 60,
             f"the two workers added, placed ({provider}: {unschedulable(cluster, namespace, 'el')})")
    status = wait_for(lambda: (s := cluster.job_status(namespace, "el"))["elastic"]["workers"] == 4 and s, 30,
                      "4 workers in discovery")
    assert status["phase"] == "Running" and status["restarts"] == 0, status
    cluster.finish_pod(namespace, "el-launcher", 0)
    cluster.wait_phase(namespace, "el", "Succeeded")
