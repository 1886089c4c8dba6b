"""One reconcile: the job and the pods observed now -> the writes that move it forward.

A pure function. The kopf handlers fetch the job and its pods from their in-memory indexes,
call `reconcile`, and carry out the returned `Plan`: write the status, create and delete pods,
post the events. Pod names are deterministic (`<job>-<type>-<index>`), so a repeated create
is refused by the API server rather than duplicating a pod, and an operator restarted mid-job
finds its pods by name and carries on.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from disttrain import mpi
from disttrain.builders import JobRef, PodKey, desired_pod_keys
from disttrain.desired import job_pod, supporting_objects
from disttrain.naming import pod_name
from disttrain.observed import ObservedPod
from disttrain.spec import CleanPodPolicy, JobSpec, LauncherStart, RestartPolicy, RestartScope, SuccessPolicy
from disttrain.status import (
    FINISHED,
    Phase,
    enter_phase,
    parse_timestamp,
    ready_column,
    replica_statuses,
    set_condition,
    timestamp,
)


@dataclass(frozen=True)
class JobState:
    ref: JobRef
    generation: int
    spec: JobSpec
    status: Mapping[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[ObservedPod] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None  # seconds until a deadline or TTL falls due
    # Objects to keep current while the job runs (MPI's discover_hosts.sh follows the workers).
    keep_current: list[dict[str, Any]] = field(default_factory=list)


def is_retryable(policy: RestartPolicy, exit_code: int | None) -> bool:
    """Whether a failed pod may be replaced. With ExitCode, 128+ means the process was killed
    (a signal, OOM, eviction): worth a retry; 1-127 is the program's own verdict. A pod that
    failed with no exit code at all (evicted, node lost) counts as killed."""
    if policy is RestartPolicy.NEVER:
        return False
    if policy is RestartPolicy.EXIT_CODE:
        return exit_code is None or exit_code >= 128
    # OnFailure / Always: the kubelet restarts containers; a pod that fails anyway was evicted.
    return True


def describe_failure(pod: ObservedPod) -> str:
    how = f"exited with code {pod.exit_code}" if pod.exit_code is not None else "failed"
    why = f" ({pod.reason})" if pod.reason else ""
    return f"{pod.replica_type} {pod.index} (pod {pod.name}) {how}{why}"


def success_message(spec: JobSpec, pods: Sequence[ObservedPod]) -> str | None:
    """Why the job has succeeded, or None while it hasn't. ps and evaluator never decide."""
    done = {(p.replica_type, p.index) for p in pods if p.phase == "Succeeded" and not p.terminating}
    if spec.mpi is not None:
        return "the launcher succeeded" if ("launcher", 0) in done else None
    assert spec.tensorflow is not None
    if "chief" in spec.replicas:
        return "the chief succeeded" if ("chief", 0) in done else None
    if spec.tensorflow.success_policy is SuccessPolicy.ALL_WORKERS:
        if all(("worker", i) in done for i in range(spec.num_workers)):
            return f"all {spec.num_workers} workers succeeded"
        return None
    return "worker 0 succeeded" if ("worker", 0) in done else None


def pods_to_clean(policy: CleanPodPolicy, pods: Sequence[ObservedPod]) -> list[ObservedPod]:
    if policy is CleanPodPolicy.ALL:
        return [p for p in pods if not p.terminating]
    if policy is CleanPodPolicy.RUNNING:
        return [p for p in pods if p.active]
    return []


def reconcile(
    job: JobState, pods: Sequence[ObservedPod], now: datetime.datetime, ssh_keys: mpi.SSHKeys | None = None
) -> Plan:
    """`ssh_keys`: for an MPI job, the key pair its Secret gets if the Secret must be made."""
    return _Reconcile(job, pods, now, ssh_keys).run()


