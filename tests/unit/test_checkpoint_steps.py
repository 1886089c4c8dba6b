"""A checkpoint before a stop the operator chooses (issue 33, decide/checkpoint_steps.py): asked
through the pods' annotation, waited for until the training confirms it over the progress endpoint
or the grace passes, and then the stop goes on as before."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from test_queueing import ADMITTED, FLAVORS, workload

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import parse_spec
from disttrain.api.progress import Checkpoint, Report, ReportError, Role, parse_report
from disttrain.builders.checkpoint import REQUEST_ANNOTATION
from disttrain.builders.progress import ProgressEndpoint
from disttrain.control.progress_book import ProgressBook
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan
from disttrain.decide.progress import ProgressState, Reported
from disttrain.decide.queueing import ObservedWorkload, QueueState
from disttrain.decide.reconcile import reconcile
from manifests import replica, tf_job

REF = JobRef("mnist", "ml", "uid-1")
NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
ENDPOINT = ProgressEndpoint("https://disttrain-progress.ops.svc:8443", "ca")
RUNNING = {"phase": "Running", "startTime": "2026-11-22T11:00:00Z"}


def job(**run_policy: Any) -> dict[str, Any]:
    return tf_job("mnist", run_policy or None, chief=replica(1, cpu="1"), worker=replica(2, gpus=4))


def pod(rtype: str, index: int, phase: str = "Running") -> ObservedPod:
    return ObservedPod(name=f"mnist-{rtype}-{index}", uid=f"u-{rtype}-{index}", owner_uid="uid-1",
                       replica_type=rtype, index=index, phase=phase, ready=phase == "Running", terminating=False,
                       exit_code=None, reason=None, container_restarts=0, scheduled=True, hears_checkpoint=True)


PODS = [pod("chief", 0), pod("worker", 0), pod("worker", 1)]


def step(spec: dict[str, Any], status: dict[str, Any], *, at: datetime.datetime = NOW,
         confirmed: Checkpoint | None = None, endpoint: ProgressEndpoint | None = ENDPOINT,
         wl: ObservedWorkload | None = None, pods: list[ObservedPod] = PODS,
         confirmed_at: datetime.datetime | None = None) -> Plan:
    """`confirmed`: the book's last confirmation, arrived at `confirmed_at` (a second before `at`)."""
    arrived = confirmed_at or at - datetime.timedelta(seconds=1)
    progress = ProgressState(checkpoint=Reported(Report(step=1200, checkpoint=confirmed), "mnist-chief-0",
                                                 arrived)) if confirmed else None
    queue = QueueState("team-gpu", wl, FLAVORS) if wl else None
    state = JobState(REF, 1, parse_spec(spec["spec"]), status, queue=queue, progress=progress, report_to=endpoint)
    return reconcile(state, pods, at)


def test_a_suspend_asks_every_running_pod_and_holds_the_pods() -> None:
    plan = step(job(suspend=True), RUNNING)
    assert not plan.delete and plan.status["phase"] == "Running", "the pods stay while the training saves"
    request = plan.status["checkpoint"]
    assert request["reason"] == "Suspended" and request["deadline"] == "2026-11-22T12:00:30Z"
    assert [(p.name, a) for p, a in plan.annotate] == [(p.name, {REQUEST_ANNOTATION: request["request"]})
                                                       for p in PODS]
    assert [e.reason for e in plan.events] == ["CheckpointRequested"]
    assert "waiting up to 30s (runPolicy.checkpointGraceSeconds)" in plan.events[0].message
    assert plan.requeue_after is not None and plan.requeue_after <= 30


def test_the_confirmation_stops_the_pods_and_says_what_was_saved() -> None:
    held = step(job(suspend=True), RUNNING).status
    later = NOW + datetime.timedelta(seconds=4)
    saved = Checkpoint(held["checkpoint"]["request"], 1200, "/checkpoints/ckpt-1200")
    plan = step(job(suspend=True), held, at=later, confirmed=saved)
    assert len(plan.delete) == 3 and plan.status["phase"] == "Suspended"
    assert "checkpoint" not in plan.status
    assert plan.status["lastCheckpoint"] == {"request": saved.request, "step": 1200, "path": "/checkpoints/ckpt-1200",
                                             "confirmedAt": "2026-11-22T12:00:03Z", "waitedSeconds": 3.0}
    assert [e.reason for e in plan.events][:1] == ["Checkpointed"]
    assert "mnist-chief-0 saved a checkpoint at step 1200 (/checkpoints/ckpt-1200)" in plan.events[0].message


