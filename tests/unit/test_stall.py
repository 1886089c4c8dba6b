"""A stalled training (issue 46, decide/policies/stall.py and decide/stall_steps.py): a Running job
whose reported step stands still past its timeout is Stalled, says so once, and under
runPolicy.onStall: Restart restarts whole through the failure's restart path."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import parse_spec
from disttrain.api.progress import Report
from disttrain.api.spec import OnStall
from disttrain.builders.progress import ProgressEndpoint
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan
from disttrain.decide.policies import stall
from disttrain.decide.progress import ProgressState, Reported
from disttrain.decide.reconcile import reconcile
from disttrain.runtime.job_gauges import sample
from manifests import replica, tf_job

REF = JobRef("mnist", "ml", "uid-1")
T0 = datetime.datetime(2026, 11, 28, 12, 0, 0, tzinfo=datetime.UTC)  # every pod running from here
ENDPOINT = ProgressEndpoint("https://disttrain-progress.ops.svc:8443", "ca")


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(**run_policy: Any) -> dict[str, Any]:
    return tf_job("mnist", run_policy or None, chief=replica(1, cpu="1"), worker=replica(2, gpus=4))


def pod(rtype: str, index: int) -> ObservedPod:
    return ObservedPod(name=f"mnist-{rtype}-{index}", uid=f"u-{rtype}-{index}", owner_uid="uid-1",
                       replica_type=rtype, index=index, phase="Running", ready=True, terminating=False,
                       exit_code=None, reason=None, container_restarts=0, scheduled=True, hears_checkpoint=True)


PODS = [pod("chief", 0), pod("worker", 0), pod("worker", 1)]


def running(progress: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """A job whose pods all ran at T0, and what its training reported by the last status write."""
    status = {"phase": "Running", "startTime": stamp(-60), "reason": "AllPodsRunning", "message": "all 3 pods running",
              "conditions": [{"type": "Created", "status": "True", "lastTransitionTime": stamp(-5)},
                             {"type": "Running", "status": "True", "reason": "AllPodsRunning",
                              "lastTransitionTime": stamp(0)}],
              **more}
    if progress is not None:
        status["progress"] = progress
    return status


def reported(step: int, advanced: float, last: float | None = None, longest: float | None = None) -> dict[str, Any]:
    """status.progress: at `step` since `advanced` seconds, last reported at `last`; `longest`: the
    longest the job's position stood before (for a derived timeout)."""
    record: dict[str, Any] = {"at": stamp(advanced), "step": step}
    if longest is not None:
        record["longestStillSeconds"] = longest
    return {"step": step, "totalSteps": 10_000, "reporter": "mnist-chief-0",
            "reportedAt": stamp(advanced if last is None else last), "advanced": record}


def book(step: int, seconds: float, gap: float | None = None) -> ProgressState:
    return ProgressState(training=Reported(Report(step=step, total_steps=10_000), "mnist-chief-0", at(seconds)),
                         gap_seconds=gap)


def step(spec: dict[str, Any], status: dict[str, Any], now: float, progress: ProgressState | None = None,
         pods: list[ObservedPod] = PODS) -> Plan:
    state = JobState(REF, 1, parse_spec(spec["spec"]), status, progress=progress, report_to=ENDPOINT)
    return reconcile(state, pods, at(now))


def condition(plan: Plan) -> dict[str, Any] | None:
    return next((c for c in plan.status.get("conditions") or [] if c["type"] == "Stalled"), None)


# -- the rule ------------------------------------------------------------------------------------


def record_of(progress: dict[str, Any]) -> dict[str, Any]:
    return dict(progress["advanced"])


def test_the_timeout_is_the_jobs_or_three_of_its_longest_stand_and_never_under_ten_minutes() -> None:
    set_one = parse_spec(job(stallTimeoutSeconds=45)["spec"]).run_policy
    unset = parse_spec(job()["spec"]).run_policy
    assert (unset.stall_timeout_seconds, unset.on_stall) == (None, OnStall.REPORT)
    assert stall.timeout_seconds(set_one, None) == 45 and stall.timeout_seconds(set_one, 900) == 45
    assert stall.timeout_seconds(unset, None) is None  # no move seen yet: its pace unknown, not judged
    assert stall.timeout_seconds(unset, 5) == 600  # a report every 5 s: the floor
    assert stall.timeout_seconds(unset, 300) == 900  # an epoch-end pause of 5 minutes: three of it
    assert stall.timeout_seconds(unset, 1800) == 5400  # epochs only, 30 minutes each


def test_a_job_that_never_reported_a_step_is_never_stalled() -> None:
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    assert stall.stalled(run, None, None, T0, at(10_000)) == (None, None)
    metrics_only = {"metrics": {"loss": 0.3}, "reportedAt": stamp(5)}
    assert stall.stalled(run, metrics_only, None, T0, at(10_000)) == (None, None)


