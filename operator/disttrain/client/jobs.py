"""A DistTrainJob as typed Python objects.

Each class is one object of the CRD's `spec` schema and each field one of its properties, named
in snake_case (`slots_per_worker` is `slotsPerWorker`); a field left None is left out, so the
API server's defaults apply. tests/unit/test_client_jobs.py walks these classes beside the CRD's
openAPIV3Schema both ways (every field is a property of the same type, every property of ours
is a field), so the two can't drift apart. Pod templates stay what the API takes, a
PodTemplateSpec as a dict; `Container` builds the common one-container template.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from disttrain.api.constants import API_VERSION, KIND
from disttrain.api.spec import (
    CleanPodPolicy,
    Egress,
    GangProvider,
    LauncherStart,
    MPIBootstrap,
    MPIImplementation,
    OnStall,
    RestartPolicy,
    RestartScope,
    SuccessPolicy,
)

# Fields that are not one CRD property each: how a template is made, and where a Job goes.
NOT_IN_SCHEMA = {"container", "name", "namespace", "labels", "annotations"}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def manifest_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, _Object):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: manifest_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [manifest_value(v) for v in value]
    return value


class _Object:
    """A schema object: its set fields, camelCased, in the API's shapes."""

    def to_dict(self) -> dict[str, Any]:
        return {camel(f.name): manifest_value(getattr(self, f.name)) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if f.name not in NOT_IN_SCHEMA and getattr(self, f.name) is not None}


@dataclass
class Container(_Object):
    """One container, as most training pods have: becomes `{"spec": {"containers": [...]}}`."""

    image: str
    command: list[str] | None = None
    args: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    cpu: str | int | None = None  # requests and limits alike (OMP_NUM_THREADS follows the limit)
    memory: str | None = None
    gpus: int = 0  # nvidia.com/gpu
    name: str = "main"

    def template(self) -> dict[str, Any]:
        container: dict[str, Any] = {"name": self.name, "image": self.image}
        if self.command is not None:
            container["command"] = list(self.command)
        if self.args is not None:
            container["args"] = list(self.args)
        if self.env:
            container["env"] = [{"name": k, "value": str(v)} for k, v in self.env.items()]
        resources = {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v is not None}
        limits = {**resources, **({"nvidia.com/gpu": self.gpus} if self.gpus else {})}
        if limits:
            container["resources"] = {"limits": limits, **({"requests": resources} if resources else {})}
        return {"spec": {"containers": [container]}}


@dataclass
class Replica(_Object):
    """Pods of one type: `template` (a PodTemplateSpec dict) or a `container` to make one of."""

    replicas: int | None = None
    restart_policy: RestartPolicy | None = None
    template: dict[str, Any] | None = None
    container: Container | None = None

    def to_dict(self) -> dict[str, Any]:
        if (self.template is None) == (self.container is None):
            raise ValueError("a Replica needs a template or a container (one of them)")
        out = super().to_dict()
        if self.container is not None:
            out["template"] = self.container.template()
        return out


@dataclass
class TensorFlow(_Object):
    chief: Replica | None = None
    ps: Replica | None = None
    worker: Replica | None = None
    evaluator: Replica | None = None
    port: int | None = None
    success_policy: SuccessPolicy | None = None


@dataclass
class Elastic(_Object):
    min_replicas: int
    max_replicas: int
    scale_down_delay_seconds: int | None = None
    below_min_grace_seconds: int | None = None


@dataclass(init=False)
class MPI(_Object):
    """`launcher`: a Replica with bootstrap SSH (the default), None with Gloo:
    `MPI(worker=..., bootstrap=MPIBootstrap.GLOO)`."""

    launcher: Replica | None
    worker: Replica
    implementation: MPIImplementation | None = None
    slots_per_worker: int | None = None
    ssh_auth_mount_path: str | None = None
    launcher_start: LauncherStart | None = None
    elastic: Elastic | None = None
    bootstrap: MPIBootstrap | None = None  # last: the fields before it keep their positions

    # Written out, not generated: a launcher the schema doesn't require comes before the worker
    # it does, and `MPI(launcher, worker)` keeps working positionally.
    def __init__(self, launcher: Replica | None = None, worker: Replica | None = None,
                 implementation: MPIImplementation | None = None, slots_per_worker: int | None = None,
                 ssh_auth_mount_path: str | None = None, launcher_start: LauncherStart | None = None,
                 elastic: Elastic | None = None, bootstrap: MPIBootstrap | None = None) -> None:
        if worker is None:
            raise TypeError("MPI() needs a worker: MPI(worker=Replica(...))")
        self.launcher, self.worker, self.implementation = launcher, worker, implementation
        self.slots_per_worker, self.ssh_auth_mount_path = slots_per_worker, ssh_auth_mount_path
        self.launcher_start, self.elastic, self.bootstrap = launcher_start, elastic, bootstrap

    def to_dict(self) -> dict[str, Any]:
        if self.launcher is None and self.bootstrap != MPIBootstrap.GLOO:
            raise ValueError("an MPI job with bootstrap SSH (the default) needs a launcher, which runs mpirun; "
                             "without one, bootstrap=MPIBootstrap.GLOO")
        return super().to_dict()


@dataclass
class Gang(_Object):
    provider: GangProvider | None = None
    min_available: int | None = None
    timeout_seconds: int | None = None


@dataclass
class Scheduling(_Object):
    scheduler_name: str | None = None
    priority_class_name: str | None = None
    gang: Gang | None = None
    queue: str | None = None


@dataclass
class NetworkPolicy(_Object):
    """Present: the job's pods accept connections only from each other (a NetworkPolicy)."""

    egress: Egress | None = None


@dataclass
class RunPolicy(_Object):
    backoff_limit: int | None = None
    restart_scope: RestartScope | None = None
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    clean_pod_policy: CleanPodPolicy | None = None
    suspend: bool | None = None
    checkpoint_grace_seconds: int | None = None
    inject_progress_hook: bool | None = None
    stall_timeout_seconds: int | None = None
    on_stall: OnStall | None = None
    scheduling: Scheduling | None = None
    network_policy: NetworkPolicy | None = None


@dataclass
class Spec(_Object):
    """The job's `spec`: exactly one of tensorflow and mpi."""

    tensorflow: TensorFlow | None = None
    mpi: MPI | None = None
    run_policy: RunPolicy | None = None
    # "kueue.x-k8s.io/multikueue": dispatched by Kueue's MultiKueue to a worker cluster (with a queue label).
    managed_by: str | None = None


@dataclass
class Job:
    name: str
    spec: Spec
    namespace: str | None = None  # default: the client's
    labels: dict[str, str] = field(default_factory=dict)  # kueue.x-k8s.io/queue-name, say
    annotations: dict[str, str] = field(default_factory=dict)

    def to_manifest(self, namespace: str | None = None) -> dict[str, Any]:
        """`namespace`: where the job goes when it names none itself."""
        if (self.spec.tensorflow is None) == (self.spec.mpi is None):
            raise ValueError("a Job is a TensorFlow job or an MPI job: set spec.tensorflow or spec.mpi")
        metadata: dict[str, Any] = {"name": self.name}
        if self.namespace or namespace:  # the Job's own first: `namespace` is the client's default
            metadata["namespace"] = self.namespace or namespace
        if self.labels:
            metadata["labels"] = dict(self.labels)
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": self.spec.to_dict()}