class _Reconcile:
    """The state of one reconcile while it decides; `run` returns the finished plan."""

    def __init__(
        self, job: JobState, pods: Sequence[ObservedPod], now: datetime.datetime, ssh_keys: mpi.SSHKeys | None
    ) -> None:
        self.job, self.spec, self.run_policy = job, job.spec, job.spec.run_policy
        self.ssh_keys = ssh_keys
        self.pods = list(pods)
        self.live = [p for p in pods if not p.terminating]
        self.now, self.now_s = now, timestamp(now)
        self.plan = Plan(status=dict(job.status))
        self.phase = Phase(job.status.get("phase") or Phase.PENDING)

    def move(self, to: Phase, reason: str, message: str, warning: bool = False) -> None:
        self.plan.status = enter_phase(self.plan.status, to, reason, message, self.now_s)
        self.plan.events.append(Event("Warning" if warning else "Normal", reason, message))

    def finish(self, to: Phase, reason: str, message: str) -> None:
        self.move(to, reason, message, warning=to is Phase.FAILED)
        self.plan.status["completionTime"] = self.now_s
        self.plan.delete = pods_to_clean(self.run_policy.clean_pod_policy, self.live)

    def run(self) -> Plan:
        plan, run = self.plan, self.run_policy
        if self.phase in FINISHED:
            plan.delete = pods_to_clean(run.clean_pod_policy, self.live)
            _schedule_ttl(plan, run.ttl_seconds_after_finished, self.now)
        elif run.suspend:
            plan.delete = list(self.live)
            if self.phase is not Phase.SUSPENDED:
                self.move(Phase.SUSPENDED, "JobSuspended", "runPolicy.suspend is true: the job's pods are deleted")
        else:
            if self.phase is Phase.SUSPENDED:
                # Resumed: start afresh, and the deadline counts from now (as a Kubernetes Job does).
                self.move(Phase.PENDING, "JobResumed", "runPolicy.suspend is false again: starting afresh")
                plan.status["startTime"] = self.now_s
                self.phase = Phase.PENDING
            plan.status.setdefault("startTime", self.now_s)
            if _deadline_passed(plan, run.active_deadline_seconds, self.now):
                self.finish(Phase.FAILED, "DeadlineExceeded",
                            f"the job was active longer than runPolicy.activeDeadlineSeconds "
                            f"({run.active_deadline_seconds}s)")
            else:
                self.advance()
            if plan.status.get("phase") in FINISHED:
                _schedule_ttl(plan, run.ttl_seconds_after_finished, self.now)

        # Restarts the kubelet made in pods we delete are kept, so RESTARTS never goes down.
        banked = int(plan.status.get("operatorRestarts", 0)) + sum(p.container_restarts for p in plan.delete)
        deleted = {p.uid for p in plan.delete}
        remaining = [p for p in self.live if p.uid not in deleted]
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

    def explain_waiting_launcher(self, present: set[str]) -> None:
        """An MPI job whose launcher waits for its workers says so in `message` (the count moves
        only as workers become Ready, so this writes rarely and never flaps)."""
        spec = self.spec
        if spec.mpi is None or spec.mpi.launcher_start is not LauncherStart.WHEN_WORKERS_READY:
            return
        if pod_name(self.job.ref.name, "launcher", 0) in present or self.phase is not Phase.PENDING:
            return
        ready = len(_ready_workers(self.live))
        self.plan.status["reason"] = "WaitingForWorkers"
        self.plan.status["message"] = (
            f"{ready}/{spec.mpi.worker.replicas} workers Ready; the launcher starts when all are "
            f"(launcherStart: WhenWorkersReady). Pending workers: kubectl describe pod -l "
            f"disttrain.dev/job-name={self.job.ref.name},disttrain.dev/replica-type=worker")

    def running_workers(self) -> list[int]:
        return sorted(p.index for p in self.live if p.replica_type == "worker" and p.phase == "Running")

    def advance(self) -> None:
        """A job that is neither finished nor suspended: judge its pods, restart or create."""
        spec, run, ref, plan = self.spec, self.run_policy, self.job.ref, self.plan
        restarts_so_far = int(self.job.status.get("operatorRestarts", 0))
        kubelet_restarts = sum(p.container_restarts for p in self.live)
        wanted = {pod_name(ref.name, k.replica_type, k.index): k for k in desired_pod_keys(spec)}
        present = {p.name for p in self.pods}

        message = success_message(spec, self.pods)
        if message is not None:
            self.finish(Phase.SUCCEEDED, "JobSucceeded", message)
            return

        failed = [p for p in self.live if p.phase == "Failed" and p.replica_type in spec.replicas]
        fatal = [p for p in failed
                 if not is_retryable(spec.replicas[p.replica_type].restart_policy, p.exit_code)]
        if fatal:
            policy = spec.replicas[fatal[0].replica_type].restart_policy
            rule = "does not retry exit codes 1-127" if policy is RestartPolicy.EXIT_CODE else "does not retry"
            self.finish(Phase.FAILED, "ReplicaFailed",
                        f"{describe_failure(fatal[0])}; restartPolicy {policy.value} {rule}")
            return

        # A pod gone (or going) from a running job was deleted from under it, by a user, a drain
        # or a node going away: the operator itself deletes pods only as it leaves Running.
        # Handled like a retryable failure.
        live_names = {p.name for p in self.live}
        lost = [name for name in wanted if name not in live_names] if self.phase is Phase.RUNNING else []
        if failed or lost:
            whole_job = run.restart_scope is RestartScope.JOB
            added = 1 if whole_job else len(failed) + len(lost)
            what = describe_failure(failed[0]) if failed else f"pod {lost[0]} was deleted"
            if restarts_so_far + kubelet_restarts + added > run.backoff_limit:
                self.finish(Phase.FAILED, "BackoffLimitExceeded",
                            f"{what}, and the job has used all {run.backoff_limit} restarts of "
                            f"runPolicy.backoffLimit")
                return
            plan.status["operatorRestarts"] = restarts_so_far + added
            plan.delete = list(self.live) if whole_job else failed
            scope = "the whole job" if whole_job else "the pod"
            self.move(Phase.RESTARTING, "PodFailed" if failed else "PodDeleted",
                      f"{what}; restarting {scope} (restart {restarts_so_far + added} of {run.backoff_limit})",
                      warning=True)
            return
        if restarts_so_far + kubelet_restarts > run.backoff_limit:
            self.finish(Phase.FAILED, "BackoffLimitExceeded",
                        f"containers restarted {kubelet_restarts} times, more than runPolicy.backoffLimit "
                        f"({run.backoff_limit})")
            return

        # Create what is missing. After a whole-job restart, wait until every old pod is gone:
        # a new worker must not meet an old peer that is still shutting down.
        terminating = any(p.terminating for p in self.pods)
        if not (run.restart_scope is RestartScope.JOB and terminating):
            to_create = [k for name, k in wanted.items()
                         if name not in present and _may_start(spec, k, self.live)]
            if to_create:
                plan.create.extend(supporting_objects(ref, spec, self.ssh_keys, self.running_workers()))
                plan.create.extend(job_pod(ref, spec, k) for k in to_create)
        if spec.mpi is not None:
            plan.keep_current.append(mpi.desired_config_map(ref, spec.mpi, self.running_workers()))

        if all(name in present for name in wanted) and not terminating:
            plan.status["conditions"] = set_condition(
                list(plan.status.get("conditions") or []), "Created", True, "PodsCreated",
                f"created {len(wanted)} pods", self.now_s)
        self.explain_waiting_launcher(present)
        running = {p.name for p in self.live if p.phase in ("Running", "Succeeded")}
        if all(name in running for name in wanted):
            if self.phase is not Phase.RUNNING:
                self.move(Phase.RUNNING, "AllPodsRunning", f"all {len(wanted)} pods are running")
        elif self.phase is Phase.RUNNING:
            # A pod is back to Pending without our restart (replaced behind our back): say so.
            self.move(Phase.RESTARTING, "PodsNotRunning", "some pods are not running", warning=True)


