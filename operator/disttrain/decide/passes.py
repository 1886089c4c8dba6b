"""One reconcile pass: what it starts from (`JobState`), and the state its steps share while they
decide (`Pass`): the job's own pods split from an earlier job's, the plan being built, the phase
moves and the counts every status carries."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.spec import GangProvider, JobSpec, ReplicaType
from disttrain.api.status import Phase, enter_phase, ready_column, replica_statuses, timestamp
from disttrain.builders import gang, mpi, scheduling
from disttrain.builders.claims import ClaimReading
from disttrain.builders.gang import GroupStatus
from disttrain.builders.naming import pod_name
from disttrain.builders.pods import desired_pod_keys
from disttrain.builders.progress import ProgressEndpoint
from disttrain.decide.plan import Event, Plan
from disttrain.decide.policies import cleanup, elastic
from disttrain.decide.progress import ProgressState
from disttrain.decide.queueing import ObservedWorkload, QueueState
from disttrain.decide.reasons import Reason

# status.deletedPods: the UIDs of the pods the last decisions deleted (see `summarize`).
DELETED_PODS = "deletedPods"
# status.previousPods: old pods holding the names of pods still to be made (name_reuse_steps.py).
PREVIOUS_PODS = "previousPods"


@dataclass(frozen=True)
class JobState:
    ref: JobRef
    generation: int
    spec: JobSpec
    status: dict[str, Any]
    # The gang APIs (group/versions) the cluster serves, and what was read of the job's group (Volcano).
    gang_apis: frozenset[str] = frozenset()
    group: GroupStatus | None = None
    # A queued job's Kueue state (None: not queued).
    queue: QueueState | None = None
    # What its pods reported of their training, latest first (None: nothing since the operator started).
    progress: ProgressState | None = None
    # Where its reporting pods report (the operator's progress endpoint; None: not served).
    report_to: ProgressEndpoint | None = None
    # Seconds a pod name waits, once its old pod is gone, before a new pod takes it (name_reuse_steps.py).
    name_reuse_seconds: float = 0.0
    # What was read of an MPI job's workers' DRA claims (control/claims.py; decide/claim_steps.py).
    claims: ClaimReading = ClaimReading()
    # Its pods gone since its status last counted them (control/tombstones.py), their ended_at
    # when they went: status.usage counts what they held until then (decide/usage_steps.py).
    departed: tuple[ObservedPod, ...] = ()


class Pass:
    """One reconcile's inputs, split the way the steps read them, and the plan they build."""

    def __init__(self, job: JobState, pods: Sequence[ObservedPod], now: datetime.datetime,
                 ssh_keys: mpi.SSHKeys | None) -> None:
        self.job, self.spec, self.now, self.ssh_keys = job, job.spec, now, ssh_keys
        own = [p for p in pods if p.owner_uid == job.ref.uid]
        # Pods a written status already deleted. The status is written before the deletes it
        # announces, so an operator killed between the two left them behind: they are as good
        # as terminating (never judged, counted or banked again) and their delete is repeated.
        self.deleted_before = frozenset(job.status.get(DELETED_PODS) or ())
        self.redelete = [p for p in own if p.uid in self.deleted_before and not p.terminating]
        self.own = [dataclasses.replace(p, terminating=True) if p.uid in self.deleted_before else p for p in own]
        self.foreign = [p for p in pods if p.owner_uid != job.ref.uid]
        self.live = [p for p in self.own if not p.terminating]
        self.plan = Plan(status=dict(job.status))
        self.stopping = False  # a stop the operator chose is under way (decide/checkpoint_steps.py)
        if (secret := self.ssh_secret) is not None:
            self.plan.status["sshSecret"] = secret
        self.phase = Phase(job.status.get("phase") or Phase.PENDING)
        self.kubelet_restarts = sum(p.container_restarts for p in self.live)
        # Restarts the kubelet made in pods gone since the last status without the operator
        # deleting them (`kubectl delete pod`, the pod garbage collector) are banked: RESTARTS
        # never goes down and the backoff budget is never refunded (docs/api.md).
        banked = int(job.status.get("operatorRestarts", 0))
        vanished = int(job.status.get("restarts", 0)) - banked - self.kubelet_restarts
        self.restarts_so_far = banked + max(0, vanished)
        self.plan.status["operatorRestarts"] = self.restarts_so_far
        # An elastic job's workers: spec.mpi.worker.replicas now, or the quota its Workload holds if less.
        self.wanted_workers = self.spec.num_workers
        if elastic.settings(self.spec) is not None:
            admitted = self.workload.held("worker") if self.workload is not None else None
            self.wanted_workers = elastic.wanted_workers(self.spec, admitted)
        self.wanted = {pod_name(job.ref.name, k.replica_type, k.index): k for k in desired_pod_keys(self.spec)
                       if k.replica_type != ReplicaType.WORKER or k.index < self.wanted_workers}
        # Failed pods, and pods someone else is deleting for a disruption (its DisruptionTarget: a
        # node gone NotReady and its taint eviction, a preemption, a drain). The latter fail with no
        # exit code, as the pod garbage collector's do for a node deleted, so a node lost is judged
        # the same however it goes: restartPolicy Never fails the job naming the cause.
        self.failed = [p for p in self.own if p.replica_type in self.spec.replicas and (
            (not p.terminating and p.phase == "Failed")
            or (p.terminating and p.disruption is not None and p.uid not in self.deleted_before
                and p.phase not in ("Succeeded", "Failed")))]

    def move(self, to: Phase, reason: Reason, message: str, warning: bool = False) -> None:
        self.plan.status = enter_phase(self.plan.status, to, reason, message, timestamp(self.now))
        self.plan.events.append(Event("Warning" if warning else "Normal", reason, message))
        self.phase = to

    def finish(self, to: Phase, reason: Reason, message: str) -> bool:
        self.move(to, reason, message, warning=to is Phase.FAILED)
        self.plan.status["completionTime"] = timestamp(self.now)
        self.plan.status.pop(PREVIOUS_PODS, None)
        self.plan.delete = cleanup.pods_to_clean(self.spec.run_policy.clean_pod_policy, self.live)
        self.release_group()
        return True

    @property
    def workload(self) -> ObservedWorkload | None:
        """The job's own Kueue Workload (an earlier job's of the same name doesn't count)."""
        state = self.job.queue
        if state is None or state.workload is None or state.workload.owner_uid != self.job.ref.uid:
            return None
        return state.workload

    @property
    def provider(self) -> GangProvider | None:
        chosen = (self.plan.status.get("gang") or {}).get("provider")
        return GangProvider(chosen) if chosen else None

    @property
    def ssh_secret(self) -> str | None:
        """An MPI job's SSH Secret, kept in status.sshSecret: mpi.secret_name (named for the job's
        uid) for a job this operator started; `<job>-ssh` for one an earlier operator did (its
        status has a phase and no sshSecret), since its running pods mount that one. None: a
        TensorFlow job, or MPI with bootstrap Gloo."""
        if self.spec.mpi is None or self.spec.mpi.gloo:
            return None
        said = self.job.status.get("sshSecret")
        if said:
            return str(said)
        return f"{self.job.ref.name}-ssh" if self.job.status.get("phase") else mpi.secret_name(self.job.ref)

    @property
    def gang_api(self) -> str | None:
        """The version of the provider's API its groups are made (and released) with: the newest the
        cluster serves now, when the pass was told (control/groups.py reads it for every gang job that
        isn't finished), since a cluster upgraded under a job may no longer serve the one chosen
        (1.37 removed scheduling.k8s.io/v1alpha2: issue 31). Else the one chosen with it; a
        Kubernetes gang from before it was kept is v1alpha2, the only version then; other providers
        have one (None: gang.objects' default)."""
        chosen = self.plan.status.get("gang") or {}
        provider = self.provider
        if provider is not None and provider in gang.providers(self.job.gang_apis):
            return gang.api_version(provider, self.job.gang_apis)
        if chosen.get("apiVersion"):
            return str(chosen["apiVersion"])
        return gang.V1ALPHA2 if chosen.get("provider") == GangProvider.KUBERNETES else None

    def release_group(self) -> None:
        """A finished or suspended job's group goes (a leftover group holds its scheduler's quota:
        volcano#2633); a whole-job restart makes it afresh."""
        if self.provider is not None:
            self.plan.delete_objects = scheduling.objects(self.job.ref, self.spec, self.provider, self.gang_api)

    def summarize(self) -> Plan:
        """The counts every status carries. Restarts the kubelet made in pods we delete are kept,
        so RESTARTS never goes down. The pods deleted are named in the status that announces it
        (`deletedPods`), so a delete the operator didn't live to make is made, not decided, again."""
        plan = self.plan
        banked = int(plan.status.get("operatorRestarts", 0)) + sum(p.container_restarts for p in plan.delete)
        deleted = {p.uid for p in plan.delete}
        remaining = [p for p in self.live if p.uid not in deleted]
        if deleted - {""}:
            # Only with new deletes, which come with a status write anyway: pruning the list as
            # pods vanish would cost a write each. Its size stays one attempt's pods.
            still_there = {p.uid for p in self.own} & self.deleted_before
            plan.status[DELETED_PODS] = sorted((deleted - {""}) | still_there)
        plan.delete = [*plan.delete, *self.redelete]
        counts = replica_statuses(self.spec, remaining)
        plan.status.update(
            operatorRestarts=banked,
            restarts=banked + sum(p.container_restarts for p in remaining),
            replicaStatuses=counts,
            ready=ready_column(self.spec, counts),
            observedGeneration=self.job.generation,
            framework=self.spec.framework.value,
        )
        plan.status.setdefault("phase", Phase.PENDING.value)
        return plan
