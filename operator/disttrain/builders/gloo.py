"""Horovod without SSH (spec.mpi.bootstrap: Gloo): every worker runs the training command itself.

There is no launcher, Secret, sshd or port 22. Each worker pod runs disttrain_gloo/bootstrap.py
(mounted from the job's ConfigMap: the image needs nothing but Python) ahead of its own command; the
bootstrap starts one process per slot with the variables `horovodrun --gloo` gives each rank
(horovod/runner/gloo_run.py: create_slot_env_vars and create_run_env_vars), and worker 0's bootstrap
serves the Gloo rendezvous that horovodrun would serve on the launcher host.

Why processes in one pod, not a pod per slot: a worker's slots are its GPUs, and its ranks share
the node's NVLink and memory through NCCL's and Gloo's local (intra-host) contexts, which Horovod
builds from the ranks that share a hostname; the pods, gang, Kueue podSets and hostfile slots stay
what they are with SSH. Why worker 0, not a launcher pod: the rendezvous lives exactly as long as
the world it serves (a worker lost ends a Gloo world, whichever it is), the job's failure is the
pod's own and never the operator's, and there is one pod fewer to schedule, gang and admit.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

from disttrain.api.constants import OMP_NUM_THREADS_ENV
from disttrain.api.objects import JobRef, PodKey, object_meta
from disttrain.api.spec import MPISpec, ReplicaType
from disttrain.builders.mpi import CONFIG_MOUNT, config_map_name, slots_per_worker
from disttrain.builders.naming import job_labels, pod_fqdn, pod_name
from disttrain.builders.pods import add_volumes
from disttrain.builders.resources import cpu_limit_cores

BOOTSTRAP = "disttrain_gloo.py"
# The rendezvous port on worker 0 (an HTTP key-value store; the Service names it). Any free port
# would do: horovodrun picks one at random, but peers here learn it from their pod's spec; not
# 29400 or 29500 (torchrun's), 2222 (TensorFlow's), 6006 or 8888, which a training may also open.
RENDEZVOUS_PORT = 29_410
# The interpreter the bootstrap runs under: every Python image has it (python:*, the CUDA and
# TensorFlow images, distroless python3); the training command itself is the user's, unchanged.
PYTHON = "python3"


@functools.cache
def bootstrap_source() -> str:
    return resources.files("disttrain_gloo").joinpath("bootstrap.py").read_text(encoding="utf-8")


def pod_env(job: JobRef, mpi: MPISpec, key: PodKey) -> dict[str, str]:
    """A worker pod's share of what horovodrun gives each rank; the bootstrap adds each process's
    HOROVOD_RANK and HOROVOD_LOCAL_RANK (`rank_env`), and the rendezvous's address resolved."""
    slots, workers = slots_per_worker(mpi), mpi.worker.replicas
    return {
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": pod_fqdn(job.name, job.namespace, ReplicaType.WORKER, 0),
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(RENDEZVOUS_PORT),
        "HOROVOD_HOSTNAME": pod_name(job.name, ReplicaType.WORKER, key.index),
        "HOROVOD_SIZE": str(slots * workers),
        "HOROVOD_LOCAL_SIZE": str(slots),
        "HOROVOD_CROSS_RANK": str(key.index),
        "HOROVOD_CROSS_SIZE": str(workers),
    }


def rank_env(mpi: MPISpec, worker: int, local_rank: int) -> dict[str, str]:
    """What the bootstrap adds for one process (disttrain_gloo/bootstrap.py, World.rank_env: a unit
    test holds the two together): ranks worker by worker, as horovodrun assigns them to hosts."""
    return {"HOROVOD_RANK": str(worker * slots_per_worker(mpi) + local_rank), "HOROVOD_LOCAL_RANK": str(local_rank),
            "PYTHONUNBUFFERED": "1"}


def pod_additions(job: JobRef, mpi: MPISpec, key: PodKey, pod: Mapping[str, Any]) -> dict[str, Any]:
    """The bootstrap mounted, and run ahead of the first container's own command. Its processes
    share the container's CPU limit: OMP_NUM_THREADS is the limit divided among them (unless the
    template sets it), where with SSH each rank, started by sshd, got none of the container's env."""
    volume = {"name": "mpi-config", "configMap": {"name": config_map_name(job.name),
                                                  "items": [{"key": BOOTSTRAP, "path": BOOTSTRAP, "mode": 0o444}]}}
    out = add_volumes(pod, [volume], [{"name": "mpi-config", "mountPath": CONFIG_MOUNT, "readOnly": True}],
                      first_only=True)
    first = out["spec"]["containers"][0]
    template_env = {e.get("name") for e in (mpi.worker.template.get("spec", {}).get("containers") or [{}])[0]
                    .get("env") or []}
    cores = cpu_limit_cores(first)
    if cores is not None and OMP_NUM_THREADS_ENV not in template_env:
        share = str(max(1, cores // slots_per_worker(mpi)))
        first["env"] = [dict(e, value=share) if e.get("name") == OMP_NUM_THREADS_ENV else e for e in first["env"]]
    first["args"] = ["--", *first.get("command", []), *first.get("args", [])]
    first["command"] = [PYTHON, f"{CONFIG_MOUNT}/{BOOTSTRAP}"]
    return out


def desired_config_map(job: JobRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, config_map_name(job.name), job_labels(job.name)),
        "data": {BOOTSTRAP: bootstrap_source()},
    }


def service_port() -> dict[str, Any]:
    return {"name": "gloo-rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}
