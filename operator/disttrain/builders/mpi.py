"""MPI jobs (Horovod or any mpirun program): hostfile, discover_hosts.sh, the SSH Secret, launcher env.

mpirun on the launcher reaches every worker over SSH by its stable DNS name
(`<job>-worker-<i>.<job>.<ns>.svc`), with a key pair made for this job alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from disttrain.api.objects import JobRef, PodKey, object_meta
from disttrain.api.spec import MPIImplementation, MPISpec, ReplicaType
from disttrain.builders.naming import job_labels, pod_fqdn, with_uid
from disttrain.builders.pods import add_volumes
from disttrain.builders.resources import template_gpus

CONFIG_MOUNT = "/etc/mpi"
HOSTFILE = "hostfile"
DISCOVER_HOSTS = "discover_hosts.sh"
SSH_KEY = "id_ed25519"
SSH_PORT = 22
SSH_CONNECTION_ATTEMPTS = "-o ConnectionAttempts=10"
# The kubelet makes a Secret volume's directory world-writable (kubernetes/kubernetes#61049),
# which sshd's StrictModes rejects ("bad ownership or modes for directory /root/.ssh"): the
# key files themselves are 0600 and the volume is read-only, so the check protects nothing here.
WORKER_SSHD = ["/usr/sbin/sshd", "-De", "-o", "StrictModes=no"]
# Ready means reachable (mpi-operator#386): without a probe the kubelet marks the worker Ready when
# its container starts, before sshd listens, and `launcherStart: WhenWorkersReady` would start
# mpirun against a closed port. A startup probe, not a readiness probe: the container is not Ready
# until it passes (the kubelet checks `started` first), and it stops once passed, so sshd logs one
# probe connection, not one a second for the whole job. 120 tries a second apart: an sshd that
# doesn't listen in 2 minutes is broken, and the failed container fails the pod as any exit would.
def sshd_startup_probe() -> dict[str, Any]:
    return {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 120}


@dataclass(frozen=True)
class SSHKeys:
    private: str  # OpenSSH private key format
    public: str  # "ssh-ed25519 AAAA... comment"


def config_map_name(job: str) -> str:
    return f"{job}-mpi"


def secret_name(job: JobRef) -> str:
    """The job's SSH Secret: named for its uid too (naming.with_uid), so no other object holds that name
    and a create that finds it taken found the job's own (the operator needs no read of Secrets: issue
    31). A job an earlier operator started has `<job>-ssh` (its status has no `sshSecret`: decide/passes.py)."""
    return with_uid(f"{job.name}-ssh", job.uid)


def slots_per_worker(mpi: MPISpec) -> int:
    """Explicit slotsPerWorker, else the GPUs a worker asks for (one rank per GPU: nvidia.com/gpu,
    else the devices its DRA claims allocate of GPU device classes), else 1."""
    if mpi.slots_per_worker is not None:
        return mpi.slots_per_worker
    return template_gpus(mpi.worker.template) or mpi.claimed_gpus or 1


def host_line(implementation: MPIImplementation, host: str, slots: int) -> str:
    if implementation is MPIImplementation.OPENMPI:
        return f"{host} slots={slots}"
    return f"{host}:{slots}"  # Intel MPI and MPICH (Hydra)


def hostfile(job: JobRef, mpi: MPISpec) -> str:
    slots = slots_per_worker(mpi)
    return "".join(
        host_line(mpi.implementation, pod_fqdn(job.name, job.namespace, ReplicaType.WORKER, i), slots) + "\n"
        for i in range(mpi.worker.replicas)
    )


def discover_hosts(job: JobRef, mpi: MPISpec, running_workers: Sequence[int]) -> str:
    """Elastic Horovod's host discovery: prints `host:slots` for each worker running now.
    The operator rewrites it as workers come and go (the kubelet refreshes ConfigMap mounts)."""
    slots = slots_per_worker(mpi)
    hosts = [pod_fqdn(job.name, job.namespace, ReplicaType.WORKER, i) for i in sorted(running_workers)]
    lines = [f"echo {host}:{slots}" for host in hosts]
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


def desired_secret(job: JobRef, mpi: MPISpec, keys: SSHKeys, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_meta(job, name, job_labels(job.name)),
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


def pod_env(mpi: MPISpec, key: PodKey) -> dict[str, str]:
    """The launcher's MPI settings; workers get nothing beyond the common variables."""
    if key.replica_type != ReplicaType.LAUNCHER:
        return {}
    env = launcher_env(mpi)
    if mpi.launcher is not None and not template_gpus(mpi.launcher.template):
        # With the NVIDIA runtime as default, a container that asks for no GPU still sees them
        # all unless told otherwise: the launcher only runs mpirun.
        env["NVIDIA_VISIBLE_DEVICES"] = ""
        env["NVIDIA_DRIVER_CAPABILITIES"] = ""
    return env


def pod_additions(job: JobRef, mpi: MPISpec, key: PodKey, pod: Mapping[str, Any],
                  secret: str | None = None) -> dict[str, Any]:
    """The pod with what MPI needs: the SSH Secret (both roles), the hostfile ConfigMap
    (launcher), `sshd -De` for workers that bring no command."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if key.replica_type == ReplicaType.LAUNCHER:
        volumes.append({"name": "mpi-config", "configMap": {"name": config_map_name(job.name), "items": [
            {"key": HOSTFILE, "path": HOSTFILE, "mode": 0o444},
            {"key": DISCOVER_HOSTS, "path": DISCOVER_HOSTS, "mode": 0o555}]}})
        mounts.append({"name": "mpi-config", "mountPath": CONFIG_MOUNT})
    out = add_volumes(pod, volumes, mounts)
    # The private key only where sshd or mpirun runs: the first container, not a sidecar's.
    key_volume = {"name": "ssh-auth", "secret": {"secretName": secret or secret_name(job), "defaultMode": 0o600}}
    out = add_volumes(out, [key_volume], [{"name": "ssh-auth", "mountPath": mpi.ssh_auth_mount_path, "readOnly": True}],
                      first_only=True)
    first = out["spec"]["containers"][0] if out["spec"]["containers"] else {}
    if key.replica_type == ReplicaType.WORKER and not first.get("command") and not first.get("args"):
        first["command"] = WORKER_SSHD
        if not first.get("startupProbe") and not first.get("readinessProbe"):
            first["startupProbe"] = sshd_startup_probe()
    return out


def service_port() -> dict[str, Any]:
    return {"name": "ssh", "port": SSH_PORT, "targetPort": SSH_PORT}


def supporting_objects(job: JobRef, mpi: MPISpec, keys: SSHKeys, running_workers: Sequence[int],
                       secret: str | None = None) -> list[dict[str, Any]]:
    return [desired_config_map(job, mpi, running_workers), desired_secret(job, mpi, keys, secret or secret_name(job))]
