"""A pod create admission refuses (403: a quota, a missing PriorityClass): the job waits and says
why, tries again after a growing backoff, and never fails or loops (create_refusals.py)."""

from __future__ import annotations

from test_controller import RUNNING, Harness, run

from disttrain.decide.create_refusals import FIRST_BACKOFF_SECONDS
from manifests import mpi_job, mwms_job

NO_CLASS = 'pods "mnist-worker-1" is forbidden: no PriorityClass with name urgent was found'


def test_a_refused_pod_makes_the_job_wait_and_say_why_then_it_is_created() -> None:
    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        h.kube.refused["mnist-worker-1"] = NO_CLASS
        assert await h.reconcile() == FIRST_BACKOFF_SECONDS
        status = h.status()
        assert (status["phase"], status["reason"]) == ("Pending", "PodCreateRefused")
        assert status["message"] == f"pod mnist-worker-1 can't be created: {NO_CLASS}"
        assert h.kube.events == [("Warning", "PodCreateRefused", status["message"])]

        h.watch()  # worker-0 shows: its counts may be written, the reason stays
        creates = len(h.kube.writes("create"))
        h.clock.advance(1)
        assert 0 < (await h.reconcile() or 0) <= FIRST_BACKOFF_SECONDS  # held: no create
        assert len(h.kube.writes("create")) == creates
        assert h.status()["reason"] == "PodCreateRefused"
        h.watch()
        writes = len(h.kube.statuses)
        await h.reconcile()
        assert len(h.kube.statuses) == writes, "nothing new: no write"

        h.clock.advance(FIRST_BACKOFF_SECONDS)  # refused again: the backoff doubles, no new event
        assert await h.reconcile() == 2 * FIRST_BACKOFF_SECONDS
        assert len(h.kube.events) == 1

        del h.kube.refused["mnist-worker-1"]  # the PriorityClass made
        h.clock.advance(2 * FIRST_BACKOFF_SECONDS)
        await h.reconcile()
        h.watch(**RUNNING)
        await h.reconcile()
        assert (h.status()["phase"], h.status()["reason"]) == ("Running", "AllPodsRunning")
    run(scenario)


QUOTA_SECRETS = 'secrets "mnist-ssh-uid-1" is forbidden: exceeded quota: objects, requested: count/secrets=1, used: ' \
                "count/secrets=10, limited: count/secrets=10"


def test_a_refused_supporting_object_makes_the_job_wait_and_say_why() -> None:
    """Issue 21, defect 5: a Service, ConfigMap, Secret, NetworkPolicy or gang group refused (a
    ResourceQuota on count/secrets, a policy engine) raised out of the pass: a traceback every
    retry, the job Pending with no reason. Now: the same as a refused pod."""
    async def scenario() -> None:
        h = Harness(mpi_job("mnist", workers=2))
        h.kube.refused["mnist-ssh-uid-1"] = QUOTA_SECRETS
        assert await h.reconcile() == FIRST_BACKOFF_SECONDS
        status = h.status()
        assert (status["phase"], status["reason"]) == ("Pending", "CreateRefused")
        assert status["message"] == f"Secret mnist-ssh-uid-1 can't be created: {QUOTA_SECRETS}"
        assert h.kube.events[-1] == ("Warning", "CreateRefused", status["message"])
        assert not [w for w in h.kube.writes("create") if w.startswith("Pod/")], "no pod before its Secret"
        creates = len(h.kube.writes("create"))
        h.clock.advance(1)
        await h.reconcile()
        assert len(h.kube.writes("create")) == creates, "held while the backoff runs"
        del h.kube.refused["mnist-ssh-uid-1"]  # quota raised
        h.clock.advance(FIRST_BACKOFF_SECONDS)
        await h.reconcile()
        assert ("Secret", "ml", "mnist-ssh-uid-1") in h.kube.objects
        assert len([w for w in h.kube.writes("create") if w.startswith("Pod/")]) == 2
    run(scenario)


TOO_LONG = 'ConfigMap "mnist-mpi" is invalid: data: Too long: must have at most 1048576 bytes'


def test_an_invalid_supporting_object_fails_the_job_in_the_api_servers_words() -> None:
    async def scenario() -> None:
        h = Harness(mpi_job("mnist", workers=2))
        h.kube.invalid["mnist-mpi"] = TOO_LONG
        assert await h.reconcile() is None
        status = h.status()
        assert (status["phase"], status["reason"]) == ("Failed", "InvalidObject")
        assert status["message"] == ("ConfigMap mnist-mpi can't be created: ConfigMap \"mnist-mpi\" is invalid: "
                                     "data: Too long: must have at most 1048576 bytes")
    run(scenario)
