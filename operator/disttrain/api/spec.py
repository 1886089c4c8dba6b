"""The DistTrainJob spec as typed, immutable values.

The API server has already validated the object against the CRD schema and its CEL rules,
so parsing only reads fields and fills in the defaults from `defaults` (the same ones the
schema declares) for objects that never went through an API server (`disttrain render`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from disttrain.api import defaults


class Framework(StrEnum):
    TENSORFLOW = "tensorflow"
    MPI = "mpi"


class RestartPolicy(StrEnum):
    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    ALWAYS = "Always"
    EXIT_CODE = "ExitCode"


class RestartScope(StrEnum):
    POD = "Pod"
    JOB = "Job"


class SuccessPolicy(StrEnum):
    CHIEF_OR_WORKER0 = "ChiefOrWorker0"
    ALL_WORKERS = "AllWorkers"


class CleanPodPolicy(StrEnum):
    RUNNING = "Running"
    ALL = "All"
    NONE = "None"


class Egress(StrEnum):
    ALL = "All"  # datasets and checkpoints in object storage, package mirrors: anywhere
    PEERS_AND_DNS = "PeersAndDNS"


class MPIImplementation(StrEnum):
    OPENMPI = "OpenMPI"
    INTELMPI = "IntelMPI"
    MPICH = "MPICH"


class LauncherStart(StrEnum):
    WHEN_WORKERS_READY = "WhenWorkersReady"
    IMMEDIATELY = "Immediately"


class GangProvider(StrEnum):
    AUTO = "Auto"
    KUBERNETES = "Kubernetes"  # scheduling.k8s.io/v1alpha2 Workload and PodGroup (KEP-4671)
    SCHEDULER_PLUGINS = "SchedulerPlugins"  # scheduling.x-k8s.io/v1alpha1 PodGroup (Coscheduling)
    VOLCANO = "Volcano"  # scheduling.volcano.sh/v1beta1 PodGroup


class ReplicaType(StrEnum):
    CHIEF = "chief"
    PS = "ps"
    WORKER = "worker"
    EVALUATOR = "evaluator"
    LAUNCHER = "launcher"


# Replica types in the order they appear in TF_CONFIG, status and `disttrain render`.
TF_REPLICA_TYPES = (ReplicaType.CHIEF, ReplicaType.PS, ReplicaType.WORKER, ReplicaType.EVALUATOR)
MPI_REPLICA_TYPES = (ReplicaType.LAUNCHER, ReplicaType.WORKER)


@dataclass(frozen=True)
class ReplicaSpec:
    replicas: int
    restart_policy: RestartPolicy
    template: Mapping[str, Any]


@dataclass(frozen=True)
class TensorFlowSpec:
    replicas: Mapping[str, ReplicaSpec]  # by ReplicaType: only the types the job has, with replicas > 0
    port: int = defaults.TF_PORT
    success_policy: SuccessPolicy = SuccessPolicy(defaults.TF_SUCCESS_POLICY)


@dataclass(frozen=True)
class Elastic:
    """spec.mpi.elastic: the worker count may change between these bounds while the job runs."""
    min_replicas: int
    max_replicas: int
    scale_down_delay_seconds: int = defaults.ELASTIC_SCALE_DOWN_DELAY_SECONDS
    below_min_grace_seconds: int = defaults.ELASTIC_BELOW_MIN_GRACE_SECONDS


@dataclass(frozen=True)
class MPISpec:
    launcher: ReplicaSpec
    worker: ReplicaSpec
    implementation: MPIImplementation = MPIImplementation(defaults.MPI_IMPLEMENTATION)
    slots_per_worker: int | None = None  # None: the worker's nvidia.com/gpu limit, else 1
    ssh_auth_mount_path: str = defaults.MPI_SSH_AUTH_MOUNT_PATH
    launcher_start: LauncherStart = LauncherStart(defaults.MPI_LAUNCHER_START)
    elastic: Elastic | None = None  # None: a fixed number of workers

    @property
    def replicas(self) -> Mapping[str, ReplicaSpec]:
        return {ReplicaType.LAUNCHER: self.launcher, ReplicaType.WORKER: self.worker}


@dataclass(frozen=True)
class Gang:
    provider: GangProvider = GangProvider(defaults.GANG_PROVIDER)
    min_available: int | None = None  # None: every pod created together (docs/api.md, "Gang scheduling")
    timeout_seconds: int | None = None


@dataclass(frozen=True)
class Scheduling:
    scheduler_name: str | None = None
    gang: Gang | None = None  # None: no gang scheduling
    queue: str | None = None
    priority_class_name: str | None = None


@dataclass(frozen=True)
class NetworkIsolation:
    """runPolicy.networkPolicy: the job's pods accept connections only from each other."""
    egress: Egress = Egress(defaults.NETWORK_EGRESS)


