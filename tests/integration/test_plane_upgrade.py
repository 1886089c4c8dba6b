"""The plane upgraded from 1.36 to 1.37 under gang jobs (issue 35).

1.37 removed `scheduling.k8s.io/v1alpha2` (the Workload and PodGroup a Kubernetes gang is made of on
1.36) and serves `v1beta1`. A plane of its own here starts on 1.36's control plane
(hack/build-kube-version.sh builds it from hack/kube into .cache/bin-v1.36.3) and is upgraded as
Kubernetes upgrades one: the API server on the same etcd and port, then the controller manager and
the scheduler (LocalCluster.upgrade). KWOK's nodes, their pods and the operator run on through it;
the operator is not restarted.

First, what Kubernetes' 1.37 notes ask: every v1alpha2 Workload and PodGroup deleted. A 1.37 API
server can't decode one left in etcd, and never becomes ready (its watch cache for them fails
again every second, `no kind "PodGroup" is registered for version "scheduling.k8s.io/v1alpha2"`:
tried here). A suspended job's group is gone already (the operator deletes it); a running job's
PodGroup keeps the protection finalizer while its pods run, so the admin deletes it and lifts the
finalizer; the pods, bound already, need it no more. What must hold then:

- a running gang job keeps its pods (same UIDs, no restart) and its phase; a worker failing after the
  upgrade restarts it whole with a v1beta1 group that 1.37's scheduler places, `status.gang.apiVersion`
  follows (with an event saying so; a job nothing happens to keeps the version it was made with in its
  status until its next pass, which reads what the cluster serves before it makes or deletes a group);
  it finishes Succeeded;
- a gang job suspended before the upgrade, resumed after it, makes its group as v1beta1 and runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException

from manifests import replica, tf_job
from support import (
    ROOT,
    Cluster,
    OperatorProcess,
    built_by,
    chart_identity,
    install_crd,
    pinned_versions,
    record_timing,
    wait_for,
    wait_namespace_ready,
)

VERSIONS = pinned_versions()
FROM = VERSIONS["PREVIOUS_KUBERNETES_VERSION"]
TO = VERSIONS["KUBERNETES_VERSION"]
NS = "upgrade"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A plane of its own on FROM's control plane, with the operator as a process."""
    from localcluster import LocalCluster, kube_version

    old = built_by("build-kube-version.sh", FROM, "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    assert kube_version(old) == FROM
    local = LocalCluster(root=ROOT / ".cache" / "test-upgrade", nodes=2, gang_schedulers=False, kueue=False,
                         bin_dir=old)
    with local:
        cluster = Cluster(kubeconfig=local.kubeconfig, local=local)
        install_crd(cluster)
        tmp = tmp_path_factory.mktemp("upgrade-operator")
        operator = OperatorProcess(chart_identity(cluster, tmp), tmp / "operator.log")
        operator.start()
        cluster.core.create_namespace({"metadata": {"name": NS}})
        wait_namespace_ready(cluster, NS)
        try:
            yield cluster
        finally:
            operator.stop()
            print("\n--- the operator's log, last lines ---\n" + "\n".join(operator.log().splitlines()[-40:]))


def gang_job(name: str) -> dict[str, Any]:
    return tf_job(name, {"scheduling": {"gang": {"provider": "Kubernetes"}}}, worker=replica(3, gpus=1))


def pods(cluster: Cluster, job: str) -> dict[str, str]:
    """The job's pods that are not going: name -> uid."""
    return {p.metadata.name: p.metadata.uid for p in cluster.pods(NS, f"disttrain.dev/job-name={job}")
            if not p.metadata.deletion_timestamp}


def groups(cluster: Cluster, version: str, kind: str = "podgroups", going: bool = False) -> list[str]:
    """The names of `kind` of `version` in NS; those being deleted too if `going`."""
    found = cluster.custom.list_namespaced_custom_object("scheduling.k8s.io", version, NS, kind)["items"]
    return sorted(g["metadata"]["name"] for g in found if going or not g["metadata"].get("deletionTimestamp"))


def release_v1alpha2_groups(cluster: Cluster) -> None:
    """Before the upgrade, as Kubernetes' 1.37 notes ask: every v1alpha2 PodGroup and Workload
    deleted, a PodGroup's finalizer lifted once it is being deleted (none can be added then)."""
    for kind in ("podgroups", "workloads"):
        for name in groups(cluster, "v1alpha2", kind, going=True):
            with contextlib.suppress(ApiException):  # gone already (a suspended job's, its finalizer lifted)
                cluster.custom.delete_namespaced_custom_object("scheduling.k8s.io", "v1alpha2", NS, kind, name)
            with contextlib.suppress(ApiException):  # gone already: it had no finalizer
                cluster.custom.patch_namespaced_custom_object("scheduling.k8s.io", "v1alpha2", NS, kind, name,
                                                              {"metadata": {"finalizers": None}})
    wait_for(lambda: not any(groups(cluster, "v1alpha2", kind, going=True) for kind in ("podgroups", "workloads")),
             30, "no v1alpha2 PodGroup or Workload left")


def bound(cluster: Cluster, job: str) -> int:
    return sum(1 for p in cluster.pods(NS, f"disttrain.dev/job-name={job}")
               if p.spec.node_name and not p.metadata.deletion_timestamp)


# Late in its session: `make test` builds what it needs beside the lanes (hack/testlanes.py).
@pytest.mark.late
def test_gang_jobs_running_and_suspended_come_through_an_upgrade(plane: Cluster) -> None:
    from localcluster import kube_version

    # On FROM: one job running, one suspended once it had run (its group deleted with its pods).
    for name in ("running", "paused"):
        plane.apply(gang_job(name), NS)
        status = plane.wait_phase(NS, name, "Running", timeout=60)
        assert status["gang"]["apiVersion"] == "scheduling.k8s.io/v1alpha2", status["gang"]
    assert groups(plane, "v1alpha2") == ["paused", "running"]
    plane.kubectl("patch", "dtj", "paused", "-n", NS, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    plane.wait_phase(NS, "paused", "Suspended")
    wait_for(lambda: not pods(plane, "paused"), 30, "the suspended job's pods gone")
    before = pods(plane, "running")
    assert len(before) == 3
    release_v1alpha2_groups(plane)

    started = time.monotonic()
    assert plane.local is not None
    plane.local.upgrade(ROOT / ".cache" / "bin")
    assert kube_version(plane.local.bin_dir) == TO
    versions = plane.kubectl("api-versions").stdout.split()
    assert "scheduling.k8s.io/v1beta1" in versions and "scheduling.k8s.io/v1alpha2" not in versions, versions
    record_timing("upgrade", f"{FROM} -> {TO}: the control plane replaced", time.monotonic() - started)

    # The running job runs on, its pods untouched (what the operator makes of them is seen below).
    time.sleep(5)
    status = plane.job_status(NS, "running")
    assert status["phase"] == "Running" and status["restarts"] == 0, status
    assert pods(plane, "running") == before

    # A worker fails: the whole job starts again, its group made as v1beta1 and placed by 1.37's scheduler.
    plane.finish_pod(NS, "running-worker-1", 137)
    wait_for(lambda: "running" in groups(plane, "v1beta1"), 60, "the restarted job's v1beta1 group")
    wait_for(lambda: bound(plane, "running") == 3 and set(pods(plane, "running").values()).isdisjoint(
        before.values()), 60, "the restarted job's pods placed")
    status = plane.wait_phase(NS, "running", "Running", timeout=60)
    assert status["restarts"] == 1 and status["gang"]["apiVersion"] == "scheduling.k8s.io/v1beta1", status
    said = plane.wait_event(NS, "running", lambda e: "the cluster serves scheduling.k8s.io/v1beta1" in e.message,
                            "the event saying the gang's API version changed")
    print(f"upgrade: {said.reason}: {said.message}")
    refused = [e.message for e in plane.events(NS, "running") if e.reason == "CreateRefused"]
    assert len(refused) <= 1, f"a version no longer served is said once, then the served ones read: {refused}"
    record_timing("upgrade", "the upgrade -> the restarted job Running on a v1beta1 gang", time.monotonic() - started)

    # The suspended job resumes on 1.37: a v1beta1 group, its pods placed together.
    plane.kubectl("patch", "dtj", "paused", "-n", NS, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    status = plane.wait_phase(NS, "paused", "Running", timeout=90)
    assert status["gang"]["apiVersion"] == "scheduling.k8s.io/v1beta1", status["gang"]
    assert "paused" in groups(plane, "v1beta1") and bound(plane, "paused") == 3

    for name in ("running", "paused"):
        plane.finish_pod(NS, f"{name}-worker-0", 0)
        plane.wait_phase(NS, name, "Succeeded", timeout=60)
    wait_for(lambda: not groups(plane, "v1beta1"), 30, "the finished jobs' groups deleted")
    record_timing("upgrade", "both gang jobs through the upgrade to Succeeded", time.monotonic() - started)
