"""A job whose `spec.managedBy` names another controller: this operator makes no pod for it.

`kueue.x-k8s.io/multikueue` is the one such value it still has a part in. On the manager cluster
it is Kueue's job integration for the job, as Kueue's own integrations are for theirs (facts of
Kueue v0.19.2, pkg/controller/admissionchecks/multikueue):
- the job's Workload is made here, queued, suspended and resumed as for any queued job; MultiKueue
  copies it to the worker clusters, and where one admits it creates the job there (without
  managedBy, annotated with that Workload's name: queue_steps adopts it there);
- from then on the status is the worker's: Kueue copies it whole onto this job (the generic
  adapter's syncStatus), and it finishes this Workload when the worker's finishes. So the
  operator writes the status only while the job waits here (queued, evicted when its worker is
  lost, suspended), and never the counts a pass derives from pods it has none of; the Workload's
  PodsReady follows the copied counts;
- deleting the job deletes its Workload (owner reference), and MultiKueue then deletes the copy.

Any other value: the job is that controller's, and not a field of it is written here.
"""

from __future__ import annotations

from disttrain.api.constants import MANAGED_BY_DISTTRAIN, MANAGED_BY_MULTIKUEUE
from disttrain.api.spec import JobSpec
from disttrain.api.status import FINISHED, Phase, ready_column, replica_statuses
from disttrain.decide import final_steps, queue_steps
from disttrain.decide.passes import Pass
from disttrain.decide.plan import Plan
from disttrain.decide.queueing import QUEUE_LABEL, ObservedWorkload
from disttrain.decide.reasons import Reason


def managed_elsewhere(spec: JobSpec) -> bool:
    return spec.managed_by not in (None, MANAGED_BY_DISTTRAIN)


def follow(p: Pass) -> Plan:
    # What the worker's operator wrote, as Kueue copied it: none of the counts Pass derives here.
    p.plan.status = dict(p.job.status)
    if p.spec.managed_by != MANAGED_BY_MULTIKUEUE:
        return p.plan  # another controller's: not a field of it is ours, its TTL included (issue 31)
    if p.phase not in FINISHED:
        take_part(p)
    final_steps.delete_after_ttl(p)  # on the copied verdict: MultiKueue then deletes the worker's copy
    return p.plan


def take_part(p: Pass) -> None:
    if p.job.queue is None:
        p.finish(Phase.FAILED, Reason.INVALID_SPEC, (
            f"spec.managedBy: {MANAGED_BY_MULTIKUEUE} dispatches a queued job's Workload, and this job has no "
            f"{QUEUE_LABEL} label: it would never run anywhere"))
        return
    if p.spec.run_policy.suspend:
        queue_steps.pause(p, active=False)  # MultiKueue deletes the worker's copy once it is evicted
        if p.phase is not Phase.SUSPENDED:
            p.move(Phase.SUSPENDED, Reason.JOB_SUSPENDED,
                   "runPolicy.suspend is true: its Workload is deactivated and the worker cluster's copy deleted")
        return
    if p.phase is Phase.SUSPENDED:
        p.move(Phase.QUEUED, Reason.JOB_RESUMED, "runPolicy.suspend is false again: queued to be dispatched afresh")
    queue_steps.pause(p, active=True)
    if p.workload is not None and p.workload.true("Finished"):
        finished_without_a_verdict(p, p.workload)
        return
    if queue_steps.hold_in_queue(p):
        if p.phase is Phase.QUEUED and p.job.status.get("phase") != Phase.QUEUED:
            # Evicted (its worker lost): the copied counts were that worker's pods, gone with it.
            emptied = replica_statuses(p.spec, [])
            p.plan.status.update(replicaStatuses=emptied, ready=ready_column(p.spec, emptied))
    elif p.workload is not None:
        # Admitted (said once, with the worker cluster); the worker's status follows. PodsReady is
        # read off that copy, as Kueue's own integrations read it off theirs on a manager: without
        # it, a manager running waitForPodsReady evicts every dispatched job at its timeout.
        counts = (p.job.status.get("replicaStatuses") or {}).values()
        ready = sum(int(c.get("ready") or 0) + int(c.get("succeeded") or 0) for c in counts)
        queue_steps.report_pods_ready(p, p.workload, ready >= admitted_pods(p))


def admitted_pods(p: Pass) -> int:
    """The pods the worker runs: what Kueue admitted of each podSet (a partially admitted elastic
    job runs fewer workers than its spec asks; compared with the spec, PodsReady never went True
    and waitForPodsReady evicted it in a loop: issue 31)."""
    assert p.workload is not None
    return sum(held if (held := p.workload.held(str(rtype))) is not None else replica.replicas
               for rtype, replica in p.spec.replicas.items())


def finished_without_a_verdict(p: Pass, workload: ObservedWorkload) -> None:
    """The manager's Workload finished while the copied status has no verdict. Kueue v0.19.2
    finishes it when the worker's Workload finishes, having copied the worker's status first
    (multikueue/workload.go; a remote OutOfSync it resets to Retry and dispatches afresh, but not
    for an elastic Workload), and nothing makes a finished Workload run again: the job would wait
    as Queued for ever. It fails, in Kueue's words."""
    said = workload.conditions.get("Finished") or {}
    p.finish(Phase.FAILED, Reason.WORKLOAD_FINISHED, (
        f"Kueue finished Workload {workload.name} ({said.get('reason') or 'Finished'}: "
        f"{said.get('message') or 'no message'}) before the job had a verdict from its worker cluster: it is not "
        f"dispatched again"))
