"""The reconcile steps of an elastic MPI job (spec.mpi.elastic; the policy is
decide/policies/elastic.py): workers scaled away deleted after their delay, a whole-job restart
after too long short of minReplicas, and status.elastic, which keeps both waits across operator
restarts."""

from __future__ import annotations

from typing import Any

from disttrain.api.status import FINISHED, Phase
from disttrain.decide.passes import Pass
from disttrain.decide.plan import Event
from disttrain.decide.policies import elastic, failure
from disttrain.decide.reasons import Reason


def below_min_restart(p: Pass) -> failure.Restart | None:
    """The whole-job restart of a job short of minReplicas Ready workers past its grace, if due."""
    if elastic.settings(p.spec) is None:
        return None
    wait = short_of_min(p)
    if wait.since is None or wait.left > 0:
        if wait.since is not None:
            p.plan.requeue_within(wait.left)
        return None
    what = elastic.below_min_message(p.spec, p.live, p.wanted_workers)
    return failure.decide(p.spec, p.restarts_so_far, p.kubelet_restarts, what, 1, True, Reason.BELOW_MIN_REPLICAS)


def status_of(p: Pass) -> dict[str, Any]:
    return dict(p.plan.status.get("elastic") or {})


def short_of_min(p: Pass) -> elastic.Timer:
    return elastic.short_of_min(p.spec, p.live, p.wanted_workers, status_of(p).get("belowMinSince"),
                                p.phase is Phase.RUNNING, p.now)


def scale_down(p: Pass) -> None:
    """Workers above the wanted count left discovery already; they go once the delay is over."""
    if elastic.settings(p.spec) is None:
        return
    before = status_of(p)
    leaving = elastic.scale_down(p.spec, p.live, p.wanted_workers, before.get("leaving") or {}, p.now,
                                 before.get("scaleDownSince"))
    if leaving.next_due is not None:
        p.plan.requeue_within(leaving.next_due)
    if leaving.going:
        p.plan.delete = [*p.plan.delete, *leaving.going]
        names = ", ".join(pod.name for pod in leaving.going)
        said = {str(since) for name, since in (before.get("leaving") or {}).items()
                if name in {pod.name for pod in leaving.going}} or {before.get("scaleDownSince") or "it ended"}
        p.plan.events.append(Event("Normal", Reason.WORKERS_SCALED, (
            f"deleting {names}: above spec.mpi.worker.replicas {p.wanted_workers}, out of discover_hosts.sh "
            f"since {', '.join(sorted(said))}")))


def report(p: Pass) -> None:
    """status.elastic: the wanted and discovered workers, and the waits under way (kept in the
    status, so an operator restarted mid-wait resumes it instead of starting it over)."""
    if elastic.settings(p.spec) is None:
        return
    before = status_of(p)
    hosts = elastic.discovered(p.live, p.wanted_workers)
    out: dict[str, Any] = {"wantedWorkers": p.wanted_workers, "workers": len(hosts),
                           "hosts": [pod.name for pod in hosts], "selector": elastic.selector(p.job.ref.name)}
    deleted = {pod.uid for pod in p.plan.delete}
    if Phase(p.plan.status.get("phase") or Phase.PENDING) not in FINISHED:
        down = elastic.scale_down(p.spec, [pod for pod in p.live if pod.uid not in deleted], p.wanted_workers,
                                  before.get("leaving") or {}, p.now, before.get("scaleDownSince"))
        short = short_of_min(p) if p.phase is Phase.RUNNING else None
        if down.since:
            out["leaving"] = down.since
            out["scaleDownSince"] = min(down.since.values())  # the first due: what one timestamp can say
        if short is not None and short.since is not None:
            out["belowMinSince"] = short.since
    if before.get("wantedWorkers") not in (None, p.wanted_workers):
        p.plan.events.append(Event("Normal", Reason.WORKERS_SCALED, (
            f"workers wanted: {before['wantedWorkers']} -> {p.wanted_workers} (spec.mpi.worker.replicas "
            f"{p.spec.num_workers}, spec.mpi.elastic {elastic.bounds(p.spec)})")))
    p.plan.status["elastic"] = out
