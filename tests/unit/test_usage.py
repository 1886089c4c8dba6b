"""Where a job's GPU-seconds went (issue 46, decide/policies/usage.py and decide/usage_steps.py):
each pod's GPUs from its scheduling until it ends or goes, split by what the job was doing, counted
with the status writes the job makes anyway."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from test_stall import ENDPOINT, REF, at, stamp  # its clock: every pod running from T0

from disttrain.api.observed import ObservedPod, observe_pod
from disttrain.api.parse import parse_spec
from disttrain.api.progress import Report
from disttrain.control.status_writes import progress_wait, without_usage
from disttrain.control.tombstones import Tombstones
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan
from disttrain.decide.policies import usage
from disttrain.decide.progress import ProgressState, Reported
from disttrain.decide.reconcile import reconcile
from manifests import replica, tf_job


def job(**run_policy: Any) -> dict[str, Any]:
    """A chief without GPUs and two workers of 4 GPUs each: 8 GPUs held once the workers are bound."""
    return tf_job("mnist", run_policy or None, chief=replica(1, cpu="1"), worker=replica(2, gpus=4))


def pod(rtype: str, index: int, scheduled: float | None = 0.0, phase: str = "Running", uid: str = "",
        ended: float | None = None) -> ObservedPod:
    return ObservedPod(name=f"mnist-{rtype}-{index}", uid=uid or f"u-{rtype}-{index}", owner_uid="uid-1",
                       replica_type=rtype, index=index, phase=phase, ready=phase == "Running", terminating=False,
                       exit_code=None, reason=None, container_restarts=0, scheduled=scheduled is not None,
                       scheduled_at=None if scheduled is None else at(scheduled).timestamp(),
                       ended_at=None if ended is None else at(ended).timestamp())


def pods(scheduled: float = 0.0, uid: str = "") -> list[ObservedPod]:
    return [pod("chief", 0, scheduled, uid=uid and f"{uid}-c"), pod("worker", 0, scheduled, uid=uid and f"{uid}-w0"),
            pod("worker", 1, scheduled, uid=uid and f"{uid}-w1")]


def step(status: dict[str, Any], now: float, observed: list[ObservedPod], progress: ProgressState | None = None,
         departed: tuple[ObservedPod, ...] = (), spec: dict[str, Any] | None = None) -> Plan:
    state = JobState(REF, 1, parse_spec((spec or job())["spec"]), status, progress=progress, report_to=ENDPOINT,
                     departed=departed)
    return reconcile(state, observed, at(now))


def book(step_: int, seconds: float) -> ProgressState:
    return ProgressState(training=Reported(Report(step=step_, total_steps=10_000), "mnist-chief-0", at(seconds)))


def pending(startup: float = -10) -> dict[str, Any]:
    return {"phase": "Pending", "startTime": stamp(startup),
            "conditions": [{"type": "Created", "status": "True", "lastTransitionTime": stamp(startup)}]}


def test_a_gpu_jobs_seconds_are_its_pods_gpus_from_scheduling_split_into_waiting_and_training() -> None:
    first = step(pending(), 0, [pod("chief", 0, 0.0, "Pending"), pod("worker", 0, 0.0, "Pending"),
                                pod("worker", 1, None, "Pending")])
    assert first.status["usage"]["state"] == "waiting"
    # Worker 1 bound 4 s later; all Running at 10 s: 4 GPUs x 10 s + 4 GPUs x 6 s waited.
    running = step(first.status, 10, [*pods(0.0)[:2], pod("worker", 1, 4.0)])
    assert running.status["phase"] == "Running"
    got = running.status["usage"]
    assert got["seconds"] == {"waiting": 64.0} and got["state"] == "training"
    later = step(running.status, 70, [*pods(0.0)[:2], pod("worker", 1, 4.0)])
    got = later.status["usage"]
    assert got["resource"] == "nvidia.com/gpu"
    assert got["seconds"] == {"waiting": 64.0, "training": 480.0}
    assert got["allocatedSeconds"] == 544.0 and got["gpuHours"] == round(544 / 3600, 2)
    assert got["goodputPercent"] == round(100 * 480 / 544)


def test_a_count_alone_is_never_written_and_a_change_of_use_is_written_at_once() -> None:
    running = step(pending(), 10, pods()).status
    later = step(running, 70, pods())
    assert without_usage(later.status) == without_usage(running) and later.status["usage"] != running["usage"]
    assert later.usage_write is None, "a count alone rides with the job's next write"
    assert step(running, 10, pods()).status == running, "nothing held since: the status doesn't change"
    # The same count, made again by a later pass from the same status, is the same: nothing is lost
    # by not writing one.
    again = step(running, 130, pods())
    assert again.status["usage"]["seconds"] == {"waiting": 80.0, "training": 120 * 8.0}
    # A use that changes (a checkpoint hold: a suspend) is written at once.
    suspended = step(later.status, 80, [dataclasses.replace(p, hears_checkpoint=True) for p in pods()],
                     spec=job(suspend=True))
    assert suspended.status["usage"]["state"] == "checkpoint" and suspended.usage_write == 0


def test_the_status_writer_holds_a_count_back_until_due() -> None:
    from disttrain.control.status_writes import WrittenStatus

    was = {"phase": "Running", "usage": {"countedAt": stamp(0), "state": "training"}}
    new = {"phase": "Running", "usage": {"countedAt": stamp(9), "state": "training"}}
    written = WrittenStatus("1", "2", was, at=100.0)
    assert progress_wait(written, was, new, 101.0, usage_due=0) is None, "due now"
    assert progress_wait(written, was, new, 101.0, usage_due=5.0) == 4.0, "due with the next progress write"
    assert progress_wait(written, was, new, 101.0, usage_due=300.0) == 299.0, "a stalled job's, 5 minutes on"
    assert progress_wait(written, was, {**new, "phase": "Failed"}, 101.0) is None, "along with a transition"
    reported = {**new, "progress": {"step": 2}}
    assert progress_wait(written, was, reported, 101.0, usage_due=5.0) == 4.0, "a pod gone: 5 s, progress or not"
    assert progress_wait(written, was, reported, 101.0) == 14.0, "progress alone: 15 s"


def test_steps_done_again_after_a_restart_are_redone_until_past_the_furthest_reached() -> None:
    restarted = {"phase": "Running", "startTime": stamp(-100), "restarts": 1,
                 "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": stamp(0)}],
                 "progress": {"step": 900, "totalSteps": 10_000, "reportedAt": stamp(-50),
                              "advanced": {"at": stamp(-50), "step": 900}},
                 "usage": {"resource": "nvidia.com/gpu", "seconds": {"training": 800.0}, "countedAt": stamp(0),
                           "state": "waiting", "reached": {"step": 900}}}
    # The new attempt has reported nothing yet: its restore and compile are the restart's cost.
    first = step(restarted, 5, pods(-5), book(900, -50))
    assert first.status["usage"]["state"] == "redone" and first.usage_write == 0
    resumed = step(first.status, 20, pods(-5), book(600, 20))
    assert resumed.status["usage"]["state"] == "redone"
    assert resumed.status["usage"]["seconds"] == {"training": 800.0, "waiting": 8 * 5.0, "redone": 8 * 15.0}
    past = step(resumed.status, 60, pods(-5), book(901, 60))
    got = past.status["usage"]
    assert got["state"] == "training" and past.usage_write is None, "rides with the progress write it comes with"
    assert got["seconds"] == {"training": 800.0, "waiting": 40.0, "redone": 8 * 55.0}
    assert got["reached"] == {"step": 901}


def test_a_pod_gone_is_counted_until_it_went_and_that_count_is_written_soon() -> None:
    running = step(pending(), 10, pods()).status
    gone = dataclasses.replace(pods()[1], terminating=True, ended_at=at(40).timestamp())
    plan = step(running, 45, [pods()[0], pods()[2]], departed=(gone,))
    assert plan.status["usage"]["seconds"]["training"] == 4 * 30 + 4 * 35
    assert plan.usage_write == 0, "a pod lost restarts the job: a change of use, written at once"
    # A finished job's last pods going: the count holding them is written within 5 s.
    done = {"phase": "Succeeded", "completionTime": stamp(50), "startTime": stamp(-10),
            "usage": {"seconds": {"training": 100.0}, "countedAt": stamp(50), "state": "other"}}
    last = dataclasses.replace(pods()[2], terminating=True, ended_at=at(55).timestamp())
    finished = step(done, 56, [], departed=(last,))
    assert finished.status["usage"]["seconds"] == {"training": 100.0, "other": 20.0}
    assert finished.usage_write == 5.0
    # Once a status counted past it, the controller lets it go.
    stones = Tombstones(now=lambda: at(40).timestamp())
    stones.pod_deleted(("ml", "mnist"), pods()[1])
    assert len(stones.departed_of(("ml", "mnist"), running)) == 1
    assert stones.departed_of(("ml", "mnist"), plan.status) == ()
    assert stones.departed == {}


def test_a_pod_that_ended_holds_nothing_after_its_last_container_finished() -> None:
    body = {"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n"},
            "status": {"phase": "Succeeded", "startTime": stamp(1),
                       "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(0)}],
                       "containerStatuses": [{"state": {"terminated": {"exitCode": 0, "finishedAt": stamp(30)}}},
                                             {"state": {"terminated": {"exitCode": 0, "finishedAt": stamp(42)}}}]}}
    seen = observe_pod(body)
    assert (seen.scheduled_at, seen.ended_at) == (at(0).timestamp(), at(42).timestamp())
    assert usage.held_seconds(seen, 2.0, None, at(100).timestamp()) == 84.0
    assert usage.held_seconds(seen, 2.0, at(50).timestamp(), at(100).timestamp()) == 0.0


def at_step_50_since_100() -> dict[str, Any]:
    """Running since -100, at step 50 since 100, counted until then as training."""
    return {"phase": "Running", "startTime": stamp(-100),
            "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": stamp(-100)}],
            "progress": {"step": 50, "totalSteps": 10_000, "reportedAt": stamp(100),
                         "advanced": {"at": stamp(100), "step": 50}},
            "usage": {"resource": "nvidia.com/gpu", "seconds": {"training": 8 * 200.0}, "countedAt": stamp(100),
                      "state": "training", "reached": {"step": 50}}}


def test_a_stall_found_moves_the_seconds_since_the_last_new_step() -> None:
    status = at_step_50_since_100()
    plan = step(status, 160, pods(-100), book(50, 100), spec=job(stallTimeoutSeconds=60))
    assert any(c["type"] == "Stalled" and c["status"] == "True" for c in plan.status["conditions"])
    got = plan.status["usage"]
    assert got["seconds"] == {"training": 8 * 200.0, "stalled": 8 * 60.0} and got["state"] == "stalled"
    assert plan.usage_write in (0, None) and got["allocatedSeconds"] == 8 * 260.0


def test_a_job_without_gpus_counts_cpu_cores_requested() -> None:
    spec = tf_job("mnist", None, worker=replica(2, cpu="500m"))
    observed = [pod("worker", 0), pod("worker", 1)]
    running = step(pending(), 10, observed, spec=spec)
    got = step(running.status, 110, observed, spec=spec).status["usage"]
    assert got["resource"] == "cpu" and got["seconds"] == {"waiting": 10.0, "training": 100.0}
    assert got["cpuHours"] == round(110 / 3600, 2) and "gpuHours" not in got


def test_what_a_status_writer_put_in_usage_is_read_as_nothing_when_it_isnt_a_count() -> None:
    """Whoever may patch disttrainjobs/status can write anything there: a negative, a string, a
    use that doesn't exist, a countedAt in the future. None of it raises, and none counts twice."""
    hostile = {"phase": "Running", "startTime": stamp(-10),
               "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": stamp(0)}],
               "usage": {"seconds": {"training": -1e18, "waiting": "lots", "bogus": 5}, "countedAt": stamp(10_000),
                         "state": "nonsense", "reached": "far"}}
    got = step(hostile, 60, pods()).status["usage"]
    assert got["seconds"] == {} and got["allocatedSeconds"] == 0.0 and got["state"] == "training"
    assert step({**hostile, "usage": "junk"}, 60, pods()).status["usage"]["state"] == "training"


