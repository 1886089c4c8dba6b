"""Elastic MPI jobs (spec.mpi.elastic) on the pure reconcile: scale up and down, discovery, a lost
worker replaced alone, too long short of minReplicas, Kueue's partial admission, the gang size."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from test_reconcile import KEYS, NOW, pod

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import SpecError, parse_spec
from disttrain.api.spec import Gang
from disttrain.builders import gang
from disttrain.builders.mpi import DISCOVER_HOSTS
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan
from disttrain.decide.queueing import QueueState, observe_workload, pod_sets, podsets_hash
from disttrain.decide.reconcile import reconcile
from manifests import mpi_job

RUNNING = {"phase": "Running", "startTime": "2026-11-22T11:00:00Z"}


def elastic_job(workers: int = 2, low: int = 1, high: int = 3, **run_policy: Any) -> dict[str, Any]:
    job = mpi_job("mnist", workers=workers, gpus=0, **run_policy)
    job["spec"]["mpi"]["elastic"] = {"minReplicas": low, "maxReplicas": high}
    return job


def step(job: dict[str, Any], pods: list[ObservedPod], status: dict[str, Any] | None = None,
         now: datetime.datetime = NOW, queue: QueueState | None = None) -> Plan:
    state = JobState(JobRef("mnist", "ml", "uid-1"), 1, parse_spec(job["spec"]), dict(status or {}), queue=queue)
    return reconcile(state, pods, now, KEYS)


def launcher(phase: str = "Running") -> ObservedPod:
    return dataclasses.replace(pod("launcher", 0, phase), name="mnist-launcher")


def running(workers: int) -> list[ObservedPod]:
    return [launcher(), *(pod("worker", i) for i in range(workers))]


def discovery(plan: Plan) -> str:
    config = next(o for o in plan.keep_current if o["kind"] == "ConfigMap")
    return str(config["data"][DISCOVER_HOSTS])


def created(plan: Plan) -> list[str]:
    return [o["metadata"]["name"] for o in plan.create if o["kind"] == "Pod"]


def later(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def test_bounds_are_checked_where_no_api_server_did() -> None:
    with pytest.raises(SpecError, match=r"spec.mpi.elastic: needs 1 <= minReplicas \(3\) <= worker.replicas \(2\)"):
        parse_spec(elastic_job(2, low=3, high=4)["spec"])


def test_scale_up_creates_the_new_worker_and_discovery_lists_it_once_ready() -> None:
    plan = step(elastic_job(3), running(2), RUNNING)
    assert created(plan) == ["mnist-worker-2"]
    assert plan.status["phase"] == "Running", "a worker being added doesn't stop the training"
    assert plan.status["operatorRestarts"] == 0
    assert "mnist-worker-2" not in discovery(plan)
    assert plan.status["elastic"]["wantedWorkers"] == 3 and plan.status["elastic"]["workers"] == 2
    pending = [*running(2), pod("worker", 2, "Pending")]
    assert "mnist-worker-2" not in discovery(step(elastic_job(3), pending, plan.status))
    ready = step(elastic_job(3), running(3), plan.status)
    assert discovery(ready).count("echo ") == 3 and "mnist-worker-2.mnist.ml.svc:1" in discovery(ready)
    assert ready.status["elastic"]["hosts"] == ["mnist-worker-0", "mnist-worker-1", "mnist-worker-2"]


def test_a_new_wanted_count_is_an_event() -> None:
    plan = step(elastic_job(3), running(2), {**RUNNING, "elastic": {"wantedWorkers": 2}})
    assert [e.message for e in plan.events if e.reason == "WorkersScaled"] == [
        "workers wanted: 2 -> 3 (spec.mpi.worker.replicas 3, spec.mpi.elastic 1..3)"]


def test_scale_down_leaves_discovery_at_once_and_deletes_after_the_delay() -> None:
    first = step(elastic_job(1), running(3), RUNNING)
    assert discovery(first).count("echo ") == 1, "workers 1 and 2 left discovery"
    assert not first.delete, "Horovod must first drop them"
    assert first.status["elastic"]["scaleDownSince"] == "2026-11-22T12:00:00Z"
    assert first.requeue_after == pytest.approx(30)
    # An operator restarted in between resumes the wait from the status, not from its own start.
    second = step(elastic_job(1), running(3), first.status, later(20))
    assert not second.delete and second.requeue_after == pytest.approx(10)
    due = step(elastic_job(1), running(3), second.status, later(30))
    assert sorted(p.name for p in due.delete) == ["mnist-worker-1", "mnist-worker-2"]
    assert due.status["operatorRestarts"] == 0, "scaling down is not a restart"
    assert "scaleDownSince" not in due.status["elastic"]
    assert due.status["phase"] == "Running"


def test_a_worker_scaled_away_that_failed_meanwhile_is_deleted_uncounted() -> None:
    pods = [*running(1), pod("worker", 1, "Failed", exit_code=1)]
    plan = step(elastic_job(1), pods, RUNNING)
    assert [p.name for p in plan.delete] == ["mnist-worker-1"]
    assert plan.status["phase"] == "Running" and plan.status["operatorRestarts"] == 0


def test_a_killed_worker_is_replaced_alone_and_counted() -> None:
    pods = [*running(1), pod("worker", 1, "Failed", exit_code=137), pod("worker", 2)]
    plan = step(elastic_job(3), pods, RUNNING)
    assert [p.name for p in plan.delete] == ["mnist-worker-1"], "the launcher and the other workers stay"
    assert plan.status["phase"] == "Running"
    assert plan.status["reason"] == "PodFailed"
    assert plan.status["operatorRestarts"] == 1
    assert "restarting the pod (restart 1 of 3)" in plan.status["message"]
    gone = [launcher(), pod("worker", 0), pod("worker", 2)]
    again = step(elastic_job(3), gone, plan.status)
    assert created(again) == ["mnist-worker-1"]
    assert again.status["operatorRestarts"] == 1, "made again, not counted twice"


def test_a_worker_deleted_from_under_it_is_made_again_uncounted() -> None:
    plan = step(elastic_job(3), [launcher(), pod("worker", 0), pod("worker", 2)], RUNNING)
    assert created(plan) == ["mnist-worker-1"]
    assert plan.status["operatorRestarts"] == 0 and plan.status["phase"] == "Running"


def test_a_workers_own_exit_code_still_fails_the_job() -> None:
    pods = [*running(1), pod("worker", 1, "Failed", exit_code=1)]
    plan = step(elastic_job(2), pods, RUNNING)
    assert plan.status["phase"] == "Failed"
    assert "worker 1 (pod mnist-worker-1) exited with code 1" in plan.status["message"]


def test_short_of_min_replicas_past_the_grace_restarts_the_whole_job() -> None:
    job = elastic_job(3, low=2)
    short = [launcher(), pod("worker", 0), pod("worker", 1, "Pending"), pod("worker", 2, "Pending")]
    first = step(job, short, RUNNING)
    assert first.status["elastic"]["belowMinSince"] == "2026-11-22T12:00:00Z"
    assert first.status["phase"] == "Running" and first.requeue_after == pytest.approx(120)
    assert not first.delete
    due = step(job, short, first.status, later(120))
    assert due.status["phase"] == "Restarting"
    assert due.status["reason"] == "BelowMinReplicas"
    assert due.status["message"] == ("only 1 of spec.mpi.elastic.minReplicas 2 workers Ready for more than "
                                     "belowMinGraceSeconds (120 s); restarting the whole job (restart 1 of 3)")
    assert sorted(p.name for p in due.delete) == sorted(p.name for p in short)
    back = step(job, running(3), first.status, later(60))
    assert "belowMinSince" not in back.status["elastic"], "back above the minimum: the wait is over"


def test_the_gang_is_the_fewest_workers() -> None:
    spec = parse_spec(elastic_job(3, low=2)["spec"])
    assert gang.min_available(spec, Gang()) == 2
    immediately = elastic_job(3, low=2)
    immediately["spec"]["mpi"]["launcherStart"] = "Immediately"
    assert gang.min_available(parse_spec(immediately["spec"]), Gang()) == 3


def test_kueue_asks_for_the_workers_with_min_replicas_as_its_minimum_and_caps_at_what_it_admitted() -> None:
    spec = parse_spec(elastic_job(3, low=1)["spec"])
    sets = {s["name"]: s for s in pod_sets(spec)}
    assert sets["worker"]["count"] == 3 and sets["worker"]["minCount"] == 1
    assert "minCount" not in sets["launcher"]
    workload = observe_workload({
        "metadata": {"name": "w", "uid": "wl", "ownerReferences": [{"uid": "uid-1", "controller": True}]},
        "spec": {"active": True},
        "status": {"conditions": [{"type": "Admitted", "status": "True"}, {"type": "QuotaReserved", "status": "True"}],
                   "admission": {"clusterQueue": "cq", "podSetAssignments": [
                       {"name": "launcher", "count": 1, "flavors": {}},
                       {"name": "worker", "count": 2, "flavors": {}}]}},
    })
    assert workload.admitted_counts == {"launcher": 1, "worker": 2}
    plan = step(elastic_job(3), running(2), RUNNING, queue=QueueState("q", workload))
    assert not created(plan), "a third worker is beyond what Kueue admitted"
    assert plan.status["elastic"]["wantedWorkers"] == 2


def admitted_workload(workers: int, rv: str = "9") -> Any:
    return observe_workload({
        "metadata": {"name": "w", "uid": "wl", "resourceVersion": rv,
                     "ownerReferences": [{"uid": "uid-1", "controller": True}]},
        "spec": {"active": True, "queueName": "q", "podSets": [{"name": "launcher", "count": 1},
                                                               {"name": "worker", "count": workers}]},
        "status": {"conditions": [{"type": "Admitted", "status": "True"}, {"type": "QuotaReserved", "status": "True"}],
                   "admission": {"clusterQueue": "cq", "podSetAssignments": [
                       {"name": "launcher", "count": 1, "flavors": {}},
                       {"name": "worker", "count": workers, "flavors": {}}]}},
    })


def test_an_admitted_job_scaled_down_gives_the_quota_of_its_leaving_workers_back() -> None:
    """Issue 31: a scaled-down elastic job kept the quota of all the workers it was admitted with
    until it ended. Once the leaving workers are gone, its Workload's worker count is lowered in
    place (Kueue KEP-77: its webhook allows a smaller count on an admitted Workload), and the job
    never grows past what it then holds."""
    workload = admitted_workload(3)
    while_leaving = step(elastic_job(1), running(3), RUNNING, queue=QueueState("q", workload))
    assert not [op for op in while_leaving.workload if op.verb == "json-patch"], "not while worker-2 is still there"
    gone = step(elastic_job(1), running(1), RUNNING, queue=QueueState("q", workload))
    assert [(op.verb, op.body) for op in gone.workload if op.verb == "json-patch"] == [("json-patch", {"patch": [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "9"},
        {"op": "test", "path": "/spec/podSets/1/name", "value": "worker"},
        {"op": "replace", "path": "/spec/podSets/1/count", "value": 1},
        {"op": "replace", "path": "/metadata/annotations/disttrain.dev~1podsets-hash",
         "value": podsets_hash(pod_sets(parse_spec(elastic_job(1)["spec"])))}]})]
    shrunk = dataclasses.replace(admitted_workload(3), podset_counts=(("launcher", 1), ("worker", 1)))
    again = step(elastic_job(3), running(1), RUNNING, queue=QueueState("q", shrunk))
    assert not created(again), "scaled up again: no worker past the quota it holds now"
    assert not [op for op in again.workload if op.verb == "json-patch"]


def test_each_leaving_worker_waits_its_own_delay() -> None:
    """Issue 31: successive scale-downs shared the first one's timer: 3 -> 2 at T and 2 -> 1 at
    T+25 s deleted worker-1 at T+30 s, five seconds after it left discovery."""
    first = step(elastic_job(2), running(3), RUNNING)
    assert first.status["elastic"]["leaving"] == {"mnist-worker-2": "2026-11-22T12:00:00Z"}
    second = step(elastic_job(1), running(3), first.status, later(25))
    assert second.status["elastic"]["leaving"] == {"mnist-worker-2": "2026-11-22T12:00:00Z",
                                                   "mnist-worker-1": "2026-11-22T12:00:25Z"}
    at_30 = step(elastic_job(1), running(3), second.status, later(30))
    assert [p.name for p in at_30.delete] == ["mnist-worker-2"], "worker-1 has 25 s of its delay left"
    assert at_30.requeue_after == pytest.approx(25)
    at_55 = step(elastic_job(1), running(2), at_30.status, later(55))
    assert [p.name for p in at_55.delete] == ["mnist-worker-1"]


def test_a_shrink_kueue_refuses_is_left_alone_and_holds_nothing_up() -> None:
    """With Kueue's ElasticJobsViaWorkloadSlices off its webhook refuses a lower count (403): the
    Workload keeps its quota as before, said once, and the job's pass goes on (the review of issue 31
    found the refusal raised out of every pass, before the job's creates)."""
    import asyncio

    from fakes import FakeClock, FakeKube

    from disttrain.apiserver.rest import ApiError
    from disttrain.control.queues import Queues
    from disttrain.decide.plan import WorkloadOp

    class Refusing(FakeKube):
        async def json_patch(self, obj: Any, operations: Any) -> None:
            self.calls.append(("json-patch", obj["metadata"]["name"]))
            raise ApiError(403, "Forbidden", b'{"message": "admission webhook denied: field is immutable"}')

    kube = Refusing()
    queues = Queues(kube, FakeClock())
    op = WorkloadOp("json-patch", "w", {"patch": []}, uid="wl")
    for _ in range(3):
        asyncio.run(queues.write(JobRef("mnist", "ml", "uid-1"), [op]))
    assert kube.calls.count(("json-patch", "w")) == 1, "asked once, not again every pass"


def test_each_workload_condition_is_applied_by_its_own_field_manager() -> None:
    """An apply drops what its field manager applied before and omits now: one manager applying
    Finished after PodsReady left PodsReady with its type alone, which the API server refused (422)."""
    import asyncio

    from fakes import FakeClock, FakeKube

    from disttrain.control.queues import Queues
    from disttrain.decide.plan import WorkloadOp

    class Managers(FakeKube):
        managers: list[str] = []

        async def patch(self, obj: Any, body: Any, *, status: bool = False, apply: bool = False,
                        manager: str = "") -> None:
            self.managers.append(manager)

    kube = Managers()
    condition = {"type": "PodsReady", "status": "True", "reason": "PodsReady", "message": "m",
                 "lastTransitionTime": "2026-11-26T00:00:00Z"}
    ops = [WorkloadOp("condition", "w", condition), WorkloadOp("condition", "w", {**condition, "type": "Finished"})]
    asyncio.run(Queues(kube, FakeClock()).write(JobRef("mnist", "ml", "uid-1"), ops))
    assert kube.managers == ["disttrain-operator-podsready", "disttrain-operator-finished"]