def test_a_step_still_past_the_timeout_is_stalled_and_the_message_names_it() -> None:
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    progress = reported(1500, advanced=100, last=130)
    assert stall.stalled(run, progress, record_of(progress), T0, at(150)) == (None, 10.0)  # looked at again then
    why, recheck = stall.stalled(run, progress, record_of(progress), T0, at(161))
    assert recheck is None and why == (
        f"the training has reported step 1500 since {stamp(100)} (mnist-chief-0) and nothing new since: "
        "longer than runPolicy.stallTimeoutSeconds 60s")


def test_an_attempts_first_step_and_the_time_past_the_last_get_three_timeouts() -> None:
    """Graph building, compilation and a restore come before the first step; an export, an upload
    and the process group's teardown after the last."""
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    before_the_restart = reported(1500, advanced=-900)
    assert stall.stalled(run, before_the_restart, record_of(before_the_restart), T0, at(179)) == (None, 1.0)
    why, _ = stall.stalled(run, before_the_restart, record_of(before_the_restart), T0, at(180))
    assert why is not None and "no new step since its pods all ran" in why and "3 x runPolicy" in why
    done = reported(10_000, advanced=100)
    assert stall.stalled(run, done, record_of(done), T0, at(279)) == (None, 1.0)
    why, _ = stall.stalled(run, done, record_of(done), T0, at(280))
    assert why is not None and "reported its last step, step 10000" in why


def advance(record: dict[str, Any] | None, before: dict[str, Any], now: dict[str, Any],
            running_since: float = 0, timeout: int | None = None) -> dict[str, Any] | None:
    run = parse_spec(job(**({"stallTimeoutSeconds": timeout} if timeout else {}))["spec"]).run_policy
    return stall.advance(record, before, now, at(running_since), run)


def test_the_record_moves_with_the_position_and_keeps_the_longest_stand_of_an_attempt() -> None:
    shown = {"step": 1500, "epoch": 3, "reportedAt": stamp(40)}
    record = {"at": stamp(0), "step": 1500, "epoch": 3, "longestStillSeconds": 20.0}
    assert advance(record, shown, {**shown, "reportedAt": stamp(50)}) == record  # the same step: kept
    moved = advance(record, shown, {"step": 1510, "epoch": 3, "reportedAt": stamp(50)})
    assert moved == {"at": stamp(50), "step": 1510, "epoch": 3, "longestStillSeconds": 50.0}
    back = advance(record, shown, {"step": 1000, "epoch": 2, "reportedAt": stamp(50)})  # resumed: a change
    assert back is not None and back["at"] == stamp(50)
    # Metrics alone: the status keeps the step it had (progress_status merges), so nothing moved.
    assert advance(record, shown, {**shown, "metrics": {"loss": 0.1}, "reportedAt": stamp(60)}) == record


def test_a_stand_across_a_restart_or_past_the_timeout_is_no_pace() -> None:
    shown = {"step": 1500, "reportedAt": stamp(40)}
    record = {"at": stamp(0), "step": 1500, "longestStillSeconds": 20.0}
    across = advance(record, shown, {"step": 1000, "reportedAt": stamp(500)}, running_since=400)
    assert across is not None and across["longestStillSeconds"] == 20.0  # it began before this attempt ran
    recovered = advance(record, shown, {"step": 1510, "reportedAt": stamp(5000)})  # a stall of 5000 s
    assert recovered is not None and recovered["longestStillSeconds"] == 20.0  # past the 600 s then in force


def test_a_record_of_another_step_is_dropped_and_the_latest_report_dates_the_step() -> None:
    """An operator rolled back kept the record and moved the step; forward again, it is not trusted."""
    shown = {"step": 9000, "reportedAt": stamp(4000)}
    left_over = {"at": stamp(100), "step": 1500, "longestStillSeconds": 20.0}
    assert advance(left_over, shown, shown) == {"at": stamp(4000), "step": 9000}
    assert advance(None, shown, shown) == {"at": stamp(4000), "step": 9000}  # a status from before the record


def test_a_day_of_healthy_steps_keeps_the_timeout_at_its_floor_and_a_hang_is_found() -> None:
    """The history is thinned as it grows (its old points hours apart): the record is not read from it."""
    run = parse_spec(job()["spec"]).run_policy
    before: dict[str, Any] = {}
    record = None
    for i in range(24 * 240):  # a new step every 15 s for a day
        now = {"step": i, "reportedAt": stamp(15 * i)}
        record = stall.advance(record, before, now, T0, run)
        before = now
    assert record is not None and record["longestStillSeconds"] == 15.0
    progress = {**before, "reporter": "mnist-chief-0"}
    last = 15 * (24 * 240 - 1)
    assert stall.stalled(run, progress, record, T0, at(last + 599))[0] is None
    assert stall.stalled(run, progress, record, T0, at(last + 600))[0] is not None


# -- the steps -----------------------------------------------------------------------------------