def _may_start(spec: JobSpec, key: PodKey, live: Sequence[ObservedPod]) -> bool:
    """MPI's launcher waits for every worker to be Ready unless told to start immediately:
    mpirun fails at once if a worker's sshd isn't listening yet.

    With gang scheduling (runPolicy.scheduling.gang, not acted on yet) this must not deadlock:
    a PodGroup whose minMember counts the launcher would hold the workers until the launcher
    exists, while the launcher waits for Ready workers. So the gang is the pods created
    together: minMember = workers (+ the launcher only with launcherStart: Immediately); the
    launcher, created later, joins the already-admitted group as one more member."""
    if spec.mpi is None or key.replica_type != "launcher":
        return True
    if spec.mpi.launcher_start is LauncherStart.IMMEDIATELY:
        return True
    ready = _ready_workers(live)
    return all(i in ready for i in range(spec.mpi.worker.replicas))


def _ready_workers(live: Sequence[ObservedPod]) -> set[int]:
    """Indexes of the workers that are Running and Ready: what the MPI launcher waits for."""
    return {p.index for p in live if p.replica_type == "worker" and p.ready and p.phase == "Running"}


def _deadline_passed(plan: Plan, deadline: int | None, now: datetime.datetime) -> bool:
    if deadline is None:
        return False
    start = parse_timestamp(plan.status.get("startTime")) or now
    remaining = (start - now).total_seconds() + deadline
    if remaining <= 0:
        return True
    plan.requeue_after = _sooner(plan.requeue_after, remaining)
    return False


def _schedule_ttl(plan: Plan, ttl: int | None, now: datetime.datetime) -> None:
    if ttl is None:
        return
    finished = parse_timestamp(plan.status.get("completionTime")) or now
    remaining = (finished - now).total_seconds() + ttl
    if remaining <= 0:
        plan.delete_job = True
    else:
        plan.requeue_after = _sooner(plan.requeue_after, remaining)


def _sooner(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)
