"""Every object a job should own, whatever its framework: the one entry point reconcile and
`disttrain render` use (TensorFlow specifics live in builders/tfconfig, MPI's in mpi)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disttrain import mpi
from disttrain.builders import JobRef, PodKey, desired_pod, desired_service
from disttrain.spec import JobSpec


def job_pod(ref: JobRef, spec: JobSpec, key: PodKey) -> dict[str, Any]:
    if spec.mpi is None:
        return desired_pod(ref, spec, key)
    env = mpi.launcher_extra_env(spec.mpi) if key.replica_type == "launcher" else None
    return mpi.mpi_pod_additions(ref, spec.mpi, key.replica_type, desired_pod(ref, spec, key, env))


def supporting_objects(
    ref: JobRef, spec: JobSpec, ssh_keys: mpi.SSHKeys | None, running_workers: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """What the pods need before they start: the headless Service, and for MPI the hostfile
    ConfigMap and the SSH Secret."""
    objects = [desired_service(ref, spec)]
    if spec.mpi is not None:
        if ssh_keys is None:
            raise ValueError("an MPI job's objects need its SSH keys")
        objects.append(mpi.desired_config_map(ref, spec.mpi, running_workers))
        objects.append(mpi.desired_secret(ref, spec.mpi, ssh_keys))
    return objects
