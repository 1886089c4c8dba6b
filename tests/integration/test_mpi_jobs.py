"""MPI jobs on the real control plane: hostfile, launcher gating, lifecycle, SSH secrets."""

from __future__ import annotations

import base64
import re

import pytest

from manifests import gloo_job, mpi_job
from support import Cluster, OperatorProcess, pod_names, wait_for, wait_pods_running

pytestmark = pytest.mark.usefixtures("operator")


def test_mpi_job_hostfile_gating_success(cluster: Cluster, namespace: str) -> None:
    # The workers can't schedule until a node carries pool=late: the launcher must wait.
    node = cluster.core.list_node(label_selector="type=kwok").items[-1].metadata.name
    cluster.apply(mpi_job("hvd", workers=4, gpus=2, worker_node_selector={"pool": f"late-{namespace}"}), namespace)
    wait_for(lambda: len(pod_names(cluster, namespace, "hvd")) == 4, 30, "4 workers created")
    hostfile = wait_for(lambda: cluster.core.read_namespaced_config_map("hvd-mpi", namespace).data, 30)["hostfile"]
    assert hostfile.splitlines() == [f"hvd-worker-{i}.hvd.{namespace}.svc slots=2" for i in range(4)]
    # The operator has judged the unready workers once it says so; only then is "no launcher" a verdict.
    # The scheduler's words come first (policies/waiting.py): the workers can't be placed.
    status = wait_for(lambda: (s := cluster.job_status(namespace, "hvd")).get("reason") == "Unschedulable"
                      and s, 30, "the job to say its workers can't be scheduled")
    assert status["phase"] == "Pending", status
    # Whichever worker the scheduler marked first is named: all four wait on the same missing label.
    assert re.match(r"pod hvd-worker-[0-3] can't be scheduled: 0/", status["message"]), status["message"]
    assert "hvd-launcher" not in pod_names(cluster, namespace, "hvd"), "launcher before the workers are Ready"

    cluster.core.patch_node(node, {"metadata": {"labels": {"pool": f"late-{namespace}"}}})
    try:
        pods = wait_pods_running(cluster, namespace, "hvd", 5)
    finally:
        cluster.core.patch_node(node, {"metadata": {"labels": {"pool": None}}})
    workers_ready = max(c.last_transition_time for p in pods if "worker" in p.metadata.name
                        for c in p.status.conditions if c.type == "Ready")
    launcher = next(p for p in pods if p.metadata.name == "hvd-launcher")
    assert launcher.metadata.creation_timestamp >= workers_ready.replace(microsecond=0)
    env = {e.name: e.value for e in launcher.spec.containers[0].env}
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert "resources" not in (launcher.spec.containers[0].to_dict() or {}) or not (
        launcher.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu")
    worker = next(p for p in pods if p.metadata.name == "hvd-worker-0")
    assert worker.spec.containers[0].command == ["/usr/sbin/sshd", "-De", "-o", "StrictModes=no"]
    assert worker.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    status = cluster.wait_phase(namespace, "hvd", "Running")
    assert status["ready"] == "5/5"
    discover = wait_for(lambda: (d := cluster.core.read_namespaced_config_map("hvd-mpi", namespace)
                                 .data["discover_hosts.sh"]).count("echo") == 4 and d, 30, "discover_hosts.sh")
    assert f"echo hvd-worker-3.hvd.{namespace}.svc:2" in discover

    cluster.finish_pod(namespace, "hvd-launcher", 0)
    cluster.wait_phase(namespace, "hvd", "Succeeded")
    wait_for(lambda: pod_names(cluster, namespace, "hvd") == ["hvd-launcher"], 30, "workers deleted")


def wait_recreated(cluster: Cluster, namespace: str, job: str, before: dict[str, str]) -> None:
    """Until every pod in `before` (name: uid) runs again as a new pod: a whole-job restart."""
    def restarted() -> bool:
        pods = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, job, len(before))}
        return all(pods[n] != before[n] for n in before)
    wait_for(restarted, 40, f"every pod of {job} recreated")