def test_report_sets_the_condition_says_so_once_and_leaves_the_pods() -> None:
    spec = job(stallTimeoutSeconds=60)
    status = running(reported(1500, advanced=100))
    plan = step(spec, status, 170, book(1500, 100))
    found = condition(plan)
    assert found is not None and found["status"] == "True" and found["reason"] == "Stalled"
    assert "step 1500" in found["message"] and "onStall is Report" in found["message"]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "Stalled")]
    assert not plan.delete and plan.status["phase"] == "Running"
    again = step(spec, plan.status, 200, book(1500, 100))
    assert condition(again) == found and not again.events  # one event per stall, no status change between


def test_a_new_step_ends_the_stall() -> None:
    spec = job(stallTimeoutSeconds=60)
    stalled_plan = step(spec, running(reported(1500, advanced=100)), 170, book(1500, 100))
    moved = step(spec, stalled_plan.status, 190, book(1510, 185))
    found = condition(moved)
    assert found is not None and (found["status"], found["reason"]) == ("False", "TrainingAdvanced")
    assert found["message"] == f"the training reported step 1510 at {stamp(185)}"


def test_restart_restarts_the_whole_job_counted_and_stays_stalled_until_a_new_step() -> None:
    spec = job(stallTimeoutSeconds=60, onStall="Restart", backoffLimit=2)
    plan = step(spec, running(reported(1500, advanced=100)), 170, book(1500, 100))
    assert plan.status["phase"] == "Restarting" and plan.status["reason"] == "TrainingStalled"
    assert sorted(p.name for p in plan.delete) == sorted(p.name for p in PODS)
    assert plan.status["operatorRestarts"] == 1
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "TrainingStalled")]
    assert "restarting the whole job (restart 1 of 2)" in plan.events[0].message
    found = condition(plan)
    assert found is not None and found["status"] == "True" and "onStall is Restart" in found["message"]
    # Restarting: not judged, still Stalled (nothing has moved yet).
    later = step(spec, plan.status, 175, book(1500, 100), pods=[])
    assert condition(later) == found


def test_restart_past_the_backoff_limit_fails_the_job() -> None:
    spec = job(stallTimeoutSeconds=60, onStall="Restart", backoffLimit=1)
    plan = step(spec, running(reported(1500, advanced=100), operatorRestarts=1, restarts=1), 170, book(1500, 100))
    assert plan.status["phase"] == "Failed" and plan.status["reason"] == "BackoffLimitExceeded"
    message = plan.status["message"]
    assert "step 1500" in message and "all 1 restarts of runPolicy.backoffLimit" in message


@pytest.mark.parametrize("how", ["checkpoint", "suspended", "queued-phase"])
def test_a_job_stopping_or_not_running_is_not_judged(how: str) -> None:
    spec = job(stallTimeoutSeconds=60, onStall="Restart", suspend=how == "suspended")
    status = running(reported(1500, advanced=100))
    if how == "checkpoint":
        status["checkpoint"] = {"request": "r1", "reason": "Evicted", "requestedAt": stamp(160),
                                "deadline": stamp(190)}
    if how == "queued-phase":
        status["phase"] = "Pending"
    plan = step(spec, status, 10_000, book(1500, 100))
    assert condition(plan) is None and plan.status.get("reason") != "TrainingStalled"


def test_the_reconcile_looks_again_when_the_job_would_stall() -> None:
    plan = step(job(stallTimeoutSeconds=60), running(reported(1500, advanced=100)), 130, book(1500, 100))
    assert condition(plan) is None and plan.requeue_after is not None and plan.requeue_after <= 30


def test_a_suspend_ends_the_condition() -> None:
    spec = job(stallTimeoutSeconds=60)
    stalled_plan = step(spec, running(reported(1500, advanced=100)), 170, book(1500, 100))
    suspended = step(job(stallTimeoutSeconds=60, suspend=True, checkpointGraceSeconds=0), stalled_plan.status, 180,
                     book(1500, 100))
    assert suspended.status["phase"] == "Suspended"
    found = condition(suspended)
    assert found is not None and found["status"] == "False"


def test_the_gauge_has_a_series_only_while_stalled() -> None:
    spec = job(stallTimeoutSeconds=60)
    plan = step(spec, running(reported(1500, advanced=100)), 170, book(1500, 100))
    body = {"metadata": {"name": "mnist", "namespace": "ml", "uid": "uid-1"}, "spec": spec["spec"]}
    assert sample({**body, "status": plan.status}).stalled
    assert not sample({**body, "status": running()}).stalled


def test_a_stall_left_running_is_no_restart_in_the_metrics() -> None:
    from disttrain.decide.reasons import RESTARTS, Reason

    assert Reason.STALLED not in RESTARTS and Reason.TRAINING_STALLED in RESTARTS


def test_a_stall_found_keeps_its_words_until_it_ends() -> None:
    """A derived timeout or the reporter's name may move while it stands: each would be a status write."""
    status = running(reported(1500, advanced=100))
    status["conditions"].append({"type": "Stalled", "status": "True", "reason": "Stalled", "message": "as found",
                                 "lastTransitionTime": stamp(161)})
    later = step(job(stallTimeoutSeconds=60), status, 300, book(1500, 100))
    assert condition(later) == status["conditions"][-1] and not later.events