@dataclass(frozen=True)
class RunPolicy:
    restart_scope: RestartScope
    backoff_limit: int = defaults.BACKOFF_LIMIT
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy(defaults.CLEAN_POD_POLICY)
    suspend: bool = defaults.SUSPEND
    checkpoint_grace_seconds: int = defaults.CHECKPOINT_GRACE_SECONDS
    scheduling: Scheduling = field(default_factory=Scheduling)
    network_policy: NetworkIsolation | None = None  # None: no NetworkPolicy


@dataclass(frozen=True)
class JobSpec:
    framework: Framework
    tensorflow: TensorFlowSpec | None
    mpi: MPISpec | None
    run_policy: RunPolicy
    managed_by: str | None = None  # spec.managedBy: another controller's job unless unset or ours (dispatch_steps)

    @property
    def replicas(self) -> Mapping[str, ReplicaSpec]:
        """Every replica type of the job with its spec, in a stable order."""
        if self.tensorflow is not None:
            return self.tensorflow.replicas
        assert self.mpi is not None
        return self.mpi.replicas

    @property
    def num_workers(self) -> int:
        worker = self.replicas.get(ReplicaType.WORKER)
        return worker.replicas if worker else 0

    @property
    def total_pods(self) -> int:
        return sum(r.replicas for r in self.replicas.values())


class SpecError(ValueError):
    """A spec the operator can't run; the message starts with the offending field."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")


def parse_replica(raw: Mapping[str, Any] | None) -> ReplicaSpec | None:
    if raw is None:
        return None
    return ReplicaSpec(
        replicas=int(raw.get("replicas", defaults.REPLICAS)),
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
        replica = parse_replica(tf_raw.get(rtype))
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
    launcher = parse_replica(mpi_raw.get("launcher"))
    worker = parse_replica(mpi_raw.get("worker"))
    if launcher is None:
        raise SpecError("spec.mpi.launcher", "an MPI job needs a launcher")
    if worker is None or worker.replicas < 1:
        raise SpecError("spec.mpi.worker.replicas", "an MPI job needs at least one worker")
    return MPISpec(
        # The launcher is one pod, whatever `replicas` says (the schema allows only 1).
        launcher=ReplicaSpec(1, launcher.restart_policy, launcher.template),
        worker=worker,
        implementation=MPIImplementation(mpi_raw.get("implementation", defaults.MPI_IMPLEMENTATION)),
        slots_per_worker=_opt_int(mpi_raw.get("slotsPerWorker")),
        ssh_auth_mount_path=mpi_raw.get("sshAuthMountPath", defaults.MPI_SSH_AUTH_MOUNT_PATH),
        launcher_start=LauncherStart(mpi_raw.get("launcherStart", defaults.MPI_LAUNCHER_START)),
        elastic=parse_elastic(mpi_raw.get("elastic"), worker.replicas),
    )


def parse_elastic(raw: Mapping[str, Any] | None, workers: int) -> Elastic | None:
    if raw is None:
        return None
    elastic = Elastic(
        min_replicas=int(raw.get("minReplicas", 1)),
        max_replicas=int(raw.get("maxReplicas", workers)),
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