def test_a_job_finished_before_usage_was_counted_is_left_alone() -> None:
    done = {"phase": "Succeeded", "completionTime": stamp(0), "startTime": stamp(-100)}
    assert "usage" not in step(done, 60, []).status
    stones = Tombstones(now=lambda: at(70).timestamp())
    stones.pod_deleted(("ml", "mnist"), pods()[1])
    assert stones.departed_of(("ml", "mnist"), done) == () and stones.departed == {}, "never counted: not kept"


def test_counts_past_any_real_job_or_an_unreadable_time_never_crash_or_count_twice() -> None:
    running = {"phase": "Running", "startTime": stamp(-10),
               "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": stamp(0)}]}
    for huge in (3.2e13, 1e307, 1.7e308, float("inf"), float("nan")):  # from one past a million GPU-years
        hostile = {**running, "usage": {"seconds": {"training": huge, "waiting": huge}, "countedAt": stamp(0),
                                        "state": "waiting"}}
        got = step(hostile, 60, pods()).status["usage"]
        assert got["seconds"] == {"waiting": 8 * 60.0}, (huge, got)
    kept = {**running, "usage": {"seconds": {"waiting": 3.1e13}, "countedAt": stamp(0), "state": "waiting"}}
    assert step(kept, 60, pods()).status["usage"]["seconds"]["waiting"] == 3.1e13 + 8 * 60, "a million years, kept"
    no_time = {**running, "usage": {"seconds": {"training": 100.0}, "state": "training", "countedAt": "+14:60"}}
    got = step(no_time, 60, pods()).status["usage"]
    assert got["seconds"] == {"training": 100.0}, "counted before, its time unreadable: nothing counted again"
    stones = Tombstones(now=lambda: at(70).timestamp())
    stones.pod_deleted(("ml", "mnist"), pods()[1])
    ahead = {**running, "usage": {"countedAt": stamp(10_000)}}
    # Counted "up to" the future is counted up to now (usage_steps: nothing held before now counts again),
    # so a pod gone before now is let go: a status writer can only take from its own job's count.
    assert stones.departed_of(("ml", "mnist"), ahead) == ()


