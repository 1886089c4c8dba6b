"""MPI builders: hostfile and launcher env per implementation, discover_hosts.sh, SSH Secret."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.api.spec import MPISpec
from disttrain.builders import mpi
from disttrain.builders.desired import job_pod, supporting_objects
from disttrain.control.ssh_keys import generate_ssh_keys

REF = JobRef("hvd", "ml", "uid-9")


def mpi_spec(implementation: str = "OpenMPI", gpus: int = 2, slots: int | None = None, workers: int = 3,
             launcher_gpus: int = 0) -> MPISpec:
    def template(g: int, command: list[str] | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {"name": "main", "image": "horovod"}
        if g:
            c["resources"] = {"limits": {"nvidia.com/gpu": g}}
        if command:
            c["command"] = command
        return {"spec": {"containers": [c]}}
    raw: dict[str, Any] = {"mpi": {"implementation": implementation,
                                   "launcher": {"template": template(launcher_gpus, ["mpirun", "python", "t.py"])},
                                   "worker": {"replicas": workers, "template": template(gpus)}}}
    if slots is not None:
        raw["mpi"]["slotsPerWorker"] = slots
    spec = parse_spec(raw).mpi
    assert spec is not None
    return spec


def test_openmpi_hostfile_uses_slots_from_gpus() -> None:
    assert mpi.hostfile(REF, mpi_spec()) == (
        "hvd-worker-0.hvd.ml.svc slots=2\nhvd-worker-1.hvd.ml.svc slots=2\nhvd-worker-2.hvd.ml.svc slots=2\n")


@pytest.mark.parametrize("implementation", ["IntelMPI", "MPICH"])
def test_hydra_hostfile(implementation: str) -> None:
    assert mpi.hostfile(REF, mpi_spec(implementation, slots=4, workers=2)) == (
        "hvd-worker-0.hvd.ml.svc:4\nhvd-worker-1.hvd.ml.svc:4\n")


def test_slots_default_to_one_without_gpus() -> None:
    assert mpi.slots_per_worker(mpi_spec(gpus=0)) == 1
    assert mpi.slots_per_worker(mpi_spec(gpus=8, slots=2)) == 2


def test_openmpi_launcher_env_has_both_generations() -> None:
    env = mpi.launcher_env(mpi_spec())
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env["OMPI_MCA_orte_keep_fqdn_hostnames"] == "true"
    assert env["OMPI_MCA_plm_rsh_args"] == "-o ConnectionAttempts=10"
    assert env["PRTE_MCA_prte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env["PRTE_MCA_prte_keep_fqdn_hostnames"] == "true"
    assert env["PRTE_MCA_plm_ssh_args"] == "-o ConnectionAttempts=10"


def test_intel_and_mpich_launcher_env() -> None:
    assert mpi.launcher_env(mpi_spec("IntelMPI"))["I_MPI_HYDRA_HOST_FILE"] == "/etc/mpi/hostfile"
    assert mpi.launcher_env(mpi_spec("MPICH"))["HYDRA_HOST_FILE"] == "/etc/mpi/hostfile"


def test_discover_hosts_lists_running_workers_and_runs(tmp_path: Any) -> None:
    script = mpi.discover_hosts(REF, mpi_spec(), [2, 0])
    path = tmp_path / "discover_hosts.sh"
    path.write_text(script)
    out = subprocess.run(["sh", str(path)], capture_output=True, text=True, check=True).stdout
    assert out == "hvd-worker-0.hvd.ml.svc:2\nhvd-worker-2.hvd.ml.svc:2\n"
    assert subprocess.run(["sh", "-c", mpi.discover_hosts(REF, mpi_spec(), [])], capture_output=True,
                          text=True).stdout == ""


def test_secret_holds_a_usable_key_pair() -> None:
    keys = generate_ssh_keys("disttrain/ml/hvd")
    secret = mpi.desired_secret(REF, mpi_spec(), keys, mpi.secret_name(REF))
    data = secret["stringData"]
    private = serialization.load_ssh_private_key(data["id_ed25519"].encode(), password=None)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert data["authorized_keys"].startswith(public.decode())
    assert "IdentityFile /root/.ssh/id_ed25519" in data["config"]
    assert keys != generate_ssh_keys("disttrain/ml/hvd"), "a fresh pair per job"


def test_pods_get_ssh_config_and_sshd() -> None:
    spec = parse_spec({"mpi": {"launcher": {"template": {"spec": {"containers": [{"name": "l", "image": "h"}]}}},
                               "worker": {"replicas": 2, "template": {"spec": {"containers": [
                                   {"name": "w", "image": "h", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}}})
    worker = job_pod(REF, spec, PodKey("worker", 1))
    assert worker["metadata"]["name"] == "hvd-worker-1"
    assert worker["spec"]["containers"][0]["command"] == ["/usr/sbin/sshd", "-De", "-o", "StrictModes=no"]
    assert {"name": "ssh-auth", "mountPath": "/root/.ssh", "readOnly": True} in worker["spec"]["containers"][0][
        "volumeMounts"]
    launcher = job_pod(REF, spec, PodKey("launcher", 0))
    assert launcher["metadata"]["name"] == "hvd-launcher"
    env = {e["name"]: e["value"] for e in launcher["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "" and env["OMPI_MCA_orte_set_default_slots"] == "2"
    assert "resources" not in launcher["spec"]["containers"][0], "the launcher asks for no GPU"
    mounts = {m["mountPath"] for m in launcher["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {"/root/.ssh", "/etc/mpi"}
    kinds = [o["kind"] for o in supporting_objects(REF, spec, generate_ssh_keys("x"), [])]
    assert kinds == ["Service", "ConfigMap", "Secret"]


def _worker(container: dict[str, Any]) -> dict[str, Any]:
    spec = parse_spec({"mpi": {"launcher": {"template": {"spec": {"containers": [{"name": "l", "image": "h"}]}}},
                               "worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}})
    first: dict[str, Any] = job_pod(REF, spec, PodKey("worker", 0))["spec"]["containers"][0]
    return first


def test_the_default_sshd_worker_is_ready_only_once_sshd_accepts_connections() -> None:
    """mpi-operator#386: Ready at container start is before sshd listens; WhenWorkersReady then
    starts mpirun against a closed port. A startup probe on the SSH port holds Ready back."""
    probe = _worker({"name": "w", "image": "h"})["startupProbe"]
    assert probe["tcpSocket"] == {"port": 22} and probe["periodSeconds"] == 1
    assert probe["failureThreshold"] * probe["periodSeconds"] >= 60, "a slow start is not a failure"


@pytest.mark.parametrize("container", [
    {"name": "w", "image": "h", "command": ["python", "train.py"]},  # the user's own program
    {"name": "w", "image": "h", "args": ["-p", "2222"]},
    {"name": "w", "image": "h", "readinessProbe": {"exec": {"command": ["true"]}}},
    {"name": "w", "image": "h", "startupProbe": {"tcpSocket": {"port": 2222}}},
], ids=["own-command", "own-args", "own-readiness-probe", "own-startup-probe"])
def test_a_worker_that_brings_its_own_command_or_probe_keeps_its_own(container: dict[str, Any]) -> None:
    first = _worker(container)
    assert first.get("startupProbe") == container.get("startupProbe")
    assert first.get("readinessProbe") == container.get("readinessProbe")


def test_the_ssh_key_is_mounted_only_in_the_first_container() -> None:
    """Issue 21, defect 12: the private key went to every container of every pod, sidecars
    included (a log shipper, a proxy). Only the container that runs sshd or mpirun gets it."""
    sidecar = {"name": "log-shipper", "image": "fluent-bit"}
    spec = parse_spec({"mpi": {
        "launcher": {"template": {"spec": {"containers": [{"name": "l", "image": "h"}, sidecar]}}},
        "worker": {"replicas": 1, "template": {"spec": {"containers": [{"name": "w", "image": "h"}, sidecar]}}}}})
    for key in (PodKey("launcher", 0), PodKey("worker", 0)):
        first, second = job_pod(REF, spec, key)["spec"]["containers"]
        assert "ssh-auth" in {m["name"] for m in first["volumeMounts"]}
        assert "ssh-auth" not in {m["name"] for m in second.get("volumeMounts") or []}, key