def test_a_checkpoint_saved_before_the_request_doesnt_count() -> None:
    held = step(job(suspend=True), RUNNING).status
    plan = step(job(suspend=True), held, at=NOW + datetime.timedelta(seconds=0.5),  # arrived at NOW - 0.5 s
                confirmed=Checkpoint("c-some-earlier-request", 900, "/old"))
    assert not plan.delete and plan.status["checkpoint"] == held["checkpoint"]
    assert plan.requeue_after == pytest.approx(29.5)


def test_a_checkpoint_saved_on_sigterm_after_the_request_counts() -> None:
    """A pod ended from outside saves on its SIGTERM, before it could read any request."""
    held = step(job(suspend=True), RUNNING).status
    plan = step(job(suspend=True), held, at=NOW + datetime.timedelta(seconds=4),
                confirmed=Checkpoint("sigterm", 1300, "/ckpt"))
    assert len(plan.delete) == 3 and plan.status["lastCheckpoint"]["request"] == "sigterm"


def disrupted(p: ObservedPod) -> ObservedPod:
    return dataclasses.replace(p, terminating=True, disruption="EvictionByEvictionAPI: Eviction API: evicting")


def test_a_pod_drained_holds_its_peers_until_the_checkpoint_then_restarts_the_job() -> None:
    pods = [pod("chief", 0), disrupted(pod("worker", 0)), pod("worker", 1)]
    plan = step(job(), RUNNING, pods=pods)
    assert not plan.delete and plan.status["checkpoint"]["reason"] == "Disrupted"
    assert "worker 0 (pod mnist-worker-0) is being ended from outside (EvictionByEvictionAPI" \
        in plan.status["message"]
    # The drained pod hears of it by its SIGTERM (a terminating pod's files are not refreshed).
    assert {p.name for p, _ in plan.annotate} == {"mnist-chief-0", "mnist-worker-1"}
    plan = step(job(), plan.status, pods=pods, at=NOW + datetime.timedelta(seconds=3),
                confirmed=Checkpoint("sigterm", 1300, "/ckpt"))
    assert len(plan.delete) == 3 and plan.status["phase"] == "Restarting"
    assert plan.status["lastCheckpoint"]["step"] == 1300 and "checkpoint" not in plan.status


def test_a_pod_drained_under_restart_policy_never_fails_the_job_at_once() -> None:
    spec = tf_job("mnist", None, chief=replica(1, cpu="1"), worker=replica(2, "Never", gpus=4))
    plan = step(spec, RUNNING, pods=[pod("chief", 0), disrupted(pod("worker", 0)), pod("worker", 1)])
    assert plan.status["phase"] == "Failed" and "checkpoint" not in plan.status


def test_no_confirmation_by_the_deadline_stops_the_pods_and_says_so() -> None:
    held = step(job(suspend=True, checkpointGraceSeconds=10), RUNNING).status
    plan = step(job(suspend=True, checkpointGraceSeconds=10), held, at=NOW + datetime.timedelta(seconds=10))
    assert len(plan.delete) == 3 and plan.status["phase"] == "Suspended" and "checkpoint" not in plan.status
    [timed_out] = [e for e in plan.events if e.reason == "CheckpointTimedOut"]
    assert timed_out.type == "Warning" and "within 10s" in timed_out.message


@pytest.mark.parametrize("how", ["grace 0", "no endpoint", "no pod running"])
def test_a_stop_that_cant_be_confirmed_goes_on_at_once(how: str) -> None:
    spec = job(suspend=True, checkpointGraceSeconds=0) if how == "grace 0" else job(suspend=True)
    pods = [pod("chief", 0, "Pending")] if how == "no pod running" else PODS
    plan = step(spec, RUNNING, endpoint=None if how == "no endpoint" else ENDPOINT, pods=pods)
    assert plan.delete and plan.status["phase"] == "Suspended" and not plan.annotate
    assert "checkpoint" not in plan.status


def test_a_kueue_eviction_keeps_its_quota_until_the_checkpoint_then_hands_it_back() -> None:
    evicted = workload(*ADMITTED, ("Evicted", True, "Preempted", "Preempted to accommodate a workload"))
    held = step(job(), RUNNING, wl=evicted)
    assert not held.delete and held.status["checkpoint"]["reason"] == "Evicted"
    assert not [op for op in held.workload if op.verb == "release"], "the quota stays while it saves"
    saved = Checkpoint(held.status["checkpoint"]["request"], 50, "gs://bucket/run/50")
    stopping = step(job(), held.status, wl=evicted, at=NOW + datetime.timedelta(seconds=2), confirmed=saved)
    assert len(stopping.delete) == 3 and stopping.status["phase"] == "Queued" and stopping.status["reason"] == "Evicted"
    gone = step(job(), stopping.status, wl=evicted, pods=[], at=NOW + datetime.timedelta(seconds=3))
    assert [op.verb for op in gone.workload if op.verb == "release"] == ["release"]


