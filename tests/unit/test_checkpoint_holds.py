"""Issue 43, item 2: what ends a checkpoint hold, what clears a request, and what a confirmation wakes.

- only the training's reporter (chief, worker 0, MPI rank 0) confirms: an evaluator's report naming
  the request, or a Horovod rank other than 0, ends no hold;
- a request the status dropped (the stop called off) is cleared from the pods that still carry it,
  by any later pass, however the pass that dropped it ended;
- a report with a checkpoint wakes the job at once only while a request waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
from typing import Any

import pytest
from test_controller import KEY, RUNNING, Harness

import disttrain_progress
from disttrain.api.observed import ObservedPod
from disttrain.apiserver.rest import ApiError
from disttrain.builders.checkpoint import REQUEST_ANNOTATION
from disttrain.builders.progress import ProgressEndpoint
from disttrain.control.controller import Controller
from disttrain.control.progress_desk import ProgressDesk
from disttrain.control.workqueue import WorkQueue
from disttrain.runtime.progress_link import Identity, JobKey
from manifests import replica, tf_job

ENDPOINT = ProgressEndpoint("https://disttrain-progress.ops.svc:8443", "ca")
THROTTLED = ApiError(429, "Too Many Requests", b"{}", {"Retry-After": "1"})


class Found:
    """The pod watch's lookup by uid, as the progress desk asks it."""

    def __init__(self, h: Harness) -> None:
        self.h = h

    def find(self, uid: str) -> tuple[JobKey, ObservedPod] | None:
        return next(((KEY, p) for p in self.h.pods if p.uid == uid), None)


def harness() -> Harness:
    """A job of a chief, two workers and an evaluator, on an operator that serves progress reports."""
    h = Harness(tf_job("mnist", None, chief=replica(1), worker=replica(2), evaluator=replica(1)))
    h.controller = Controller(h.kube, clock=h.clock, report_to=ENDPOINT)
    h.controller.bind(h.jobs, {KEY: h.pods})
    return h


async def suspended(h: Harness) -> str:
    """Running, then suspended: the pods are held and asked; the request's id."""
    await h.run()
    h.body["spec"]["runPolicy"] = {"suspend": True}
    await h.reconcile()
    h.watch(**RUNNING)
    request = h.status()["checkpoint"]["request"]
    assert all(p["metadata"]["annotations"][REQUEST_ANNOTATION] == request for p in h.kube.pods())
    return str(request)


def report(h: Harness, pod: str, body: dict[str, Any]) -> str:
    """A report from `pod`, as the endpoint hands it on once the pod's token is reviewed."""
    found = next(p for p in h.pods if p.name == pod)
    desk = ProgressDesk(Found(h), h.controller.progress, h.controller.role_of, now=h.clock.now)
    return desk.record(Identity("ml", pod, found.uid, 0.0), KEY, body)


def test_an_evaluators_confirmation_ends_no_hold() -> None:
    async def scenario() -> None:
        h = harness()
        request = await suspended(h)
        h.clock.advance(1)
        report(h, "mnist-evaluator-0", {"epoch": 1, "checkpoint": {"request": request, "step": 5}})
        await h.reconcile()
        assert not h.kube.writes("delete"), f"the evaluator's report ended the hold: {h.kube.writes('delete')}"
        assert h.status()["checkpoint"]["request"] == request and "lastCheckpoint" not in h.status()
        report(h, "mnist-chief-0", {"step": 7, "checkpoint": {"request": request, "step": 7, "path": "/ckpt"}})
        await h.reconcile()
        assert len(h.kube.writes("delete")) == 4, "the chief's confirmation stops the pods"
        assert h.status()["lastCheckpoint"]["step"] == 7
    asyncio.run(scenario())


class Recording:
    """A reporter that records what it would send."""

    enabled = True

    def __init__(self, role: str) -> None:
        self.role = role
        self.sent: list[str] = []

    def confirm(self, request: str, step: int | None = None, path: str = "", timeout: float = 10.0) -> bool:
        self.sent.append(request)
        return True


@pytest.mark.parametrize(("role", "rank", "sends"), [
    ("training", None, True), ("training", "0", True), ("training", "1", False), ("evaluation", None, False)])
