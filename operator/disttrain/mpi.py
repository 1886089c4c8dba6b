"""Pure builders for MPI jobs: hostfile, discover_hosts.sh, the SSH Secret and launcher env.

mpirun on the launcher reaches every worker over SSH by its stable DNS name
(`<job>-worker-<i>.<job>.<ns>.svc`), with a key pair made for this job alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from disttrain.builders import JobRef, object_meta
from disttrain.constants import GPU_RESOURCE
from disttrain.naming import job_labels, pod_fqdn
from disttrain.spec import MPIImplementation, MPISpec

CONFIG_MOUNT = "/etc/mpi"
HOSTFILE = "hostfile"
DISCOVER_HOSTS = "discover_hosts.sh"
SSH_KEY = "id_ed25519"
SSH_CONNECTION_ATTEMPTS = "-o ConnectionAttempts=10"
# The kubelet makes a Secret volume's directory world-writable (kubernetes/kubernetes#61049),
# which sshd's StrictModes rejects ("bad ownership or modes for directory /root/.ssh"): the
# key files themselves are 0600 and the volume is read-only, so the check protects nothing here.
WORKER_SSHD = ["/usr/sbin/sshd", "-De", "-o", "StrictModes=no"]


@dataclass(frozen=True)
class SSHKeys:
    private: str  # OpenSSH private key format
    public: str  # "ssh-ed25519 AAAA... comment"


def generate_ssh_keys(comment: str) -> SSHKeys:
    """A fresh key pair for one job (impure: the controller calls it once per job)."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return SSHKeys(private=private, public=f"{public} {comment}")


def config_map_name(job: str) -> str:
    return f"{job}-mpi"


def secret_name(job: str) -> str:
    return f"{job}-ssh"


def slots_per_worker(mpi: MPISpec) -> int:
    """Explicit slotsPerWorker, else the GPUs a worker asks for (one rank per GPU), else 1."""
    if mpi.slots_per_worker is not None:
        return mpi.slots_per_worker
    for container in (mpi.worker.template.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        if GPU_RESOURCE in limits:
            return max(1, int(str(limits[GPU_RESOURCE])))
    return 1


def host_line(implementation: MPIImplementation, host: str, slots: int) -> str:
    if implementation is MPIImplementation.OPENMPI:
        return f"{host} slots={slots}"
    return f"{host}:{slots}"  # Intel MPI and MPICH (Hydra)


def hostfile(job: JobRef, mpi: MPISpec) -> str:
    slots = slots_per_worker(mpi)
    return "".join(
        host_line(mpi.implementation, pod_fqdn(job.name, job.namespace, "worker", i), slots) + "\n"
        for i in range(mpi.worker.replicas)
    )


def discover_hosts(job: JobRef, mpi: MPISpec, running_workers: Sequence[int]) -> str:
    """Elastic Horovod's host discovery: prints `host:slots` for each worker running now.
    The operator rewrites it as workers come and go (the kubelet refreshes ConfigMap mounts)."""
    slots = slots_per_worker(mpi)
    lines = [f"echo {pod_fqdn(job.name, job.namespace, 'worker', i)}:{slots}" for i in sorted(running_workers)]
    return "#!/bin/sh\n" + "".join(line + "\n" for line in lines)


def desired_config_map(job: JobRef, mpi: MPISpec, running_workers: Sequence[int]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, config_map_name(job.name), job_labels(job.name)),
        "data": {HOSTFILE: hostfile(job, mpi), DISCOVER_HOSTS: discover_hosts(job, mpi, running_workers)},
    }


def ssh_config(mount_path: str) -> str:
    # Workers are this job's own pods, made fresh with each run: there is no known host key to
    # pin, and the job's private key is the trust boundary.
    return (
        "Host *\n"
        f"  IdentityFile {mount_path}/{SSH_KEY}\n"
        "  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n"
        "  LogLevel ERROR\n"
    )


