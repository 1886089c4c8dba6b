"""A pod name is used again only once DNS has forgotten its old pod (decide/name_reuse_steps.py): a
whole-job restart's, a resume's and an earlier same-named job's new pods are made
`name_reuse_seconds` after the last old pod is gone, and the wait lives in status.previousPods."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import parse_spec
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan
from disttrain.decide.reconcile import reconcile
from manifests import replica, tf_job

NOW = datetime.datetime(2026, 11, 26, 12, 0, 0, 250000, tzinfo=datetime.UTC)
REUSE = 6.0
MWMS = tf_job(worker=replica(2, "ExitCode"))


def pod(index: int, phase: str = "Running", *, exit_code: int | None = None, terminating: bool = False,
        owner: str = "uid-1") -> ObservedPod:
    return ObservedPod(name=f"mnist-worker-{index}", uid=f"{owner}-worker-{index}", owner_uid=owner,
                       replica_type="worker", index=index, phase=phase, ready=phase == "Running",
                       terminating=terminating, exit_code=exit_code, reason=None, container_restarts=0)


def step(pods: list[ObservedPod], status: dict[str, Any], seconds: float = 0.0, job: dict[str, Any] = MWMS,
         reuse: float = REUSE) -> Plan:
    state = JobState(JobRef("mnist", "ml", "uid-1"), 1, parse_spec(job["spec"]), status, name_reuse_seconds=reuse)
    return reconcile(state, pods, NOW + datetime.timedelta(seconds=seconds))


def made(plan: Plan) -> list[str]:
    return [o["metadata"]["name"] for o in plan.create if o["kind"] == "Pod"]


def test_a_whole_job_restart_makes_its_pods_the_reuse_time_after_the_old_ones_are_gone() -> None:
    restart = step([pod(0), pod(1, "Failed", exit_code=137)], {"phase": "Running"})
    assert restart.status["phase"] == "Restarting" and restart.status["previousPods"] == {}
    going = step([pod(0, terminating=True), pod(1, terminating=True)], restart.status, 20)
    assert not made(going) and going.status["previousPods"] == {}
    gone = step([], going.status, 31)
    assert not made(gone), "the old pods' addresses may still be cached"
    assert gone.status["previousPods"] == {"goneAt": "2026-11-26T12:00:31.250000Z"}
    assert gone.requeue_after == REUSE
    early = step([], gone.status, 36.9)
    assert not made(early) and early.requeue_after is not None and abs(early.requeue_after - 0.1) < 1e-6
    assert early.status == gone.status, "waiting writes nothing"
    due = step([], gone.status, 37.25)
    assert made(due) == ["mnist-worker-0", "mnist-worker-1"]
    assert "previousPods" not in due.status


def test_the_wait_survives_an_operator_restart_and_counts_from_when_the_pods_went() -> None:
    """The status alone carries it: a new operator's first pass, 4 s after the goneAt it reads,
    waits the 2 s left, not 6 s from its own start."""
    status = {"phase": "Restarting", "previousPods": {"goneAt": "2026-11-26T12:00:00.250000Z"}}
    plan = step([], status, 4)
    assert not made(plan) and plan.requeue_after is not None and abs(plan.requeue_after - 2) < 1e-6


def test_a_job_found_with_its_old_pods_gone_and_nothing_recorded_starts_at_once() -> None:
    """An operator upgraded in the middle of a restart (no previousPods yet): as before."""
    plan = step([], {"phase": "Restarting"})
    assert made(plan) == ["mnist-worker-0", "mnist-worker-1"] and "previousPods" not in plan.status


def test_a_resume_long_after_the_suspend_waits_for_nothing() -> None:
    job = tf_job(worker=replica(2), run_policy={"suspend": True})
    stopped = step([pod(0), pod(1)], {"phase": "Running"}, job=job)
    assert stopped.status["phase"] == "Suspended" and stopped.status["previousPods"] == {}
    emptied = step([], stopped.status, 30, job=job)
    assert emptied.status["previousPods"] == {"goneAt": "2026-11-26T12:00:30.250000Z"}
    resumed = step([], emptied.status, 600, job=tf_job(worker=replica(2)))
    assert made(resumed) == ["mnist-worker-0", "mnist-worker-1"] and "previousPods" not in resumed.status


def test_a_resume_right_after_the_pods_went_waits_the_rest() -> None:
    status = {"phase": "Suspended", "previousPods": {"goneAt": "2026-11-26T12:00:00.250000Z"}}
    resumed = step([], status, 1)
    assert resumed.status["phase"] == "Pending" and not made(resumed)
    assert resumed.requeue_after is not None and abs(resumed.requeue_after - 5) < 1e-6


def test_a_job_applied_again_under_a_deleted_ones_name_waits_for_its_pods_then_their_dns() -> None:
    earlier = [pod(0, terminating=True, owner="uid-0"), pod(1, terminating=True, owner="uid-0")]
    blocked = step(earlier, {})
    assert not made(blocked) and blocked.status["reason"] == "WaitingForPreviousJob"
    assert blocked.status["previousPods"] == {}
    freed = step([], blocked.status, 2)
    assert not made(freed) and freed.status["previousPods"]["goneAt"] == "2026-11-26T12:00:02.250000Z"
    assert made(step([], freed.status, 8)) == ["mnist-worker-0", "mnist-worker-1"]


def test_a_new_job_starts_at_once() -> None:
    plan = step([], {})
    assert made(plan) == ["mnist-worker-0", "mnist-worker-1"] and "previousPods" not in plan.status


def test_no_reuse_time_makes_the_pods_in_the_pass_that_finds_the_old_ones_gone() -> None:
    plan = step([], {"phase": "Restarting", "previousPods": {}}, reuse=0)
    assert made(plan) == ["mnist-worker-0", "mnist-worker-1"] and "previousPods" not in plan.status


def test_a_job_that_fails_while_it_waits_keeps_no_previous_pods() -> None:
    job = tf_job(worker=replica(2), run_policy={"activeDeadlineSeconds": 10})
    status = {"phase": "Restarting", "startTime": "2026-11-26T11:00:00Z",
              "previousPods": {"goneAt": "2026-11-26T12:00:00.000000Z"}}
    plan = step([], status, job=job)
    assert plan.status["phase"] == "Failed" and "previousPods" not in plan.status


def test_a_pod_restarted_alone_waits_for_nothing() -> None:
    """restartScope Pod (ps): the others run on and reach their peer again by its old name (gRPC
    re-resolves a name on every failed connection); only a whole start resolves once."""
    ps = tf_job(chief=replica(1), ps=replica(1), worker=replica(2, "ExitCode"))
    others = [dataclasses.replace(pod(0), name=f"mnist-{t}-0", uid=f"uid-1-{t}-0", replica_type=t)
              for t in ("chief", "ps")] + [pod(0)]
    going = step([*others, pod(1, terminating=True)], {"phase": "Running"}, job=ps)
    assert "previousPods" not in going.status
    assert made(step(others, going.status, 1, job=ps)) == ["mnist-worker-1"]


def test_a_suspend_while_an_earlier_jobs_pods_hold_the_names_waits_for_them() -> None:
    """Suspended before the earlier job's pods went, and resumed once they had: the wait counts
    from when they went, not from the suspend."""
    earlier = [pod(0, terminating=True, owner="uid-0"), pod(1, terminating=True, owner="uid-0")]
    blocked = step(earlier, {})
    job = tf_job(worker=replica(2), run_policy={"suspend": True})
    suspended = step(earlier, blocked.status, 1, job=job)
    assert suspended.status["phase"] == "Suspended" and suspended.status["previousPods"] == {}
    emptied = step([], suspended.status, 30, job=job)
    assert emptied.status["previousPods"] == {"goneAt": "2026-11-26T12:00:30.250000Z"}
    resumed = step([], emptied.status, 31)
    assert not made(resumed) and resumed.requeue_after is not None and abs(resumed.requeue_after - 5) < 1e-6


def test_a_pod_scoped_job_resumed_at_once_waits_for_all_its_old_pods_then_dns() -> None:
    """restartScope Pod (ps) replaces one pod by itself, but a resume starts every pod afresh."""
    ps = tf_job(chief=replica(1), ps=replica(1), worker=replica(2, "ExitCode"))
    suspended = tf_job(chief=replica(1), ps=replica(1), worker=replica(2, "ExitCode"), run_policy={"suspend": True})
    live = [dataclasses.replace(pod(0), name=f"mnist-{t}-0", uid=f"uid-1-{t}-0", replica_type=t)
            for t in ("chief", "ps")] + [pod(0), pod(1)]
    stopped = step(live, {"phase": "Running"}, job=suspended)
    going = [dataclasses.replace(p, terminating=True) for p in live]
    resumed = step(going, stopped.status, 1, job=ps)
    assert resumed.status["phase"] == "Pending" and resumed.status["previousPods"] == {} and not made(resumed)
    chief_left = step(going[:1], resumed.status, 5, job=ps)
    assert not made(chief_left) and chief_left.status["previousPods"] == {}
    gone = step([], chief_left.status, 7, job=ps)
    assert not made(gone) and gone.status["previousPods"] == {"goneAt": "2026-11-26T12:00:07.250000Z"}
    assert sorted(made(step([], gone.status, 13, job=ps))) == ["mnist-chief-0", "mnist-ps-0", "mnist-worker-0",
                                                               "mnist-worker-1"]


def test_a_gone_at_ahead_of_this_operators_clock_waits_no_longer_than_the_reuse_time() -> None:
    status = {"phase": "Restarting", "previousPods": {"goneAt": "2026-11-26T13:00:00.000000Z"}}
    plan = step([], status)
    assert not made(plan) and plan.requeue_after == REUSE
    assert plan.status["previousPods"] == {"goneAt": "2026-11-26T12:00:00.250000Z"}


def test_a_left_over_wait_with_nothing_to_make_is_dropped() -> None:
    """An operator rolled back copies previousPods forward; back again, a running job with all its
    pods drops it rather than holding a later create."""
    plan = step([pod(0), pod(1)], {"phase": "Running", "previousPods": {}})
    assert "previousPods" not in plan.status and plan.requeue_after is None


def test_passes_that_hold_or_wait_write_nothing_new() -> None:
    restart = step([pod(0), pod(1, "Failed", exit_code=137)], {"phase": "Running"})
    going = [pod(0, terminating=True), pod(1, terminating=True)]
    first = step(going, restart.status, 1)
    assert step(going[:1], first.status, 2).status == first.status
    gone = step([], first.status, 3)
    assert step([], gone.status, 4).status == gone.status


def test_a_message_about_the_earlier_job_says_what_is_waited_for_once_its_pods_are_gone() -> None:
    earlier = [pod(0, terminating=True, owner="uid-0")]
    blocked = step(earlier, {})
    freed = step([], blocked.status, 2)
    assert freed.status["reason"] == "WaitingForPreviousJob"
    assert freed.status["message"].startswith("the earlier job's pods are gone; this job's are made at 12:00:08 UTC")


def test_a_kueue_eviction_readmitted_at_once_waits_for_dns() -> None:
    from test_queueing import ADMITTED, REF, SPEC, workload
    from test_queueing import pod as queued_pod

    from disttrain.decide.queueing import QueueState

    def queued(status: dict[str, Any], wl: Any, pods: list[ObservedPod], seconds: float) -> Plan:
        state = JobState(REF, 1, SPEC, status, queue=QueueState("team-gpu", wl, {}), name_reuse_seconds=REUSE)
        return reconcile(state, pods, NOW + datetime.timedelta(seconds=seconds))
    evicted = workload(*ADMITTED, ("Evicted", True, "Preempted", "Preempted to accommodate a workload"))
    running = [queued_pod("chief", 0), queued_pod("worker", 0), queued_pod("worker", 1)]
    stopped = queued({"phase": "Running"}, evicted, running, 0)
    assert stopped.status["phase"] == "Queued" and stopped.status["previousPods"] == {}
    released = queued(stopped.status, evicted, [], 2)
    assert [op.verb for op in released.workload if op.verb == "release"]
    assert released.status["previousPods"] == {"goneAt": "2026-11-26T12:00:02.250000Z"}
    readmitted = queued(released.status, workload(*ADMITTED), [], 3)
    assert readmitted.status["phase"] == "Pending" and not made(readmitted)
    assert made(queued(readmitted.status, workload(*ADMITTED), [], 8.25)) == [
        "mnist-chief-0", "mnist-worker-0", "mnist-worker-1"]


def test_times_in_a_status_someone_else_wrote_never_fail_the_reconcile() -> None:
    """Whoever may patch disttrainjobs/status can write any string where a time goes (the CRD's
    date-time format admits a lowercase t and z, which Python's parser refused): a garbage goneAt,
    startTime or checkpoint deadline is read as unset, never an exception on every pass."""
    for junk in ("not a time", "2026-11-26t12:00:00z", "", "9999-99-99T99:99:99Z"):
        status = {"phase": "Restarting", "startTime": junk, "previousPods": {"goneAt": junk},
                  "checkpoint": {"request": "c1", "deadline": junk, "requestedAt": junk}}
        plan = step([], status)
        assert plan.status["phase"] in ("Restarting", "Pending"), junk
    lower = step([], {"phase": "Restarting", "previousPods": {"goneAt": "2026-11-26t12:00:00.250000z"}}, 1)
    assert not made(lower) and lower.requeue_after is not None and abs(lower.requeue_after - 5) < 1e-6
