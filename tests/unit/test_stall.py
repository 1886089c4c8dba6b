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
from disttrain.decide.progress import ProgressState, Reported, advanced_at
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


def reported(step: int, advanced: float, last: float | None = None) -> dict[str, Any]:
    """status.progress: at `step` since `advanced` seconds, last reported at `last`."""
    return {"step": step, "totalSteps": 10_000, "reporter": "mnist-chief-0",
            "reportedAt": stamp(advanced if last is None else last), "advancedAt": stamp(advanced)}


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


def points(*runs: tuple[int | None, int | None, float, float]) -> list[dict[str, Any]]:
    """A history: for each (epoch, step, from, to), a point every 15 s from `from` to `to` seconds."""
    out = []
    for epoch, step_, start, end in runs:
        t = start
        while t <= end:
            out.append({"at": stamp(t), **({"epoch": epoch} if epoch is not None else {}),
                        **({"step": step_} if step_ is not None else {})})
            t += 15
    return out


def test_the_timeout_is_the_jobs_or_three_of_its_longest_wait_between_moves_and_never_under_ten_minutes() -> None:
    set_one = parse_spec(job(stallTimeoutSeconds=45)["spec"]).run_policy
    unset = parse_spec(job()["spec"]).run_policy
    assert (unset.stall_timeout_seconds, unset.on_stall) == (None, OnStall.REPORT)
    steps = [{"at": stamp(15 * i), "step": 10 * i} for i in range(30)]  # every point a new step
    assert stall.timeout_seconds(set_one, steps) == 45
    assert stall.timeout_seconds(unset, steps) == 600
    # Not known before the history shows two changes: not judged (an operator's floor would be a guess).
    assert stall.timeout_seconds(unset, []) is None and stall.timeout_seconds(unset, steps[:1]) is None
    # An epoch-end pause of 5 minutes seen before: three of it.
    paused = points((1, 100, 0, 0), (1, 200, 15, 315), (2, 300, 330, 330))
    assert stall.timeout_seconds(unset, paused) == 3 * 315
    # Reporting epochs only, each 30 minutes: three epochs (the one standing now left out).
    epochs = points((1, None, 0, 1800), (2, None, 1815, 3615), (3, None, 3630, 3700))
    assert stall.timeout_seconds(unset, epochs) == 3 * 1815
    # A step every 20 minutes, each its own report: an hour.
    slow = [{"at": stamp(1200 * i), "step": i} for i in range(3)]
    assert stall.timeout_seconds(unset, slow) == 3600


def test_a_job_that_never_reported_a_step_is_never_stalled() -> None:
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    assert stall.stalled(run, None, T0, at(10_000)) == (None, None)
    metrics_only = {"metrics": {"loss": 0.3}, "reportedAt": stamp(5), "advancedAt": stamp(5)}
    assert stall.stalled(run, metrics_only, T0, at(10_000)) == (None, None)


def test_a_healthy_job_reporting_epochs_only_is_not_stalled_within_its_epoch() -> None:
    """Reports every few seconds, an epoch every 30 minutes: ten minutes into an epoch is no stall."""
    unset = parse_spec(job()["spec"]).run_policy
    history = points((1, None, 0, 1800), (2, None, 1815, 2400))
    progress = {"epoch": 2, "reportedAt": stamp(2400), "advancedAt": stamp(1815), "history": history}
    assert stall.stalled(unset, progress, T0, at(1815 + 660)) == (None, 3 * 1815 - 660)
    why, _ = stall.stalled(unset, progress, T0, at(1815 + 3 * 1815))
    assert why is not None and "epoch 2 since" in why and "nothing new since" in why


def test_a_step_still_past_the_timeout_is_stalled_and_the_message_names_it() -> None:
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    progress = reported(1500, advanced=100, last=130)
    assert stall.stalled(run, progress, T0, at(150)) == (None, 10.0)  # looked at again when it would be
    why, recheck = stall.stalled(run, progress, T0, at(161))
    assert recheck is None and why == (
        f"the training has reported step 1500 since {stamp(100)} (mnist-chief-0) and nothing new since: "
        "longer than runPolicy.stallTimeoutSeconds 60s")


def test_an_attempts_first_step_gets_three_timeouts_from_its_pods_start() -> None:
    """Graph building, compilation and a checkpoint's restore come before the first step."""
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    before_the_restart = reported(1500, advanced=-900)
    assert stall.stalled(run, before_the_restart, T0, at(179)) == (None, 1.0)
    why, _ = stall.stalled(run, before_the_restart, T0, at(180))
    assert why is not None and "no new step since its pods all ran" in why and "3 x runPolicy" in why


def test_a_step_that_changes_either_way_moves_advanced_at() -> None:
    before = {"step": 1500, "epoch": 3, "advancedAt": stamp(0)}
    assert advanced_at({"step": 1500, "epoch": 3, "reportedAt": stamp(50)}, before) == stamp(0)
    assert advanced_at({"step": 1510, "epoch": 3, "reportedAt": stamp(50)}, before) == stamp(50)
    assert advanced_at({"step": 1000, "epoch": 2, "reportedAt": stamp(50)}, before) == stamp(50)  # resumed
    assert advanced_at({"step": 1500, "epoch": 3, "reportedAt": stamp(50)}, {"step": 1500}) == stamp(50)  # upgrade


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


def test_a_training_past_its_last_step_is_not_stalled() -> None:
    """A model's export or upload after the last step reports nothing."""
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    done = {**reported(10_000, advanced=100), "totalSteps": 10_000}
    assert stall.stalled(run, done, T0, at(100_000)) == (None, None)


def test_an_advanced_at_left_from_another_step_is_not_trusted() -> None:
    """An operator rolled back kept the field and moved the step; forward again, the history dates it."""
    run = parse_spec(job(stallTimeoutSeconds=60)["spec"]).run_policy
    history = [{"at": stamp(100), "step": 1500}, {"at": stamp(4000), "step": 9000}]
    left_over = {"step": 9000, "reporter": "mnist-chief-0", "reportedAt": stamp(4000), "advancedAt": stamp(100),
                 "history": history}
    assert stall.stalled(run, left_over, T0, at(4010)) == (None, 50.0)
    # A status from before the field, its job hung across the upgrade: still judged, from the history.
    before_the_field = {k: v for k, v in left_over.items() if k != "advancedAt"}
    assert stall.stalled(run, before_the_field, T0, at(4061))[0] is not None


def test_a_report_of_metrics_alone_is_no_step() -> None:
    """A hung training's heartbeat (metrics, no step) keeps the stall clock where the step left it."""
    before = {"step": 1500, "epoch": 3, "advancedAt": stamp(0)}
    assert advanced_at({"metrics": {"loss": 0.2}, "reportedAt": stamp(50)}, before) == stamp(0)
    spec = job(stallTimeoutSeconds=60)
    state = ProgressState(training=Reported(Report(metrics={"loss": 0.2}), "mnist-chief-0", at(169)))
    plan = step(spec, running(reported(1500, advanced=100)), 170, state)
    assert plan.status["progress"]["advancedAt"] == stamp(100) and condition(plan) is not None


def test_a_stall_found_keeps_its_words_until_it_ends() -> None:
    """A derived timeout or the reporter's name may move while it stands: each would be a status write."""
    status = running(reported(1500, advanced=100))
    status["conditions"].append({"type": "Stalled", "status": "True", "reason": "Stalled", "message": "as found",
                                 "lastTransitionTime": stamp(161)})
    later = step(job(stallTimeoutSeconds=60), status, 300, book(1500, 100))
    assert condition(later) == status["conditions"][-1] and not later.events