def desired_secret(job: JobRef, mpi: MPISpec, keys: SSHKeys) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_meta(job, secret_name(job.name), job_labels(job.name)),
        "stringData": {
            SSH_KEY: keys.private,
            f"{SSH_KEY}.pub": keys.public + "\n",
            "authorized_keys": keys.public + "\n",
            "config": ssh_config(mpi.ssh_auth_mount_path),
        },
    }


def launcher_env(mpi: MPISpec) -> dict[str, str]:
    hostfile_path = f"{CONFIG_MOUNT}/{HOSTFILE}"
    if mpi.implementation is MPIImplementation.OPENMPI:
        return {
            # Open MPI 4 (ORTE) ...
            "OMPI_MCA_orte_default_hostfile": hostfile_path,
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_plm_rsh_args": SSH_CONNECTION_ATTEMPTS,
            "OMPI_MCA_orte_set_default_slots": str(slots_per_worker(mpi)),
            # ... and Open MPI 5 (PRRTE), which reads its own names.
            "PRTE_MCA_prte_default_hostfile": hostfile_path,
            "PRTE_MCA_prte_set_default_slots": str(slots_per_worker(mpi)),
            "PRTE_MCA_prte_keep_fqdn_hostnames": "true",
            "PRTE_MCA_plm_ssh_args": SSH_CONNECTION_ATTEMPTS,
        }
    if mpi.implementation is MPIImplementation.INTELMPI:
        return {
            "I_MPI_HYDRA_HOST_FILE": hostfile_path,
            "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": SSH_CONNECTION_ATTEMPTS,
        }
    return {"HYDRA_HOST_FILE": hostfile_path, "HYDRA_LAUNCH_EXTRA_ARGS": SSH_CONNECTION_ATTEMPTS}


def mpi_pod_additions(job: JobRef, mpi: MPISpec, replica_type: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod with what MPI needs: the SSH Secret (both roles), the hostfile ConfigMap and
    launcher env (launcher), `sshd -De` for workers that bring no command."""
    out = dict(pod)
    spec = dict(out["spec"])
    volumes = list(spec.get("volumes") or [])
    volumes.append({"name": "ssh-auth", "secret": {"secretName": secret_name(job.name), "defaultMode": 0o600}})
    mounts = [{"name": "ssh-auth", "mountPath": mpi.ssh_auth_mount_path, "readOnly": True}]
    if replica_type == "launcher":
        volumes.append({"name": "mpi-config", "configMap": {"name": config_map_name(job.name), "items": [
            {"key": HOSTFILE, "path": HOSTFILE, "mode": 0o444},
            {"key": DISCOVER_HOSTS, "path": DISCOVER_HOSTS, "mode": 0o555}]}})
        mounts.append({"name": "mpi-config", "mountPath": CONFIG_MOUNT})
    containers = []
    for i, container in enumerate(spec.get("containers") or []):
        c = dict(container)
        c["volumeMounts"] = list(c.get("volumeMounts") or []) + mounts
        if i == 0 and replica_type == "worker" and not c.get("command") and not c.get("args"):
            c["command"] = WORKER_SSHD
        containers.append(c)
    spec["containers"] = containers
    spec["volumes"] = volumes
    out["spec"] = spec
    return out


def launcher_extra_env(mpi: MPISpec) -> dict[str, str]:
    env = launcher_env(mpi)
    if not _asks_for_gpu(mpi.launcher.template):
        # With the NVIDIA runtime as default, a container that asks for no GPU still sees them
        # all unless told otherwise: the launcher only runs mpirun.
        env["NVIDIA_VISIBLE_DEVICES"] = ""
        env["NVIDIA_DRIVER_CAPABILITIES"] = ""
    return env


def _asks_for_gpu(template: Mapping[str, Any]) -> bool:
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        if GPU_RESOURCE in (resources.get("limits") or {}) or GPU_RESOURCE in (resources.get("requests") or {}):
            return True
    return False