def test_worker_exit_137_restarts_the_mpi_job(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mpi_job("hvdr", workers=2, gpus=1), namespace)
    before = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "hvdr", 3)}
    cluster.wait_phase(namespace, "hvdr", "Running")
    cluster.finish_pod(namespace, "hvdr-worker-1", 137)
    wait_recreated(cluster, namespace, "hvdr", before)
    status = cluster.wait_phase(namespace, "hvdr", "Running")
    assert status["restarts"] == 1
    cluster.finish_pod(namespace, "hvdr-launcher", 0)
    assert cluster.wait_phase(namespace, "hvdr", "Succeeded")["restarts"] == 1


def test_launcher_failure_fails_the_job(cluster: Cluster, namespace: str) -> None:
    cluster.apply(mpi_job("hvdf", workers=1, gpus=0), namespace)
    wait_pods_running(cluster, namespace, "hvdf", 2)
    cluster.finish_pod(namespace, "hvdf-launcher", 2)
    status = cluster.wait_phase(namespace, "hvdf", "Failed")
    assert "launcher 0 (pod hvdf-launcher) exited with code 2" in status["message"]


def test_ssh_secrets_differ_per_job_and_stay_out_of_logs(cluster: Cluster, namespace: str,
                                                         operator: OperatorProcess) -> None:
    for name in ("alpha", "beta"):
        cluster.apply(mpi_job(name, workers=1, gpus=0), namespace)
    def secret_data(name: str) -> dict[str, str]:
        return wait_for(lambda: cluster.core.read_namespaced_secret(
            cluster.job_status(namespace, name).get("sshSecret") or "not-yet", namespace).data, 30)
    secrets = {name: secret_data(name) for name in ("alpha", "beta")}
    keys = {n: base64.b64decode(s["id_ed25519"]).decode() for n, s in secrets.items()}
    assert keys["alpha"] != keys["beta"]
    assert base64.b64decode(secrets["alpha"]["authorized_keys"]) != base64.b64decode(secrets["beta"]["authorized_keys"])
    wait_pods_running(cluster, namespace, "alpha", 2)
    log = operator.log()
    for key in keys.values():
        body = "".join(key.strip().splitlines()[1:-1])
        assert body[:40] not in log.replace("\n", "")
        assert "PRIVATE KEY" not in log


def test_a_gloo_job_has_no_launcher_no_secret_and_succeeds_when_every_worker_does(cluster: Cluster,
                                                                                  namespace: str) -> None:
    """spec.mpi.bootstrap Gloo: three workers running the bootstrap ahead of their command, the
    ConfigMap holding it, no Secret; a killed worker restarts the whole world; success is every
    worker's (there is no launcher to say so)."""
    cluster.apply(gloo_job("gl", workers=3), namespace)
    before = {p.metadata.name: p.metadata.uid for p in wait_pods_running(cluster, namespace, "gl", 3)}
    assert sorted(before) == ["gl-worker-0", "gl-worker-1", "gl-worker-2"]
    worker = cluster.core.read_namespaced_pod("gl-worker-2", namespace)
    assert worker.spec.containers[0].command == ["python3", "/etc/mpi/disttrain_gloo.py"]
    assert worker.spec.containers[0].args == ["--", "python", "/train.py"]
    env = {e.name: e.value for e in worker.spec.containers[0].env}
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == f"gl-worker-0.gl.{namespace}.svc" and env["HOROVOD_CROSS_RANK"] == "2"
    assert "disttrain_gloo.py" in cluster.core.read_namespaced_config_map("gl-mpi", namespace).data
    assert not [s for s in cluster.core.list_namespaced_secret(namespace).items if s.metadata.name.startswith("gl-")]
    assert "sshSecret" not in cluster.job_status(namespace, "gl")
    cluster.wait_phase(namespace, "gl", "Running")

    cluster.finish_pod(namespace, "gl-worker-1", 137)
    wait_recreated(cluster, namespace, "gl", before)
    cluster.wait_phase(namespace, "gl", "Running")
    cluster.finish_pod(namespace, "gl-worker-0", 0)
    cluster.finish_pod(namespace, "gl-worker-1", 0)
    assert cluster.job_status(namespace, "gl")["phase"] == "Running", "two of three workers are not the job"
    cluster.finish_pod(namespace, "gl-worker-2", 0)
    status = cluster.wait_phase(namespace, "gl", "Succeeded")
    assert status["restarts"] == 1 and "all 3 workers succeeded" in status["message"], status
