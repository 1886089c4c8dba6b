"""A job that leaves its Kueue queue (the kueue.x-k8s.io/queue-name label removed) while it has a
Workload: the job's own Workload, found by its controller reference whatever the label says now, is
deleted once none of the job's pods is left, so its quota goes back to Kueue (issue 43, item 2)."""

from __future__ import annotations

import copy
from typing import Any

from fakes import FakeKube
from test_controller import KEY, RUNNING, Harness, run

from disttrain.builders.progress import ProgressEndpoint
from disttrain.control.queues import WORKLOADS_UNLISTED_RETRY
from disttrain.decide import queueing
from disttrain.decide.queueing import QUEUE_LABEL
from manifests import mwms_job

ENDPOINT = ProgressEndpoint("https://disttrain-progress.ops.svc:8443", "ca")
GRACE = 20


def kueue_workloads(kube: FakeKube) -> list[dict[str, Any]]:
    return [o for (kind, _, _), o in kube.objects.items() if kind == "Workload"]


def index(h: Harness) -> None:
    """The operator's Workload watch, as the fake API's Workloads are now."""
    h.controller.bind(h.jobs, {KEY: h.pods}, {KEY: [queueing.observe_workload(copy.deepcopy(w))
                                                    for w in kueue_workloads(h.kube)]})


def kueue_says(workload: dict[str, Any], *conditions: tuple[str, str]) -> None:
    """Kueue's writes to the Workload's status: conditions (type, reason) True, and its admission."""
    status = workload.setdefault("status", {})
    merged = {c["type"]: c for c in status.get("conditions") or []}
    merged |= {t: {"type": t, "status": "True", "reason": r, "message": f"{r} by Kueue"} for t, r in conditions}
    status["conditions"] = list(merged.values())
    status["admission"] = {"clusterQueue": "gpu-cq", "podSetAssignments": [
        {"name": s["name"], "count": s["count"], "flavors": {}} for s in workload["spec"]["podSets"]]}


def reserved(h: Harness) -> list[str]:
    return [w["metadata"]["name"] for w in kueue_workloads(h.kube)
            if any(c["type"] == "QuotaReserved" and c["status"] == "True"
                   for c in (w.get("status") or {}).get("conditions") or [])]


async def running_in_queue(h: Harness) -> dict[str, Any]:
    """The job admitted by Kueue and Running; its Workload (in the fake API) returned."""
    h.body["metadata"]["labels"] = {QUEUE_LABEL: "team-gpu"}
    await h.reconcile()
    [workload] = kueue_workloads(h.kube)
    kueue_says(workload, ("QuotaReserved", "QuotaReserved"), ("Admitted", "Admitted"))
    index(h)
    h.body["status"] = copy.deepcopy(h.status())
    await h.run()
    return workload


async def step(h: Harness) -> None:
    h.watch(**RUNNING)
    index(h)
    await h.reconcile()


