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
    status = {"phase": "Restarting", "startTime": "2026-11-26T11:00:00Z", "previousPods": {"goneAt": "x"}}
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
