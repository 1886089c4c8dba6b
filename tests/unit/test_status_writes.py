"""Fewer status writes, never from a stale read (disttrain/control/status_writes.py), alone and in the
controller on the in-memory Kube."""

from __future__ import annotations

import asyncio
import copy

import pytest
from fakes import FakeClock
from test_controller import Harness

from disttrain.control.status_writes import (
    BUSY_PROGRESS_WRITE_INTERVAL,
    PROGRESS_WRITE_INTERVAL,
    Backlog,
    WrittenStatus,
    progress_wait,
    with_own_status,
)
from manifests import mwms_job

BODY = {"metadata": {"name": "j", "resourceVersion": "5"}, "spec": {}, "status": {"phase": "Pending"}}


def test_the_index_before_our_write_is_read_as_our_write() -> None:
    written = WrittenStatus("5", "6", {"phase": "Running"}, 100.0)
    seen = with_own_status(written, BODY)
    assert seen["status"] == {"phase": "Running"} and seen["metadata"]["resourceVersion"] == "6"
    newer = {**BODY, "metadata": {"name": "j", "resourceVersion": "7"}}
    assert with_own_status(written, newer) is newer, "the index has moved on: it is the truth"
    assert with_own_status(None, BODY) is BODY


def test_only_progress_waits_and_only_just_after_a_write() -> None:
    written = WrittenStatus("5", "6", {}, 100.0)
    base = {"phase": "Running", "ready": "1/2", "restarts": 0}
    assert progress_wait(written, base, {**base, "ready": "2/2"}, 100.2) == pytest.approx(PROGRESS_WRITE_INTERVAL - 0.2)
    assert progress_wait(written, base, {**base, "ready": "2/2"}, 100.0 + PROGRESS_WRITE_INTERVAL) is None
    assert progress_wait(written, base, {**base, "restarts": 1}, 100.2) is None, "a restart is said at once"
    assert progress_wait(written, base, {**base, "phase": "Failed"}, 100.2) is None
    assert progress_wait(None, base, {**base, "ready": "2/2"}, 100.2) is None, "the first write is never held"


def test_a_message_whose_counts_moved_on_waits_a_new_reasons_does_not() -> None:
    """A 1,024-worker job waiting for its gang: its message's count moved on with every pass, and each
    was a status write (30 to 61 while its pods came up: make bench, large jobs; issue 45)."""
    written = WrittenStatus("5", "6", {}, 100.0)
    base = {"phase": "Pending", "reason": "WaitingForGang", "message": "waiting: 10/1024 pods scheduled"}
    counted = {**base, "message": "waiting: 412/1024 pods scheduled"}
    assert progress_wait(written, base, counted, 100.2) == pytest.approx(PROGRESS_WRITE_INTERVAL - 0.2)
    told = {**base, "reason": "PodTrouble", "message": "pod big-worker-7: ImagePullBackOff"}
    assert progress_wait(written, base, told, 100.2) is None, "a new reason is said at once, with its message"
    assert progress_wait(written, base, {**counted, "phase": "Running"}, 100.2) is None


def test_pods_getting_ready_one_by_one_cost_one_write_after_the_phase() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run()
        writes = len(h.kube.statuses)
        h.body["status"] = copy.deepcopy(h.status())  # the watch shows our write
        h.pods[:] = h.kube.observed(phase="Running", conditions=[{"type": "Ready", "status": "False"}])
        h.clock.advance(0.1)
        again = await h.reconcile()
        assert len(h.kube.statuses) == writes, "progress alone, a moment after a write: held back"
        assert again is not None and again <= PROGRESS_WRITE_INTERVAL
        h.clock.advance(again)
        await h.reconcile()
        assert len(h.kube.statuses) == writes + 1 and h.status()["ready"] == "0/2"
    asyncio.run(scenario())



def test_under_a_backlog_progress_waits_longer_and_a_phase_still_not_at_all() -> None:
    """A burst of 1,000 jobs: their ready counts went out 5 s after each Pending write, 0.69 more
    status writes a job than Pending and Running (make bench, issue 45). With more jobs queued than
    workers, a progress-only change waits BUSY_PROGRESS_WRITE_INTERVAL; the controller asks its queue."""
    written = WrittenStatus("5", "6", {}, 100.0)
    base = {"phase": "Pending", "ready": "0/5"}
    busy = BUSY_PROGRESS_WRITE_INTERVAL
    assert progress_wait(written, base, {**base, "ready": "3/5"}, 106.0, progress_interval=busy) == pytest.approx(
        busy - 6.0)
    assert progress_wait(written, base, {**base, "ready": "3/5"}, 100.0 + busy, progress_interval=busy) is None
    assert progress_wait(written, base, {"phase": "Running", "ready": "5/5"}, 100.2, progress_interval=busy) is None

    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run()
        writes = len(h.kube.statuses)
        h.body["status"] = copy.deepcopy(h.status())
        h.pods[:] = h.kube.observed(phase="Running", conditions=[{"type": "Ready", "status": "False"}])
        for n in range(h.controller.queue._workers + 1):  # a backlog: more jobs waiting than workers
            h.controller.queue.add(("ml", f"waiting-{n}"))
        h.clock.advance(0.1)
        again = await h.reconcile()
        assert len(h.kube.statuses) == writes
        assert again is not None and PROGRESS_WRITE_INTERVAL < again <= BUSY_PROGRESS_WRITE_INTERVAL
    asyncio.run(scenario())


