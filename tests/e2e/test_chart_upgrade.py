"""From the previous release to this one with jobs running, as the README's upgrade steps say, on the
real node: the previous chart and operator image (hack/releases.py) installed, a TensorFlow job and a
Gloo job started, the chart upgraded with the CRD step forgotten (the new operator names what the old
CRD lacks and stays not Ready), then this release's CRD applied (`helm upgrade` never updates a
chart's CRDs). The jobs' pods start training only once the upgrade is done (they wait for a
file the test writes: how long an upgrade and a training take here varies, and a job that ended
before it proves nothing). Both jobs finish Succeeded on the pods they had: the upgrade restarted none. Then
`helm rollback`: the previous operator runs a job again, on the newer CRD."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e_support import EXAMPLES, HELM, apply_example, pinned_namespace, running_with
from manifests import job, replica
from support import ROOT, Cluster, record_timing, wait_for

CRD = "crds/disttrainjobs.disttrain.dev.yaml"
OPERATOR = "app.kubernetes.io/name=disttrain-operator"
STEPS = "600"
# Not the e2e installation's release name: the chart's cluster-wide objects are named by the release.
RELEASE = "upgraded"


def helm(cluster: Cluster, *args: str) -> str:
    done = subprocess.run([str(HELM), *args], env=cluster.env(), capture_output=True, text=True)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


def pulls_from_the_registry(*image: str, wait: bool = True) -> list[str]:
    import registry

    return ["--set", f"imagePullSecrets[0].name={registry.PULL_SECRET}", *image,
            # Progress is written every 2 s (the chart's default is 15): these trainings last a minute.
            "--set", "progress.statusIntervalSeconds=2", *(["--wait", "--timeout", "180s"] if wait else [])]


def operator_image(cluster: Cluster, release: str) -> str:
    pods = [p for p in cluster.pods(release, OPERATOR) if not p.metadata.deletion_timestamp]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return str(pods[0].spec.containers[0].image)


def pod_runs(cluster: Cluster, ns: str) -> dict[str, tuple[str, int]]:
    """Each pod of the namespace: its UID and its containers' restarts."""
    return {p.metadata.name: (p.metadata.uid, sum(s.restart_count for s in p.status.container_statuses or []))
            for p in cluster.pods(ns)}


def gated(folder: Path) -> Callable[[dict[str, Any]], None]:
    """An edit of a job: each container waits for <folder>/open (a hostPath volume on the node)
    before its own command, which it then runs unchanged; it asks for a tenth of a CPU, so both
    jobs fit the node's two at once (their limits are unchanged)."""
    folder.mkdir(parents=True, exist_ok=True)

    def edit(job: dict[str, Any]) -> None:
        framework = job["spec"].get("tensorflow") or job["spec"]["mpi"]
        for spec in (r["template"]["spec"] for r in framework.values() if isinstance(r, dict) and "template" in r):
            spec.setdefault("volumes", []).append({"name": "gate", "hostPath": {"path": str(folder)}})
            for each in spec["containers"]:
                each.setdefault("volumeMounts", []).append({"name": "gate", "mountPath": "/gate", "readOnly": True})
                each.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "100m"
                each["command"] = ["sh", "-c", 'until [ -e /gate/open ]; do sleep 0.2; done; exec "$@"', "gate",
                                   *each["command"]]
    return edit


@pytest.fixture
def chart_aside(cluster: Cluster, chart_operator: str) -> Iterator[None]:
    """The e2e tests' own installation scaled to none meanwhile (two operators would both act on
    the jobs), and back afterwards."""
    cluster.kubectl("scale", "deploy", "-n", chart_operator, "-l", OPERATOR, "--replicas=0")
    cluster.kubectl("wait", "--for=delete", "pod", "-n", chart_operator, "-l", OPERATOR, "--timeout=60s")
    try:
        yield
    finally:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / CRD))
        cluster.kubectl("scale", "deploy", "-n", chart_operator, "-l", OPERATOR, "--replicas=1")
        cluster.kubectl("rollout", "status", "deploy", "-n", chart_operator, "-l", OPERATOR, "--timeout=120s")


@pytest.fixture
def release(cluster: Cluster, chart_aside: None) -> Iterator[str]:
    name = pinned_namespace(cluster, f"upgrade-{uuid.uuid4().hex[:6]}")
    yield name
    # What a failed run's report needs (pytest shows a test's captured output only when it failed).
    print(cluster.kubectl("get", "pods,dtj", "-A", "-o", "wide", check=False).stdout)
    print(cluster.kubectl("logs", "-n", name, "-l", OPERATOR, "--tail=60", "--prefix", check=False).stdout)
    # As the chart_operator fixture: the operator stopped before helm deletes its Roles.
    cluster.kubectl("scale", "deploy", "-n", name, "-l", OPERATOR, "--replicas=0", check=False)
    cluster.kubectl("wait", "--for=delete", "pod", "-n", name, "-l", OPERATOR, "--timeout=60s", check=False)
    subprocess.run([str(HELM), "uninstall", RELEASE, "-n", name, "--wait"], env=cluster.env(), capture_output=True)
    cluster.core.delete_namespace(name)