def test_the_pass_that_restarts_the_job_keeps_the_step_it_reached() -> None:
    """The step this attempt reached, shown in the pass that ends it (its progress not yet written),
    is the one the next attempt redoes up to."""
    status = {**at_step_50_since_100(), "progress": {"step": 50, "totalSteps": 10_000, "reportedAt": stamp(100),
                                                     "advanced": {"at": stamp(100), "step": 50}}}
    plan = step(status, 120, pods(-100), book(90, 118), spec=job(stallTimeoutSeconds=60, onStall="Restart"))
    assert plan.status["usage"]["reached"] == {"step": 90}


def test_a_running_job_that_writes_nothing_else_is_counted_every_30_minutes() -> None:
    running = step(pending(), 10, pods()).status
    quiet = step(running, 100, pods())
    assert quiet.usage_write is None and quiet.requeue_after is not None and quiet.requeue_after <= 1710
    due = step(running, 1811, pods())
    assert due.usage_write == 0 and due.status["usage"]["seconds"]["training"] == 8 * 1801.0


def test_an_mpi_job_with_dra_gpus_stays_counted_in_gpus_once_finished() -> None:
    """A finished job's claims aren't read again (control/claims.py): the count kept in its status
    says its workers' GPUs."""
    from manifests import mpi_job

    spec = mpi_job("hvd", workers=2, gpus=0)
    done = {"phase": "Succeeded", "completionTime": stamp(50), "startTime": stamp(-10), "claimedGPUsPerWorker": 2,
            "usage": {"resource": "nvidia.com/gpu", "seconds": {"training": 100.0}, "countedAt": stamp(50),
                      "state": "other"}}
    worker = dataclasses.replace(pod("worker", 0), name="hvd-worker-0")
    got = step(done, 60, [worker], spec=spec).status["usage"]
    assert got["resource"] == "nvidia.com/gpu" and got["seconds"] == {"training": 100.0, "other": 20.0}