def test_an_operator_restarted_mid_wait_keeps_the_deadline_and_asks_again() -> None:
    """The request lives in the status: a new process plans the same annotation (the controller
    patches a pod once per process) and the same deadline."""
    held = step(job(suspend=True), RUNNING).status
    again = step(job(suspend=True), held, at=NOW + datetime.timedelta(seconds=20))
    assert [a for _, a in again.annotate] == [{REQUEST_ANNOTATION: held["checkpoint"]["request"]}] * 3
    assert again.status["checkpoint"] == held["checkpoint"] and not again.events
    assert again.requeue_after == pytest.approx(10)


def test_a_report_confirms_a_checkpoint_and_the_book_keeps_it_past_later_reports() -> None:
    report = parse_report({"step": 1200, "checkpoint": {"request": "c20261122-120000-000000", "step": 1200,
                                                         "path": "/checkpoints/ckpt-1200"}})
    assert report.checkpoint == Checkpoint("c20261122-120000-000000", 1200, "/checkpoints/ckpt-1200")
    woken: list[str] = []
    book = ProgressBook(wake=lambda key: woken.append("later"), wake_now=lambda key: woken.append("now"),
                        awaits_checkpoint=lambda key: True)
    book.record(("ml", "mnist"), "uid-1", Role.TRAINING, "mnist-chief-0", report, NOW)
    book.record(("ml", "mnist"), "uid-1", Role.TRAINING, "mnist-chief-0", parse_report({"step": 1201}), NOW)
    state = book.state(("ml", "mnist"), "uid-1")
    assert state is not None and state.checkpoint is not None
    assert state.checkpoint.report.checkpoint == report.checkpoint
    assert woken == ["now", "later"], "a confirmation wakes the job at once"


@pytest.mark.parametrize("bad", [
    "c1", {"request": "UPPER"}, {"request": "x" * 64}, {"request": "c1", "step": -1}, {"request": "c1", "step": True},
    {"request": "c1", "path": "a\nb"}, {"request": "c1", "path": "p" * 1025}, {"request": "c1", "extra": 1},
    {"step": 3}])
def test_a_malformed_confirmation_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(ReportError, match="checkpoint"):
        parse_report({"checkpoint": bad})


def test_every_pod_hears_the_request_through_a_file_of_its_annotation() -> None:
    from disttrain.api.objects import PodKey
    from disttrain.builders.checkpoint import CHECKPOINT_DIR
    from disttrain.builders.desired import job_pod

    spec = parse_spec(job()["spec"])
    for key in (PodKey("chief", 0), PodKey("worker", 1)):
        built = job_pod(REF, spec, key, report_to=ENDPOINT)
        [volume] = [v for v in built["spec"]["volumes"] if v["name"] == "disttrain-checkpoint"]
        assert built["metadata"]["labels"]["disttrain.dev/checkpoint-file"] == "true"
        assert volume["downwardAPI"]["items"] == [
            {"path": "request", "fieldRef": {"fieldPath": f"metadata.annotations['{REQUEST_ANNOTATION}']"}}]
        for container in built["spec"]["containers"]:
            assert {"name": "disttrain-checkpoint", "mountPath": CHECKPOINT_DIR, "readOnly": True} in \
                container["volumeMounts"]
            assert {"name": "DISTTRAIN_CHECKPOINT_DIR", "value": CHECKPOINT_DIR} in container["env"]
    bare = job_pod(REF, spec, PodKey("worker", 1))
    assert "disttrain-checkpoint" not in str(bare), "no endpoint to confirm through: nothing to hear"


def test_a_stop_called_off_drops_its_request_and_empties_the_pods_files() -> None:
    held = step(job(suspend=True), RUNNING).status
    resumed = step(job(suspend=False), held, at=NOW + datetime.timedelta(seconds=5))
    assert "checkpoint" not in resumed.status and not resumed.delete
    assert [a for _, a in resumed.annotate] == [{REQUEST_ANNOTATION: ""}] * 3
    again = step(job(suspend=True), resumed.status, at=NOW + datetime.timedelta(seconds=6))
    assert again.status["checkpoint"]["request"] != held["checkpoint"]["request"], "a new stop, a new request"


