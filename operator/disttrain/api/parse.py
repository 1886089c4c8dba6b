"""A DistTrainJob's spec read into the typed values of `spec`.

The API server has already validated the object against the CRD schema and its CEL rules,
so parsing only reads fields and fills in the defaults from `defaults` (the same ones the
schema declares) for objects that never went through an API server (`disttrain render`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.api import defaults
from disttrain.api.constants import MAX_REPLICAS
from disttrain.api.spec import (
    TF_REPLICA_TYPES,
    CleanPodPolicy,
    Egress,
    Elastic,
    Framework,
    Gang,
    GangProvider,
    JobSpec,
    LauncherStart,
    MPIBootstrap,
    MPIImplementation,
    MPISpec,
    NetworkIsolation,
    OnStall,
    ReplicaSpec,
    ReplicaType,
    RestartPolicy,
    RestartScope,
    RunPolicy,
    Scheduling,
    SuccessPolicy,
    TensorFlowSpec,
)


class SpecError(ValueError):
    """A spec the operator can't run; the message starts with the offending field."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")


def parse_replica(raw: Mapping[str, Any] | None, path: str = "replicas") -> ReplicaSpec | None:
    """`path`: the replica's field (spec.tensorflow.worker), for the message of a count out of bounds."""
    if raw is None:
        return None
    replicas = int(raw.get("replicas", defaults.REPLICAS))
    # The CRD says the same at `kubectl apply`; here for `disttrain render` and a job stored before it did.
    if not 0 <= replicas <= MAX_REPLICAS:
        raise SpecError(f"{path}.replicas", f"{replicas} is not a number of pods from 0 to {MAX_REPLICAS}")
    return ReplicaSpec(
        replicas=replicas,
        restart_policy=RestartPolicy(raw.get("restartPolicy", defaults.REPLICA_RESTART_POLICY)),
        template=raw.get("template") or {},
    )


def default_restart_scope(spec: Mapping[str, Any]) -> RestartScope:
    """Synchronous training (all-reduce, MPI) can't lose one member: restart the whole job.
    With parameter servers a lost worker rejoins on its own, so restart just that pod."""
    tf = spec.get("tensorflow")
    if tf is not None and int((tf.get("ps") or {}).get("replicas", 0) or 0) > 0:
        return RestartScope.POD
    return RestartScope.JOB


def parse_spec(spec: Mapping[str, Any]) -> JobSpec:
    tf_raw, mpi_raw = spec.get("tensorflow"), spec.get("mpi")
    if (tf_raw is None) == (mpi_raw is None):
        raise SpecError("spec", "exactly one of spec.tensorflow or spec.mpi must be set")
    run_policy = parse_run_policy(spec)
    if tf_raw is not None:
        return JobSpec(Framework.TENSORFLOW, parse_tensorflow(tf_raw), None, run_policy, spec.get("managedBy"))
    assert mpi_raw is not None
    return JobSpec(Framework.MPI, None, parse_mpi(mpi_raw), run_policy, spec.get("managedBy"))


def parse_run_policy(spec: Mapping[str, Any]) -> RunPolicy:
    run_raw = spec.get("runPolicy") or {}
    sched_raw = run_raw.get("scheduling") or {}
    return RunPolicy(
        restart_scope=RestartScope(run_raw.get("restartScope") or default_restart_scope(spec)),
        backoff_limit=int(run_raw.get("backoffLimit", defaults.BACKOFF_LIMIT)),
        active_deadline_seconds=_opt_int(run_raw.get("activeDeadlineSeconds")),
        ttl_seconds_after_finished=_opt_int(run_raw.get("ttlSecondsAfterFinished")),
        clean_pod_policy=CleanPodPolicy(run_raw.get("cleanPodPolicy", defaults.CLEAN_POD_POLICY)),
        suspend=bool(run_raw.get("suspend", defaults.SUSPEND)),
        checkpoint_grace_seconds=int(run_raw.get("checkpointGraceSeconds", defaults.CHECKPOINT_GRACE_SECONDS)),
        inject_progress_hook=bool(run_raw.get("injectProgressHook", defaults.INJECT_PROGRESS_HOOK)),
        stall_timeout_seconds=_opt_int(run_raw.get("stallTimeoutSeconds")),
        on_stall=OnStall(run_raw.get("onStall") or defaults.ON_STALL),
        scheduling=Scheduling(scheduler_name=sched_raw.get("schedulerName"), gang=parse_gang(sched_raw.get("gang")),
                              queue=sched_raw.get("queue"), priority_class_name=sched_raw.get("priorityClassName")),
        network_policy=parse_network_policy(run_raw.get("networkPolicy")),
    )


def parse_network_policy(raw: Mapping[str, Any] | None) -> NetworkIsolation | None:
    if raw is None:
        return None
    return NetworkIsolation(egress=Egress(raw.get("egress", defaults.NETWORK_EGRESS)))


def parse_gang(raw: Mapping[str, Any] | None) -> Gang | None:
    if raw is None:
        return None
    return Gang(provider=GangProvider(raw.get("provider", defaults.GANG_PROVIDER)),
                min_available=_opt_int(raw.get("minAvailable")), timeout_seconds=_opt_int(raw.get("timeoutSeconds")))