def test_an_upgrade_with_jobs_running_restarts_none_of_their_pods_and_rolls_back(
        cluster: Cluster, release: str, job_namespace: str, tmp_path: Path) -> None:
    import registry
    import releases

    previous = releases.source()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(previous / CRD))
    helm(cluster, "install", RELEASE, str(previous / "charts" / "disttrain-operator"), "-n", release,
         *pulls_from_the_registry("--set", f"image.repository={registry.local('disttrain/operator')}",
                                  "--set", f"image.tag={releases.PREVIOUS}"))
    assert operator_image(cluster, release) == registry.local(registry.PREVIOUS_OPERATOR)

    gate = tmp_path / "gate"
    apply_example(cluster, job_namespace, EXAMPLES / "multi-worker-mirrored" / "job.yaml", tmp_path / "tf",
                  env={"TRAIN_STEPS": STEPS}, edit_job=gated(gate))
    apply_example(cluster, job_namespace, EXAMPLES / "horovod-gloo" / "job.yaml", tmp_path / "gloo",
                  env={"TRAIN_STEPS": STEPS}, edit_job=gated(gate))
    running_with(cluster, job_namespace, "mnist-mwms", {"mnist-mwms-worker-0", "mnist-mwms-worker-1"})
    running_with(cluster, job_namespace, "horovod-gloo",
                 {"horovod-gloo-worker-0", "horovod-gloo-worker-1", "horovod-gloo-worker-2"})
    before = pod_runs(cluster, job_namespace)

    # The CRD step forgotten first: the new operator names what the old CRD lacks and stays not Ready.
    started = time.monotonic()
    helm(cluster, "upgrade", RELEASE, str(ROOT / "charts" / "disttrain-operator"), "-n", release,
         *pulls_from_the_registry("--set", f"image.registry={registry.ADDRESS}", wait=False))
    said = wait_for(lambda: "older than this operator" in (out := cluster.kubectl(
        "logs", "-n", release, "-l", OPERATOR, "--tail=50", check=False).stdout) and out, 120,
        "the new operator naming the old CRD")
    assert "spec.runPolicy.injectProgressHook" in said and "kubectl apply --server-side" in said, said
    pod = next(p for p in cluster.pods(release, OPERATOR) if not p.metadata.deletion_timestamp)
    assert not any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []), "Ready on an old CRD"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / CRD))
    cluster.kubectl("rollout", "status", "deploy", "-n", release, "-l", OPERATOR, "--timeout=120s")
    record_timing("e2e", "helm upgrade with two jobs running, the CRD applied after", time.monotonic() - started)
    assert operator_image(cluster, release) == registry.local(registry.OPERATOR)
    phases = {name: cluster.job_status(job_namespace, name).get("phase") for name in ("mnist-mwms", "horovod-gloo")}
    assert set(phases.values()) == {"Running"}, phases
    (gate / "open").touch()

    for name in ("mnist-mwms", "horovod-gloo"):
        status = wait_for(lambda n=name: (s := cluster.job_status(job_namespace, n)).get("phase")  # type: ignore[misc]
                          in ("Succeeded", "Failed") and s, 300, f"{name} to finish", interval=1)
        assert status["phase"] == "Succeeded", status.get("message")
    # The same pods, none restarted (a pod still running at the end may be deleted: cleanPodPolicy).
    after = pod_runs(cluster, job_namespace)
    assert set(after) <= set(before), f"pods made after the upgrade: {sorted(set(after) - set(before))}"
    assert after == {name: before[name] for name in after}, "a pod was replaced or restarted"

    helm(cluster, "rollback", RELEASE, "1", "-n", release, "--wait", "--timeout", "180s")
    assert operator_image(cluster, release) == registry.local(registry.PREVIOUS_OPERATOR)
    # None made or restarted: the pods the finished jobs still had may go meanwhile (cleanPodPolicy
    # deletes those running at the end, a pass after the end: a fresh clone's run saw it here).
    now = pod_runs(cluster, job_namespace)
    assert set(now) <= set(after) and now == {name: after[name] for name in now}, (now, after)
    cluster.apply(job("after-rollback", {"tensorflow": {"worker": replica(
        1, "Never", command=["python", "-c", "print('the previous operator runs jobs again')"], cpu="500m")}}),
        namespace=job_namespace)
    cluster.wait_phase(job_namespace, "after-rollback", "Succeeded", timeout=120)