def test_a_pod_refused_by_the_kubelet_ended_when_its_conditions_last_changed() -> None:
    body = {"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n"},
            "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                       "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(0)},
                                      {"type": "Ready", "status": "False", "lastTransitionTime": stamp(3)}]}}
    assert observe_pod(body).ended_at == at(3).timestamp()


def test_a_stall_restarted_at_once_still_moves_its_seconds_to_stalled() -> None:
    """onStall Restart: the pass that finds the stall restarts the job (Running ends), and the seconds
    since the last new step are stalled all the same."""
    plan = step(at_step_50_since_100(), 160, pods(-100), book(50, 100),
                spec=job(stallTimeoutSeconds=60, onStall="Restart"))
    assert plan.status["phase"] == "Restarting"
    got = plan.status["usage"]
    assert got["seconds"] == {"training": 8 * 200.0, "stalled": 8 * 60.0} and got["state"] == "waiting"
    assert plan.usage_write == 0


def test_no_use_ever_goes_down_the_seconds_since_the_last_step_wait_unsettled() -> None:
    """Prometheus reads a counter that goes down as a reset: the seconds since the training's last new
    step are unsettled until it reports one (training) or is found stalled (stalled), never moved
    after being counted as one use. A stalled job, which makes no other write, is written every 5
    minutes."""
    status, seen, plans = at_step_50_since_100(), [], []
    for now in (110, 130, 150, 161, 300, 470):
        plan = step(status, now, pods(-100), book(50, 100), spec=job(stallTimeoutSeconds=60))
        status = plan.status
        plans.append(plan)
        seen.append(dict(status["usage"]["seconds"]))
        got = status["usage"]
        assert abs(sum(got["seconds"].values()) + got.get("unsettledSeconds", 0) - got["allocatedSeconds"]) < 0.2
    for earlier, later in itertools.pairwise(seen):
        assert all(later.get(use, 0) >= value for use, value in earlier.items()), (earlier, later)
    assert seen[2] == {"training": 1600.0}, "nothing settled while the step stands, short of the timeout"
    assert seen[3] == {"training": 1600.0, "stalled": 8 * 61.0}
    assert plans[3].usage_write == 0, "found: written at once"
    assert plans[4].usage_write is None and (plans[4].requeue_after or 999) <= 161, "then 5 minutes after that write"
    unwritten = step(plans[3].status, 470, pods(-100), book(50, 100), spec=job(stallTimeoutSeconds=60))
    assert unwritten.usage_write == 0, "the count written at 161 (the pass at 300 wrote nothing): due at 461"
    moved = step(status, 710, pods(-100), book(51, 705), spec=job(stallTimeoutSeconds=60)).status["usage"]
    assert moved["state"] == "training" and moved["seconds"]["stalled"] == 8 * 605.0, "until the new step's report"
    assert moved["unsettledSeconds"] == 8 * 5.0, "after it: the new step's, told later"


