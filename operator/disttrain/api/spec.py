"""The DistTrainJob spec as typed, immutable values (`parse` reads a job's spec into them)."""

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


class OnStall(StrEnum):
    REPORT = "Report"  # the Stalled condition, a Warning event and the gauge; the pods are left as they are
    RESTART = "Restart"  # besides: the whole job restarted, counted toward backoffLimit


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


class MPIBootstrap(StrEnum):
    """How an MPI job's ranks start: mpirun on a launcher over SSH, or each worker running the
    training command itself with Horovod's Gloo rendezvous (docs/api.md, "Horovod without SSH")."""
    SSH = "SSH"
    GLOO = "Gloo"


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
# TF_CONFIG's `cluster` (builders/tensorflow.py), and what the CRD's size rule counts (crd_size.py).
# The evaluator is not a member of the training cluster: it reads checkpoints and never serves.
# Measured with TensorFlow 2.21 (tests/integration/test_real_tensorflow.py runs it this way):
# with the evaluator listed in `cluster`, a ParameterServerStrategy chief hangs connecting to
# the evaluator's address (no server there; still waiting after 120 s), while
# MultiWorkerMirroredStrategy tolerates it. Left out, both train and the evaluator still
# learns its role from `task`.
CLUSTER_MEMBER_TYPES = (ReplicaType.CHIEF, ReplicaType.PS, ReplicaType.WORKER)


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
    launcher: ReplicaSpec | None  # None: bootstrap Gloo, where the workers start themselves
    worker: ReplicaSpec
    bootstrap: MPIBootstrap = MPIBootstrap(defaults.MPI_BOOTSTRAP)
    implementation: MPIImplementation = MPIImplementation(defaults.MPI_IMPLEMENTATION)
    slots_per_worker: int | None = None  # None: the worker's nvidia.com/gpu limit, else 1
    ssh_auth_mount_path: str = defaults.MPI_SSH_AUTH_MOUNT_PATH
    launcher_start: LauncherStart = LauncherStart(defaults.MPI_LAUNCHER_START)
    elastic: Elastic | None = None  # None: a fixed number of workers
    # GPUs a worker gets through its DRA claims, as the controller read them (control/claims.py);
    # None: not read (no claims, or `disttrain render` without the claims' objects).
    claimed_gpus: int | None = None

    @property
    def replicas(self) -> Mapping[str, ReplicaSpec]:
        if self.launcher is None:
            return {ReplicaType.WORKER: self.worker}
        return {ReplicaType.LAUNCHER: self.launcher, ReplicaType.WORKER: self.worker}

    @property
    def gloo(self) -> bool:
        return self.bootstrap is MPIBootstrap.GLOO


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
    inject_progress_hook: bool = defaults.INJECT_PROGRESS_HOOK
    stall_timeout_seconds: int | None = None  # None: derived from the job's own reports (policies/stall.py)
    on_stall: OnStall = OnStall(defaults.ON_STALL)
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