def test_the_jobs_message_says_why_it_waits_in_kueues_words() -> None:
    evicted = workload(*ADMITTED, ("Evicted", True, "Preempted", "Preempted to accommodate a workload (UID: w2)"))
    held = step(job(), RUNNING, wl=evicted).status
    assert held["message"].startswith("Kueue evicted Workload disttrainjob-mnist-")
    assert "(Preempted: Preempted to accommodate a workload (UID: w2)); the training is asked for a checkpoint " \
           f"first (request {held['checkpoint']['request']}), then its pods are stopped, at 2026-11-22T12:00:30Z " \
           "at the latest" in held["message"]


def test_a_suspend_during_an_evictions_wait_keeps_its_request_and_deadline() -> None:
    evicted = workload(*ADMITTED, ("Evicted", True, "Preempted", "Preempted to accommodate a workload"))
    held = step(job(), RUNNING, wl=evicted).status
    both = step(job(suspend=True), held, wl=evicted, at=NOW + datetime.timedelta(seconds=10))
    assert both.status["checkpoint"] == held["checkpoint"] and not both.delete and not both.events
    assert both.requeue_after == pytest.approx(20), "one bound for the stop, not a second one"


def test_preempted_twice_each_stop_has_its_own_request() -> None:
    evicted = workload(*ADMITTED, ("Evicted", True, "Preempted", "Preempted to accommodate a workload"))
    first = step(job(), RUNNING, wl=evicted).status
    saved = Checkpoint(first["checkpoint"]["request"], 50, "/ckpt")
    stopped = step(job(), first, wl=evicted, at=NOW + datetime.timedelta(seconds=2), confirmed=saved).status
    readmitted = {**{k: v for k, v in stopped.items() if k != "deletedPods"}, "phase": "Running"}  # new pods
    later = NOW + datetime.timedelta(minutes=5)
    second = step(job(), readmitted, wl=evicted, at=later, confirmed=saved,
                  confirmed_at=NOW + datetime.timedelta(seconds=1))
    assert second.status["checkpoint"]["request"] != first["checkpoint"]["request"] and not second.delete
    assert second.status["lastCheckpoint"]["step"] == 50, "the first stop's checkpoint, until the next is confirmed"


def test_the_drained_pod_gone_its_peers_are_still_held_until_the_checkpoint() -> None:
    held = step(job(), RUNNING, pods=[pod("chief", 0), disrupted(pod("worker", 0)), pod("worker", 1)]).status
    after = step(job(), held, pods=[pod("chief", 0), pod("worker", 1)], at=NOW + datetime.timedelta(seconds=2))
    assert not after.delete and after.status["checkpoint"] == held["checkpoint"], "it exited once it saved"
    done = step(job(), held, pods=[pod("chief", 0), pod("worker", 1)], at=NOW + datetime.timedelta(seconds=3),
                confirmed=Checkpoint("sigterm", 1300, "/ckpt"))
    assert len(done.delete) == 2 and done.status["lastCheckpoint"]["step"] == 1300


def test_pods_made_without_the_request_file_are_not_waited_for() -> None:
    """Pods an older operator made (no file, no label) can't hear a request: the stop goes on."""
    old = [dataclasses.replace(p, hears_checkpoint=False) for p in PODS]
    plan = step(job(suspend=True), RUNNING, pods=old)
    assert len(plan.delete) == 3 and "checkpoint" not in plan.status and not plan.annotate


def test_no_pod_left_running_ends_the_wait() -> None:
    held = step(job(suspend=True), RUNNING).status
    plan = step(job(suspend=True), held, pods=[pod("chief", 0, "Failed")], at=NOW + datetime.timedelta(seconds=2))
    assert plan.status["phase"] == "Suspended" and "checkpoint" not in plan.status
    assert any("no pod is left running" in e.message for e in plan.events)


def test_an_eviction_for_pods_never_ready_is_not_held() -> None:
    evicted = workload(*ADMITTED, ("Evicted", True, "PodsReadyTimeout", "Exceeded the PodsReady timeout"))
    plan = step(job(), RUNNING, wl=evicted)
    assert len(plan.delete) == 3 and "checkpoint" not in plan.status


def test_a_suspend_called_off_says_so_in_the_message() -> None:
    held = step(job(suspend=True), RUNNING).status
    resumed = step(job(suspend=False), held, at=NOW + datetime.timedelta(seconds=5))
    assert resumed.status["message"] == "the stop was called off before the checkpoint: the training goes on"
