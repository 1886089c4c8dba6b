"""The controller on an in-memory Kube and a hand-moved clock: expectations cover the watch's lag,
and every child is trusted only when its controller reference carries the job's UID."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from fakes import FakeClock, FakeKube

from disttrain.api.observed import ObservedPod
from disttrain.control.controller import Controller
from disttrain.control.expectations import CREATE_EXPECTATION_SECONDS
from manifests import mpi_job, mwms_job

KEY = ("ml", "mnist")
RUNNING = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
OOM = {"phase": "Failed", "containerStatuses": [{"name": "c", "restartCount": 0, "state": {
    "terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}


class Harness:
    """One job in the operator's indexes; `watch` plays the watch events the fake API's state
    would cause (pods as they are now, the last status written)."""

    def __init__(self, manifest: dict[str, Any], uid: str = "uid-1") -> None:
        self.kube, self.clock = FakeKube(), FakeClock()
        self.controller = Controller(self.kube, clock=self.clock)
        self.body: dict[str, Any] = {
            "metadata": {"name": "mnist", "namespace": "ml", "uid": uid, "generation": 1, "resourceVersion": "1"},
            "spec": manifest["spec"], "status": {}}
        self.jobs = {KEY: [self.body]}
        self.pods: list[ObservedPod] = []
        self.controller.bind(self.jobs, {KEY: self.pods})

    async def reconcile(self) -> float | None:
        return await self.controller.reconcile_key(KEY)

    def watch(self, **pod_status: Any) -> None:
        self.pods[:] = self.kube.observed(**pod_status)
        if self.kube.statuses:
            self.body["status"] = copy.deepcopy(self.kube.statuses[-1])

    def status(self) -> dict[str, Any]:
        return self.kube.statuses[-1]

    def controller_ref(self) -> Any:
        from disttrain.api.objects import JobRef

        return JobRef("mnist", "ml", self.body["metadata"]["uid"])

    async def run(self) -> None:
        """The job's pods made and Running, and the job's status saying so."""
        await self.reconcile()
        self.watch(**RUNNING)
        await self.reconcile()
        assert self.status()["phase"] == "Running"

    async def run_then_kill(self) -> None:
        """The job's pods made and Running, then every one OOM-killed: the next pass restarts it."""
        await self.run()
        self.watch(**OOM)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def owned_by(kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "disttrain.dev/v1", "kind": kind, "name": name, "uid": uid, "controller": True}]


def test_created_pods_are_not_created_again_before_the_watch_shows_them() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.reconcile()
        assert sorted(h.kube.writes("create")) == ["Pod/ml/mnist-worker-0", "Pod/ml/mnist-worker-1", "Service/ml/mnist"]
        h.kube.calls.clear()
        await h.reconcile()  # the watch has shown nothing yet
        assert not h.kube.writes("create")
        h.clock.advance(CREATE_EXPECTATION_SECONDS + 1)
        await h.reconcile()  # unseen for too long: looked for again, found to be ours
        assert sorted(h.kube.writes("create")) == ["Pod/ml/mnist-worker-0", "Pod/ml/mnist-worker-1"]
        assert len(h.kube.pods()) == 2
        assert h.status()["phase"] == "Pending"
    run(scenario)