def test_a_preempted_job_that_drops_its_queue_label_while_suspending_gives_its_quota_back() -> None:
    """The plane's case: preempted, in its checkpoint hold (phase Running), then suspended with the
    queue label removed in one update. The job had no queue from then on, and its evicted Workload
    kept QuotaReserved=True for ever: the preemptor never ran."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2, checkpointGraceSeconds=GRACE))
        h.controller = type(h.controller)(h.kube, clock=h.clock, report_to=ENDPOINT)
        h.controller.bind(h.jobs, {KEY: h.pods})
        workload = await running_in_queue(h)
        kueue_says(workload, ("Evicted", "Preempted"))
        await step(h)
        assert h.status()["checkpoint"]["reason"] == "Evicted", "in its checkpoint hold"
        h.body["status"] = copy.deepcopy(h.status())
        h.body["metadata"]["labels"] = {}
        h.body["spec"]["runPolicy"]["suspend"] = True
        await step(h)
        assert h.kube.pods(), "the hold goes on: the pods stay until the checkpoint or its deadline"
        h.clock.advance(GRACE + 1)
        for _ in range(3):
            await step(h)
        assert not h.kube.pods()
        assert h.status()["phase"] == "Suspended"
        assert not reserved(h), "the evicted Workload's quota goes back to Kueue"
        assert not kueue_workloads(h.kube), "the job left its queue: its Workload is deleted"
    run(scenario)


def test_a_job_that_leaves_its_queue_while_queued_deletes_its_workload_then_starts() -> None:
    """Left while it waited (the chart's policy allows it): the Workload Kueue could still admit
    goes, and the job starts without Kueue, as one never labelled does."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.body["metadata"]["labels"] = {QUEUE_LABEL: "team-gpu"}
        await h.reconcile()
        assert kueue_workloads(h.kube) and not h.kube.pods()
        h.body["status"] = copy.deepcopy(h.status())
        h.body["metadata"]["labels"] = {}
        await step(h)
        assert not kueue_workloads(h.kube), "deleted"
        assert len(h.kube.pods()) == 2, "and it starts as a job without the label"
        assert not any("nodeSelector" in pod["spec"] for pod in h.kube.pods())
        assert ("Normal", "LeftQueue") in {e[:2] for e in h.kube.events}
        h.body["status"] = copy.deepcopy(h.status())
        await step(h)
        assert h.status()["phase"] == "Running" and h.status()["startTime"]
    run(scenario)


def test_a_running_job_that_lost_its_label_keeps_its_workload_until_its_pods_are_gone() -> None:
    """Without the chart's policy the label can go from a running job: its pods still hold the
    quota its Workload has, so the Workload stays (Kueue still counts them) until they end."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await running_in_queue(h)
        h.body["status"] = copy.deepcopy(h.status())
        h.body["metadata"]["labels"] = {}
        await step(h)
        assert len(h.kube.pods()) == 2 and reserved(h)
        h.body["spec"]["runPolicy"] = {"suspend": True}
        await step(h)
        await step(h)
        assert not h.kube.pods() and not kueue_workloads(h.kube)
    run(scenario)


def test_a_job_that_left_its_queue_still_gives_way_to_a_kueue_eviction() -> None:
    """Without the policy (or suspended, unlabelled and resumed under it), a running job without
    its label is evicted by Kueue: its pods go (after the checkpoint hold) and the Workload's quota
    goes back; before, the eviction was ignored and the preemptor waited until the job ended
    (the review of issue 43: `end: phase Running pods 2 reserved [...]`)."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2, checkpointGraceSeconds=GRACE))
        workload = await running_in_queue(h)
        h.body["status"] = copy.deepcopy(h.status())
        h.body["metadata"]["labels"] = {}
        await step(h)
        kueue_says(workload, ("Evicted", "Preempted"))
        h.clock.advance(GRACE + 1)
        for _ in range(3):
            h.body["status"] = copy.deepcopy(h.status())
            await step(h)
        assert not reserved(h), "the preemptor gets the quota"
        assert not kueue_workloads(h.kube), "and the Workload of a job that left its queue is deleted"
        h.body["status"] = copy.deepcopy(h.status())
        await step(h)
        assert h.status()["phase"] in ("Pending", "Running"), h.status()
    run(scenario)


def test_a_queued_job_waits_while_the_workloads_have_not_listed() -> None:
    """Issue 45's review: reconciled before its Workload was known (a restarted operator, or the
    Workload list refused), an admitted job read as one whose Workload is gone, and its running
    pods were stopped. It waits now, and only it: a job outside any queue goes on."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await running_in_queue(h)
        pods = {p["metadata"]["name"] for p in h.kube.pods()}
        h.watch(**RUNNING)
        h.controller.bind(h.jobs, {KEY: h.pods}, {}, workloads_listed=lambda: False)
        assert await h.reconcile() == WORKLOADS_UNLISTED_RETRY
        assert {p["metadata"]["name"] for p in h.kube.pods()} == pods, "no pod stopped"
        h.controller.bind(workloads_listed=lambda: True)
        await step(h)
        assert {p["metadata"]["name"] for p in h.kube.pods()} == pods and h.status()["phase"] == "Running"

        free = Harness(mwms_job("free", workers=1))
        free.controller.bind(workloads_listed=lambda: False)
        await free.reconcile()
        assert len(free.kube.pods()) == 1, "a job outside any queue doesn't wait on Kueue's API"
    run(scenario)