def parse_tensorflow(tf_raw: Mapping[str, Any]) -> TensorFlowSpec:
    replicas: dict[str, ReplicaSpec] = {}
    for rtype in TF_REPLICA_TYPES:
        replica = parse_replica(tf_raw.get(rtype), f"spec.tensorflow.{rtype}")
        if replica is not None and replica.replicas > 0:
            replicas[rtype] = replica
    if ReplicaType.CHIEF not in replicas and ReplicaType.WORKER not in replicas:
        raise SpecError("spec.tensorflow", "needs at least one chief or worker replica")
    return TensorFlowSpec(
        replicas=replicas,
        port=int(tf_raw.get("port", defaults.TF_PORT)),
        success_policy=SuccessPolicy(tf_raw.get("successPolicy", defaults.TF_SUCCESS_POLICY)),
    )


def parse_mpi(mpi_raw: Mapping[str, Any]) -> MPISpec:
    # The CRD's rules say the same at `kubectl apply`; here for `disttrain render`.
    bootstrap = MPIBootstrap(mpi_raw.get("bootstrap", defaults.MPI_BOOTSTRAP))
    launcher = parse_replica(mpi_raw.get("launcher"), "spec.mpi.launcher")
    worker = parse_replica(mpi_raw.get("worker"), "spec.mpi.worker")
    if bootstrap is MPIBootstrap.SSH and launcher is None:
        raise SpecError("spec.mpi.launcher", "an MPI job with bootstrap SSH needs a launcher")
    if bootstrap is MPIBootstrap.GLOO:
        _check_gloo(mpi_raw, launcher)
    if worker is None or worker.replicas < 1:
        raise SpecError("spec.mpi.worker.replicas", "an MPI job needs at least one worker")
    return MPISpec(
        # The launcher is one pod, whatever `replicas` says (the schema allows only 1).
        launcher=ReplicaSpec(1, launcher.restart_policy, launcher.template) if launcher else None,
        worker=worker,
        bootstrap=bootstrap,
        implementation=MPIImplementation(mpi_raw.get("implementation", defaults.MPI_IMPLEMENTATION)),
        slots_per_worker=_opt_int(mpi_raw.get("slotsPerWorker")),
        ssh_auth_mount_path=mpi_raw.get("sshAuthMountPath", defaults.MPI_SSH_AUTH_MOUNT_PATH),
        launcher_start=LauncherStart(mpi_raw.get("launcherStart", defaults.MPI_LAUNCHER_START)),
        elastic=parse_elastic(mpi_raw.get("elastic"), worker.replicas),
    )


def _check_gloo(mpi_raw: Mapping[str, Any], launcher: ReplicaSpec | None) -> None:
    if launcher is not None:
        raise SpecError("spec.mpi.launcher", GLOO_NO_LAUNCHER)
    if mpi_raw.get("elastic") is not None:
        raise SpecError("spec.mpi.elastic", GLOO_NOT_ELASTIC)
    policy = (mpi_raw.get("worker") or {}).get("restartPolicy", defaults.REPLICA_RESTART_POLICY)
    if policy not in GLOO_RESTART_POLICIES:
        raise SpecError("spec.mpi.worker.restartPolicy", GLOO_WHOLE_RESTARTS)
    containers = ((mpi_raw.get("worker") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    if not containers or not containers[0].get("command"):
        raise SpecError("spec.mpi.worker.template.spec.containers[0].command", GLOO_NEEDS_COMMAND)


# The CRD's messages for a Gloo job's rules (api/crd_spec.py), and `disttrain render`'s.
GLOO_NO_LAUNCHER = ("a job with bootstrap Gloo has no launcher: each worker runs the training command itself "
                    "(move the launcher's command to the worker's first container)")
GLOO_NOT_ELASTIC = ("elastic needs bootstrap SSH: Horovod's elastic driver (horovodrun --host-discovery-script) "
                    "starts every rank itself, over SSH, so a worker pod can't join its world on its own")
GLOO_RESTART_POLICIES = (RestartPolicy.NEVER.value, RestartPolicy.EXIT_CODE.value)
GLOO_WHOLE_RESTARTS = ("with bootstrap Gloo, must be Never or ExitCode: a Gloo world can't take back a process "
                       "the kubelet restarts in place, so the operator restarts the whole job instead")
GLOO_NEEDS_COMMAND = ("a worker with bootstrap Gloo runs its own command: set it (the training command, "
                      "e.g. [python, train.py]), the operator starts one process of it per slot")


def parse_elastic(raw: Mapping[str, Any] | None, workers: int) -> Elastic | None:
    if raw is None:
        return None
    elastic = Elastic(
        min_replicas=int(raw.get("minReplicas", 1)),
        # Past the CRD's maximum only in a job stored before it said so, where it meant "no bound".
        max_replicas=min(int(raw.get("maxReplicas", workers)), MAX_REPLICAS),
        scale_down_delay_seconds=int(raw.get("scaleDownDelaySeconds", defaults.ELASTIC_SCALE_DOWN_DELAY_SECONDS)),
        below_min_grace_seconds=int(raw.get("belowMinGraceSeconds", defaults.ELASTIC_BELOW_MIN_GRACE_SECONDS)),
    )
    # The CRD's rule says the same at `kubectl apply`; here for `disttrain render`.
    if not 1 <= elastic.min_replicas <= workers <= elastic.max_replicas:
        raise SpecError("spec.mpi.elastic", f"needs 1 <= minReplicas ({elastic.min_replicas}) <= worker.replicas "
                        f"({workers}) <= maxReplicas ({elastic.max_replicas})")
    return elastic


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