def test_a_deleted_pod_counts_as_terminating_until_its_deletion_shows() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run()
        failed = {"phase": "Failed", "containerStatuses": [{"name": "c", "restartCount": 0, "state": {
            "terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
        h.watch(**failed)
        await h.reconcile()
        assert h.status()["phase"] == "Restarting" and h.status()["restarts"] == 1
        assert len(h.kube.writes("delete")) == 2
        deletes, statuses = len(h.kube.writes("delete")), len(h.kube.statuses)
        h.body["status"] = copy.deepcopy(h.status())  # the job's watch event came, the pods' not yet
        await h.reconcile()
        assert len(h.kube.writes("delete")) == deletes, "the same failure handled twice"
        assert len(h.kube.statuses) == statuses, "nothing changed: nothing written"
    run(scenario)


def test_a_stale_status_write_is_retried_not_forced() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run_then_kill()
        h.kube.conflicts = 1
        assert await h.reconcile() == 1.0
        assert not h.kube.writes("delete"), "nothing acted on from a stale read"
    run(scenario)


def test_a_new_jobs_first_status_is_written_once_its_pods_are_made() -> None:
    """Create, then status (as Kubernetes' Job controller): the first pass writes nothing before
    its creates, and the next writes Pending with Created and the pods counted, in one write."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        assert await h.reconcile() == 0, "looked at again at once, to say what it made"
        assert len(h.kube.writes("create")) == 3 and not h.kube.statuses
        await h.reconcile()  # the watch has shown nothing yet: the pods are expected
        assert len(h.kube.statuses) == 1
        status = h.status()
        assert status["phase"] == "Pending" and status["replicaStatuses"]["worker"]["active"] == 2
        assert [c["type"] for c in status["conditions"] if c["status"] == "True"] == ["Created"]
        h.watch(**RUNNING)
        await h.reconcile()
        assert [s["phase"] for s in h.kube.statuses] == ["Pending", "Running"]
    run(scenario)


def test_a_pod_name_held_by_something_else_fails_the_job_naming_it() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.kube.add({"kind": "Pod", "metadata": {"name": "mnist-worker-1", "namespace": "ml"}})
        assert await h.reconcile() is None
        status = h.status()
        assert (status["phase"], status["reason"]) == ("Failed", "ObjectNotOwned")
        assert status["message"].startswith("Pod ml/mnist-worker-1 already exists and is not controlled by")
        assert h.kube.events[-1][:2] == ("Warning", "ObjectNotOwned")
    run(scenario)


def test_objects_of_an_earlier_job_of_the_same_name_are_waited_out() -> None:
    async def scenario() -> None:
        h = Harness(mpi_job("mnist", workers=2))
        for kind, name in (("Service", "mnist"), ("Secret", "mnist-ssh-uid-old")):
            h.kube.add({"kind": kind, "metadata": {"name": name, "namespace": "ml",
                                                   "ownerReferences": owned_by("DistTrainJob", "mnist", "uid-old")}})
        requeue = await h.reconcile()
        assert requeue is not None and requeue <= 1.0
        assert not [w for w in h.kube.writes("create") if w.startswith("Pod/")], "no pod before its Service is ours"
        await h.reconcile()  # a new job's first status waits one pass for its creates (status_writes)
        assert h.status()["phase"] == "Pending"
        del h.kube.objects[("Service", "ml", "mnist")]  # garbage collection gets to it
        await h.reconcile()
        assert {w for w in h.kube.writes("create") if w.startswith("Pod/")} == {"Pod/ml/mnist-worker-0",
                                                                                 "Pod/ml/mnist-worker-1"}, \
            "the earlier job's Secret is named for its uid: it holds up nothing"
        secret = h.kube.objects[("Secret", "ml", "mnist-ssh-uid-1")]
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert h.status()["sshSecret"] == "mnist-ssh-uid-1"
    run(scenario)


@pytest.mark.parametrize(("kind", "name"), [("Service", "mnist"), ("ConfigMap", "mnist-mpi")])
def test_an_object_of_someone_else_fails_the_job_naming_it(kind: str, name: str) -> None:
    async def scenario() -> None:
        h = Harness(mpi_job("mnist", workers=2))
        h.kube.add({"kind": kind, "metadata": {"name": name, "namespace": "ml"}})
        await h.reconcile()
        assert (h.status()["phase"], h.status()["reason"]) == ("Failed", "ObjectNotOwned")
        assert f"{kind} ml/{name} already exists" in h.status()["message"]
        assert h.kube.events[-1][:2] == ("Warning", "ObjectNotOwned")
        assert not h.kube.pods()
    run(scenario)


def test_a_pod_create_refused_by_an_earlier_jobs_pod_waits_for_it() -> None:
    """The watch hasn't shown the earlier job's pod yet: the create's 409 is the first sign of it.
    It is neither this job's pod nor a failure: the job waits for garbage collection."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.kube.add({"kind": "Pod", "metadata": {"name": "mnist-worker-1", "namespace": "ml",
                                                "ownerReferences": owned_by("DistTrainJob", "mnist", "uid-old")}})
        await h.reconcile()
        await h.reconcile()  # a new job's first status waits one pass for its creates (status_writes)
        assert h.status()["phase"] == "Pending" and h.status().get("reason") != "ObjectNotOwned"
        old = h.kube.objects[("Pod", "ml", "mnist-worker-1")]
        assert old["metadata"]["ownerReferences"][0]["uid"] == "uid-old", "the earlier job's pod is left alone"
        h.watch()  # the earlier job's pod shows in the index
        await h.reconcile()
        assert h.status()["reason"] == "WaitingForPreviousJob", h.status()
        assert h.status().get("restarts", 0) == 0
        del h.kube.objects[("Pod", "ml", "mnist-worker-1")]  # garbage collection gets to it
        h.watch()
        await h.reconcile()
        mine = h.kube.objects[("Pod", "ml", "mnist-worker-1")]
        assert mine["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    run(scenario)


def test_an_invalid_template_fails_the_job_and_keeps_the_status() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.kube.invalid["mnist-worker-0"] = 'Pod "mnist-worker-0" is invalid: spec.containers[0].name: bad'
        await h.reconcile()
        status = h.status()
        assert status["reason"] == "InvalidPodTemplate"
        assert status["message"].startswith("spec.tensorflow.worker.template: Pod")
        assert status["startTime"] and status["replicaStatuses"]
    run(scenario)


def test_mpi_keys_are_made_once_per_job() -> None:
    async def scenario() -> None:
        h = Harness(mpi_job("mnist", workers=1))
        await h.reconcile()
        keys = h.controller.ssh_keys["uid-1"]
        await h.reconcile()
        assert h.controller.ssh_keys["uid-1"] is keys
        h.jobs[KEY][0]["metadata"]["uid"] = "uid-2"  # deleted and applied again
        await h.reconcile()
        assert "uid-1" not in h.controller.ssh_keys and h.controller.ssh_keys["uid-2"] != keys
    run(scenario)


def test_a_job_deleted_from_the_index_is_forgotten() -> None:
    async def scenario() -> None:
        h = Harness(mpi_job("mnist", workers=1))
        await h.reconcile()
        h.jobs[KEY].clear()
        await h.reconcile()
        assert not h.controller.ssh_keys and not h.controller.children.supported
        assert KEY not in h.controller.expectations
    run(scenario)


# -- issue 21: the failure machinery ------------------------------------------------------------

class ServerError(Exception):
    """What a delete answered with 429 or 500, or one that timed out, raises."""


def test_a_pod_delete_that_fails_is_retried() -> None:
    """Defect 1: the uid was recorded as deleted before the call and never taken back, so a
    delete answered 500 left the pod 'terminating' in our eyes forever: the restart waited on it."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run_then_kill()
        h.kube.delete_failures = [ServerError("500"), ServerError("429")]
        with pytest.raises(ServerError):
            await h.reconcile()  # the work queue retries it with backoff
        assert h.status()["phase"] == "Restarting" and len(h.kube.pods()) == 2
        h.watch(**OOM)
        await h.reconcile()
        assert not h.kube.pods(), "the failed deletes made again"
        assert h.status()["restarts"] == 1, "and the failure counted once"
    run(scenario)


def test_a_pass_the_api_server_failed_is_told_in_one_event_per_new_message() -> None:
    """The rest of defect 4's class: a delete answered 429 or 500 was retried with a traceback in
    the log and nothing on the job. Now the work queue hands the failure, explained, to the
    controller: a Warning event in the API server's words, once per new message (again after 5
    minutes); none when the API server could not be reached (nothing would take the event)."""
    from disttrain.apiserver.retries import Explained

    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run()
        throttled = Explained("throttled (429): Too many requests, please try again later.", 1.0)
        for _ in range(3):
            await h.controller._retrying(KEY, throttled)
        await h.controller._retrying(KEY, Explained("server error (500): etcdserver: leader changed"))
        await h.controller._retrying(KEY, Explained("ClientConnectorError: refused", tell_the_job=False))
        h.clock.advance(301)
        await h.controller._retrying(KEY, throttled)
        said = [(reason, message) for kind, reason, message in h.kube.events if reason == "APIRequestRetried"]
        assert said == [
            ("APIRequestRetried", "throttled (429): Too many requests, please try again later.; retrying with backoff"),
            ("APIRequestRetried", "server error (500): etcdserver: leader changed; retrying with backoff"),
            ("APIRequestRetried", "throttled (429): Too many requests, please try again later.; retrying with backoff"),
        ]
    run(scenario)


def test_a_delete_whose_effect_never_shows_is_made_again() -> None:
    """Defect 1, second half: delete expectations expire as create ones do."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run_then_kill()
        h.kube.lost_deletes = 2  # answered 200, and nothing happened (a webhook, a lost write)
        await h.reconcile()
        assert len(h.kube.pods()) == 2
        h.watch(**OOM)
        await h.reconcile()
        assert len(h.kube.writes("delete")) == 2, "still within the expectation"
        h.clock.advance(CREATE_EXPECTATION_SECONDS + 1)
        await h.reconcile()
        assert not h.kube.pods(), "expired: deleted again"
    run(scenario)


def test_a_pod_created_but_not_yet_seen_does_not_survive_a_whole_job_restart() -> None:
    """Defect 2: an unseen pod had uid "", its delete (uid precondition "") was refused with 409
    and swallowed, and the old attempt's worker joined the new one."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.reconcile()
        stale = h.kube.objects[("Pod", "ml", "mnist-worker-1")]["metadata"]["uid"]
        h.pods[:] = [p for p in h.kube.observed(**OOM) if p.name == "mnist-worker-0"]  # worker-1 unseen
        await h.reconcile()
        assert h.status()["phase"] == "Restarting"
        assert all(p["metadata"]["uid"] != stale for p in h.kube.pods()), "the unseen worker deleted by its uid"
    run(scenario)


def test_a_finished_job_is_never_failed_again() -> None:
    """Defect 14: `_fail` wrote without looking at the phase or the resourceVersion, so a pass that
    found the spec invalid flipped a Succeeded job to Failed and restarted its TTL clock."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.body["status"] = {"phase": "Succeeded", "completionTime": "2026-11-22T11:00:00Z"}
        h.body["spec"] = {"tensorflow": {}}  # no replica: only the operator can tell
        await h.reconcile()
        assert not h.kube.statuses, "a Succeeded job stays Succeeded"
    run(scenario)


def test_failing_a_job_keeps_its_completion_time_and_checks_its_version() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.body["spec"] = {"tensorflow": {}}
        h.body["metadata"]["resourceVersion"] = "7"
        await h.reconcile()
        assert h.status()["phase"] == "Failed" and h.kube.status_versions[-1] == "7", "over the version it read"
        first = h.status()["completionTime"]
        h.watch()
        h.kube.conflicts = 1  # the job changed meanwhile: refused, and looked at again
        h.clock.advance(60)
        assert await h.reconcile() is None
        assert h.status()["completionTime"] == first
    run(scenario)


def test_the_events_of_a_written_status_are_posted_even_when_the_pass_stops_early() -> None:
    """Defect 13: events were posted last, after the deletes, the Kueue write and the creates; a
    pass that stopped on the way (an exception, Kueue's Conflict) lost them for good."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run_then_kill()
        h.kube.delete_failures = [ServerError("500")]
        with pytest.raises(ServerError):
            await h.reconcile()
        assert h.status()["phase"] == "Restarting"
        assert ("Warning", "PodFailed") in [e[:2] for e in h.kube.events], h.kube.events
    run(scenario)


def test_an_optional_read_that_fails_does_not_block_the_passs_other_decisions() -> None:
    """Defect 15: the Volcano group's read (or a ResourceFlavor's) raising aborted the whole pass:
    no deadline, no suspension, no failure handled while it failed. Now the pass goes on without
    it (the pods wait for the group as if it were not admitted yet)."""
    from test_gang import with_gang

    async def scenario() -> None:
        h = Harness(with_gang(mwms_job("mnist", workers=2, activeDeadlineSeconds=60), provider="Volcano"))
        h.body["status"] = {"phase": "Pending", "gang": {"provider": "Volcano"}, "startTime": "2026-11-22T11:58:00Z"}
        h.kube.get_failures["PodGroup"] = ServerError("500")
        with pytest.raises(ServerError):  # releasing the group reads it too: that write is retried with backoff
            await h.reconcile()
        assert h.kube.statuses, "the pass decided and wrote before that"
        assert (h.status()["phase"], h.status()["reason"]) == ("Failed", "DeadlineExceeded")
    run(scenario)


def test_a_flavor_that_cant_be_read_holds_the_pods_not_the_pass() -> None:
    """Defect 15: a ResourceFlavor read that failed raised out of the pass. Pods can't be made
    without the flavor's node labels, so they wait; the pass's other decisions go on."""
    from test_queueing import ADMITTED, workload

    from disttrain.decide.queueing import QUEUE_LABEL

    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.body["metadata"]["labels"] = {QUEUE_LABEL: "team-gpu"}
        wl = dataclasses.replace(workload(*ADMITTED), assignments={"worker": {"nvidia.com/gpu": "a100"}})
        h.controller.bind(h.jobs, {KEY: h.pods}, {KEY: [wl]})
        h.kube.get_failures["ResourceFlavor"] = ServerError("500")
        wait = await h.reconcile()
        assert wait is not None and 0 < wait <= 10, "looked at again soon"
        assert not [w for w in h.kube.writes("create") if w.startswith("Pod/")], "no pod without its flavor"
    run(scenario)


def test_a_pod_deleted_while_the_watch_was_away_is_purged_by_a_resync() -> None:
    """Issue 21, defect 10: after a watch re-list (410 Gone: an API server restart) kopf removes an
    index entry only on a DELETED event it saw, so a pod deleted in the gap stayed "Running" in the
    index forever. A resync lists each namespace's pods; a pod indexed before the list began and
    absent from it is gone (a tombstone, as client-go's DeletedFinalStateUnknown)."""
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run()
        h.body["status"] = copy.deepcopy(h.status())  # the job's own watch event came
        gone = h.kube.objects.pop(("Pod", "ml", "mnist-worker-1"))  # deleted; its DELETED event missed
        assert await h.controller.resync() == {KEY}, "the job whose pod vanished is looked at again"
        await h.reconcile()
        assert (h.status()["phase"], h.status()["reason"]) == ("Restarting", "PodDeleted"), h.status()
        assert gone["metadata"]["uid"] not in {p.uid for p in h.controller._observed_pods(KEY, h.controller_ref())}
    run(scenario)


@pytest.mark.parametrize(("phase", "reason", "message"), [
    ("Running", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"),
    # The pod garbage collector marks an orphan Failed as it adds the condition, then deletes it
    # (`make chaos`, a node deleted: one job of two restarted, PodDeleted, before this case).
    ("Failed", "DeletionByPodGC", "PodGC: node no longer exists")])
def test_a_disrupted_pod_is_judged_the_same_when_its_deletion_arrives_first(phase: str, reason: str,
                                                                            message: str) -> None:
    """Defect 3, second half: a pod the taint manager evicts carries DisruptionTarget, and a pass
    that saw it judged it failed (restartPolicy Never fails the job). When the DELETED event came
    first the pod was simply gone: a retryable PodDeleted. The DELETED event's final state now
    says the same as the update it overtook."""
    from disttrain.api.observed import observe_pod
    from manifests import replica, tf_job

    async def scenario() -> None:
        h = Harness(tf_job("mnist", None, worker=replica(2, "Never")))
        await h.run()
        h.body["status"] = copy.deepcopy(h.status())
        final = copy.deepcopy(h.kube.objects.pop(("Pod", "ml", "mnist-worker-1")))
        final["metadata"]["deletionTimestamp"] = "2026-11-22T12:00:05Z"
        final["status"] = {"phase": phase, "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}]}
        h.pods[:] = [p for p in h.pods if p.name != "mnist-worker-1"]  # the watch dropped it
        h.controller.tombstones.pod_deleted(KEY, observe_pod(final))
        await h.reconcile()
        assert (h.status()["phase"], h.status()["reason"]) == ("Failed", "ReplicaFailed"), h.status()
        assert reason in h.status()["message"]
    run(scenario)


def test_who_reports_is_read_off_the_indexed_job_and_its_uid() -> None:
    """The progress desk asks Controller.role_of (issue 31: every endpoint test stubbed it, so its
    owner-uid check had no test): a job's worker 0 reports its training, worker 1 nothing, and a
    pod of an earlier job under the same name (another uid) nothing at all."""
    from disttrain.api.objects import PodKey
    from disttrain.api.progress import Role
    from manifests import mwms_job

    h = Harness(mwms_job("mnist", workers=2))

    def pod(index: int, owner: str = "uid-1") -> ObservedPod:
        return ObservedPod.expected(f"mnist-worker-{index}", PodKey("worker", index), owner, f"p{index}")

    assert h.controller.role_of(KEY, pod(0)) is Role.TRAINING
    assert h.controller.role_of(KEY, pod(1)) is None
    assert h.controller.role_of(KEY, pod(0, owner="uid-of-an-earlier-job")) is None
    assert h.controller.role_of(("ml", "gone"), pod(0)) is None


def test_the_ssh_secret_is_never_read_and_an_earlier_operators_name_is_kept() -> None:
    """Issue 31: the chart granted `get` on every Secret for an ownership read. The Secret is named
    for the job's uid, so one found there is the job's own (made before a restart) and is not read;
    a job an earlier operator started keeps `<job>-ssh`, which its running pods mount."""
    async def scenario() -> None:
        h = Harness(mpi_job("mnist", workers=2))
        h.kube.add({"kind": "Secret", "metadata": {"name": "mnist-ssh-uid-1", "namespace": "ml"}})
        await h.reconcile()
        assert not [c for c in h.kube.calls if c[0] == "get" and c[1].startswith("Secret/")], "no read of a Secret"
        assert {p["metadata"]["name"] for p in h.kube.pods()} == {"mnist-worker-0", "mnist-worker-1"}
        legacy = Harness(mpi_job("mnist", workers=1), uid="uid-2")
        legacy.body["status"] = {"phase": "Pending", "startTime": "2026-11-20T00:00:00Z"}
        await legacy.reconcile()
        pod = next(p for p in legacy.kube.pods() if p["metadata"]["name"] == "mnist-worker-0")
        assert {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v} == {"mnist-ssh"}
        assert legacy.status()["sshSecret"] == "mnist-ssh"
    run(scenario)


def test_a_group_version_no_longer_served_makes_the_next_pass_read_what_is() -> None:
    """Issue 35, on a plane upgraded under the operator (tests/integration/test_plane_upgrade.py): the
    gang APIs served were cached for a minute, so a job restarted just after a 1.36 -> 1.37 upgrade
    made its group as v1alpha2 again and again (404) until the cache ran out. A create's 404 now
    forgets what was read: the next pass asks the cluster."""
    from disttrain.api.objects import JobRef
    from disttrain.control.children import Children
    from disttrain.control.expectations import Expectations
    from disttrain.control.groups import Groups
    from disttrain.decide.reasons import Reason

    async def scenario() -> None:
        kube, clock = FakeKube(), FakeClock()
        groups = Groups(kube, clock)
        assert "scheduling.k8s.io/v1alpha2" in await groups.served()
        kube.served = {"v1", "scheduling.k8s.io/v1beta1"}  # upgraded
        assert "scheduling.k8s.io/v1alpha2" in await groups.served(), "read a moment ago: kept"
        ref = JobRef(name="mnist", namespace="ml", uid="uid-1")
        workload = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "Workload",
                    "metadata": {"name": "mnist", "namespace": "ml"}}
        failed, _ = await Children(kube, groups, 4).create_all(Expectations(clock, ref.uid), ref, "tensorflow",
                                                               [workload])
        assert failed is not None and failed[0] is Reason.CREATE_REFUSED
        assert failed[1].startswith("Workload mnist can't be created: not found: scheduling.k8s.io/v1alpha2"), failed
        assert await groups.served() == frozenset({"scheduling.k8s.io/v1beta1"})
    asyncio.run(scenario())
