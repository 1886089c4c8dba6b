"""Every object a job should own, whatever its framework: the one entry point that reconcile and
`disttrain render` use.

A pod is built in three layers: the common pod (`pods`), the framework's env and volumes
(`tensorflow` or `mpi`), then scheduling's fields (`scheduling`). The supporting objects are
the headless Service, the framework's own (a large TensorFlow job's cluster ConfigMap, MPI's
hostfile ConfigMap and SSH Secret, or Gloo's bootstrap ConfigMap), the opt-in
NetworkPolicy and
scheduling's (a gang's PodGroup, and Workload), all made before the first pod. `provider` is the gang
provider the job's status records (None: no gang, or none chosen yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.progress import reporter_role
from disttrain.api.spec import GangProvider, JobSpec
from disttrain.builders import checkpoint, gloo, hook, mpi, network, pods, progress, scheduling, tensorflow


def job_pod(ref: JobRef, spec: JobSpec, key: PodKey, provider: GangProvider | None = None,
            report_to: progress.ProgressEndpoint | None = None, ssh_secret: str | None = None) -> dict[str, Any]:
    """`report_to`: the operator's progress endpoint, given to the pods that report (None: not served).
    `ssh_secret`: an MPI job's SSH Secret, as its status says (None: mpi.secret_name)."""
    env = pods.common_env(ref, spec, key)
    if spec.tensorflow is not None:
        env |= tensorflow.pod_env(ref, spec.tensorflow, key)
        pod = tensorflow.without_unread_cluster(pods.base_pod(ref, spec, key, env))
    elif spec.mpi is not None and spec.mpi.gloo:
        env |= gloo.pod_env(ref, spec.mpi, key)
        pod = gloo.pod_additions(ref, spec.mpi, key, pods.base_pod(ref, spec, key, env))
    else:
        assert spec.mpi is not None
        env |= mpi.pod_env(spec.mpi, key)
        pod = mpi.pod_additions(ref, spec.mpi, key, pods.base_pod(ref, spec, key, env), ssh_secret)
    role = reporter_role(spec, key.replica_type, key.index)
    if report_to is not None and role is not None:
        pod = progress.pod_additions(pod, ref, report_to, role)
    if report_to is not None:  # a checkpoint is asked for only where it can be confirmed
        pod = checkpoint.pod_additions(pod)
        if report_to.hook_image and spec.run_policy.inject_progress_hook:
            pod = hook.pod_additions(pod, report_to.hook_image)
    return scheduling.pod_fields(ref, spec, provider, pod)


def supporting_objects(
    ref: JobRef, spec: JobSpec, ssh_keys: mpi.SSHKeys | None, running_workers: Sequence[int] = (),
    provider: GangProvider | None = None, gang_api: str | None = None, ssh_secret: str | None = None,
    report_to: progress.ProgressEndpoint | None = None,
) -> list[dict[str, Any]]:
    """What the pods need before they start, in the order they are created."""
    if spec.tensorflow is not None:
        cluster = tensorflow.desired_config_map(ref, spec.tensorflow)
        objects = [pods.headless_service(ref, tensorflow.service_port(spec.tensorflow)),
                   *([cluster] if cluster else [])]
    elif spec.mpi is not None and spec.mpi.gloo:
        objects = [pods.headless_service(ref, gloo.service_port()), gloo.desired_config_map(ref)]
    else:
        assert spec.mpi is not None
        if ssh_keys is None:
            raise ValueError("an MPI job's objects need its SSH keys")
        objects = [pods.headless_service(ref, mpi.service_port()),
                   *mpi.supporting_objects(ref, spec.mpi, ssh_keys, running_workers, ssh_secret)]
    endpoint = report_to.pods if report_to else None
    return objects + network.policies(ref, spec, endpoint) + scheduling.objects(ref, spec, provider, gang_api)


def config_map(ref: JobRef, spec: JobSpec, running_workers: Sequence[int]) -> dict[str, Any] | None:
    """An MPI job's ConfigMap as the operator keeps it current: SSH's hostfile and
    discover_hosts.sh. None for a TensorFlow job, and for Gloo: a job keeps the bootstrap it was
    made with, so every pod of its world runs the same one across an operator upgrade."""
    if spec.mpi is None or spec.mpi.gloo:
        return None
    return mpi.desired_config_map(ref, spec.mpi, running_workers)