def test_a_backlog_holds_its_longer_wait_until_it_has_been_gone_as_long() -> None:
    """The burst's tail: its jobs' pods still come up, many at once, once the queue has drained."""
    clock, waiting = FakeClock(), [17]
    backlog = Backlog(lambda: waiting[0], 16, clock)
    assert backlog()
    waiting[0] = 3
    clock.advance(BUSY_PROGRESS_WRITE_INTERVAL - 1)
    assert backlog(), "drained a moment ago"
    clock.advance(1)
    assert not backlog(), "drained as long ago as the longer wait"
    assert not Backlog(lambda: 16, 16, clock)(), "as many waiting as workers: no backlog"
    assert not Backlog(lambda: 10, 1, clock)(), "one worker: fewer than MIN_BACKLOG waiting is no backlog"


def test_under_a_backlog_reported_progress_still_waits_no_longer_than_its_own_interval() -> None:
    """A ready count moving with the training's report must not hold the report 30 s (a review of
    issue 45's change: "at most 15 s old" in docs/api.md)."""
    written = WrittenStatus("5", "6", {}, 100.0)
    base = {"phase": "Running", "ready": "4/5", "progress": {"step": 1}}
    moved = {**base, "ready": "5/5", "progress": {"step": 2}}
    assert progress_wait(written, base, moved, 116.0, progress_interval=BUSY_PROGRESS_WRITE_INTERVAL) is None
    assert progress_wait(written, base, moved, 110.0, progress_interval=BUSY_PROGRESS_WRITE_INTERVAL) == \
        pytest.approx(5.0)


def test_a_job_kueue_queues_never_waits_the_longer_interval() -> None:
    """A MultiKueue manager reads PodsReady off the worker's copy of the ready counts: held 30 s, a
    count could outlast waitForPodsReady's recoveryTimeout."""
    from disttrain.control.status_writes import StatusWriter
    from disttrain.decide.queueing import PREBUILT_WORKLOAD, QUEUE_LABEL

    writer = StatusWriter(None, FakeClock(), waiting=lambda: 100, workers=16)  # type: ignore[arg-type]
    assert writer.progress_interval({"metadata": {}}) == BUSY_PROGRESS_WRITE_INTERVAL
    for label in (QUEUE_LABEL, PREBUILT_WORKLOAD):
        assert writer.progress_interval({"metadata": {"labels": {label: "q"}}}) == PROGRESS_WRITE_INTERVAL
    # Since Kueue v0.18 MultiKueue names the worker copy's Workload in an annotation (decide/queueing.py)
    assert writer.progress_interval({"metadata": {"annotations": {PREBUILT_WORKLOAD: "q"}}}) == PROGRESS_WRITE_INTERVAL


def test_the_created_condition_is_progress_a_new_phase_is_not() -> None:
    written = WrittenStatus("5", "6", {}, 100.0)
    created = {"type": "Created", "status": "True", "reason": "PodsCreated"}
    base = {"phase": "Pending", "conditions": []}
    assert progress_wait(written, base, {**base, "conditions": [created]}, 100.2) is not None
    running = {"type": "Running", "status": "True", "reason": "Running"}
    assert progress_wait(written, base, {"phase": "Running", "conditions": [created, running]}, 100.2) is None


def test_a_field_the_new_status_drops_is_removed_by_the_merge_patch() -> None:
    """The Succeeded write of `make e2e` (issue 23) kept its ETA: a merge patch keeps every key it
    doesn't name. What the status was computed from and no longer holds is sent as null."""
    from disttrain.control.status_writes import merge_patch

    was = {"phase": "Running", "progress": {"percent": 100, "eta": "0s", "remainingSeconds": 0, "metrics": {"loss": 1}}}
    new = {"phase": "Succeeded", "progress": {"percent": 100, "metrics": {"loss": 1}}}
    assert merge_patch(was, new) == {"phase": "Succeeded", "progress": {
        "percent": 100, "eta": None, "remainingSeconds": None, "metrics": {"loss": 1}}}
    assert merge_patch({}, new) == new