def test_a_new_step_settles_the_seconds_up_to_its_report_however_late_the_pass_or_the_write() -> None:
    """Progress is written every 15 s at most: passes between count from the last status written, and
    split the seconds at the new step's report, not at the pass."""
    written = at_step_50_since_100()
    for now in (106, 112, 130):  # each from the same written status (none of them wrote)
        got = step(written, now, pods(-100), book(60, 105)).status["usage"]
        assert got["seconds"] == {"training": 1600.0 + 8 * 5}, (now, got)
        assert got["unsettledSeconds"] == 8 * (now - 105.0)


def test_a_disrupted_pod_gone_is_counted_once() -> None:
    """Its last state is both kept to be judged (Tombstones.final: among the job's pods) and kept to be
    counted (Tombstones.departed): counted once, until it went."""
    running = step(pending(), 10, pods()).status
    stones = Tombstones(now=lambda: at(40).timestamp())
    lost = dataclasses.replace(pods()[2], disruption="DeletionByTaintManager: node tainted")
    stones.pod_deleted(("ml", "mnist"), lost)
    own = stones.view(("ml", "mnist"), [pods()[0], pods()[1]], set())
    plan = step(running, 45, own, departed=stones.departed_of(("ml", "mnist"), running))
    assert plan.status["usage"]["allocatedSeconds"] - 80 == 4 * 35 + 4 * 30


def test_a_step_reported_ahead_of_the_clock_counts_no_second_twice() -> None:
    """Another writer's clock (the last leader's) ahead of ours: the step's time is taken as now at most."""
    status = at_step_50_since_100()
    for now in (110, 120, 130, 140):
        status = step(status, now, pods(-100), book(60, 240)).status
    assert status["usage"]["allocatedSeconds"] == 8 * 240.0


def test_an_mpi_job_whose_claims_are_read_after_its_first_count_is_counted_in_gpus() -> None:
    """Its first pass waits for its ResourceClaimTemplate (counted in CPU, nothing held); once read, it
    is a GPU job: nothing was counted in CPU, so the resource follows."""
    from manifests import gloo_job

    spec = gloo_job("hvd", workers=1, gpus=0)
    first = {"phase": "Running", "startTime": stamp(-10),
             "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": stamp(0)}],
             "usage": {"resource": "cpu", "seconds": {}, "countedAt": stamp(0), "state": "training"}}
    worker = dataclasses.replace(pod("worker", 0), name="hvd-worker-0")
    got = step({**first, "claimedGPUsPerWorker": 2}, 10, [worker], spec=spec).status["usage"]
    assert got["resource"] == "nvidia.com/gpu" and got["allocatedSeconds"] == 2 * 10.0, got