def test_only_the_trainings_reporting_rank_confirms_in_the_pod(role: str, rank: str | None, sends: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    reporter = Recording(role)
    monkeypatch.setattr(disttrain_progress, "_default", reporter)
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK"):
        monkeypatch.delenv(name, raising=False)
    if rank is not None:
        monkeypatch.setenv("HOROVOD_RANK", rank)
    assert disttrain_progress.confirm_checkpoint(f"c-{role}-{rank}", step=3) is sends
    assert reporter.sent == ([f"c-{role}-{rank}"] if sends else []), f"{role} rank {rank} sent {reporter.sent}"


def test_a_request_left_on_the_pods_by_a_failed_clearing_is_cleared_by_a_later_pass() -> None:
    async def scenario() -> None:
        h = harness()
        await suspended(h)
        h.body["spec"]["runPolicy"] = {"suspend": False}
        h.kube.annotate_failures.append(THROTTLED)
        with contextlib.suppress(ApiError):  # the work queue retries the pass, with backoff
            await h.reconcile()
        h.watch(**RUNNING)
        assert "checkpoint" not in h.status(), "the status dropped the request before the pods were patched"
        await h.reconcile()
        left = {p["metadata"]["name"] for p in h.kube.pods() if p["metadata"]["annotations"][REQUEST_ANNOTATION]}
        assert not left, f"still asked, with no stop under way: {sorted(left)}"
        h.watch(**RUNNING)
        patched = len(h.kube.writes("annotate"))
        await h.reconcile()
        assert len(h.kube.writes("annotate")) == patched, "nothing carries the request: no patch"
    asyncio.run(scenario())


def test_a_request_left_on_the_pods_is_cleared_by_a_restarted_operator() -> None:
    """The operator died between the status write that dropped the request and the pods' patch."""
    async def scenario() -> None:
        h = harness()
        await suspended(h)
        h.body["spec"]["runPolicy"] = {"suspend": False}
        h.kube.annotate_failures.extend([THROTTLED] * 4)
        with contextlib.suppress(ApiError):
            await h.reconcile()
        h.kube.annotate_failures.clear()
        h.watch(**RUNNING)
        h.controller = Controller(h.kube, clock=h.clock, report_to=ENDPOINT)
        h.controller.bind(h.jobs, {KEY: h.pods})
        await h.reconcile()
        left = {p["metadata"]["name"] for p in h.kube.pods() if p["metadata"]["annotations"][REQUEST_ANNOTATION]}
        assert not left, f"a restarted operator left them asked: {sorted(left)}"
    asyncio.run(scenario())


def woken_at_once(monkeypatch: pytest.MonkeyPatch) -> list[JobKey]:
    woken: list[JobKey] = []
    add = WorkQueue.add

    def recording(queue: WorkQueue[JobKey], key: JobKey) -> None:
        woken.append(key)
        add(queue, key)
    monkeypatch.setattr(WorkQueue, "add", recording)
    return woken


def test_a_checkpoint_report_wakes_the_job_at_once_only_while_a_request_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    woken = woken_at_once(monkeypatch)

    async def scenario() -> None:
        h = harness()
        await h.run()
        for n in range(3):
            report(h, "mnist-chief-0", {"step": n, "checkpoint": {"request": "sigterm", "step": n}})
        assert woken == [], f"no request waits, yet the job was woken {len(woken)} times at once"
        h.clock.advance(1)
        h.body["status"] = copy.deepcopy(h.status())
        h.body["spec"]["runPolicy"] = {"suspend": True}
        await h.reconcile()
        h.watch(**RUNNING)
        request = h.status()["checkpoint"]["request"]
        report(h, "mnist-chief-0", {"step": 9, "checkpoint": {"request": request, "step": 9}})
        assert woken == [KEY], "the confirmation a stop waits for is looked at now"
    asyncio.run(scenario())


def test_a_request_on_a_pod_is_cleared_only_where_no_stop_is_under_way_and_the_pod_stays() -> None:
    import test_checkpoint_steps as pure

    asked = [dataclasses.replace(p, asked_checkpoint=True) for p in pure.PODS]
    running = pure.step(pure.job(), pure.RUNNING, pods=asked)
    assert [(p.name, a) for p, a in running.annotate] == [(p.name, {REQUEST_ANNOTATION: ""}) for p in pure.PODS]
    assert not pure.step(pure.job(), pure.RUNNING).annotate, "nothing asked: nothing patched"
    held = pure.step(pure.job(suspend=True), pure.RUNNING, pods=asked)
    assert {a[REQUEST_ANNOTATION] for _, a in held.annotate} == {held.status["checkpoint"]["request"]}
    done = {**pure.RUNNING, "phase": "Succeeded", "completionTime": "2026-11-22T12:00:00Z"}
    finished = pure.step(pure.job(), done, pods=asked)
    assert finished.delete and not finished.annotate, "pods deleted now are not patched first"
