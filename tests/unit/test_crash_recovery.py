"""An operator killed between its status write and the deletes that write announced: the next
operator (a fresh Controller, nothing in memory) must finish the deletes without counting the
failure, or the kubelet restarts of the deleted pods, a second time (issue 12, item 1)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any

import pytest
from fakes import FakeKube
from test_controller import KEY, RUNNING, Harness

from disttrain.api.observed import observe_pod
from disttrain.control.controller import Controller
from manifests import replica, tf_job

KILLED = {"phase": "Failed", "containerStatuses": [{"name": "c", "restartCount": 0, "state": {
    "terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}


class Crash(BaseException):
    """The operator's process dies here (a BaseException: nothing on the way catches it)."""


class CrashOnDelete(FakeKube):
    """The API calls go through until the first pod delete, where the process is killed."""

    crash = False

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        if self.crash:
            raise Crash()
        await super().delete_pod(namespace, name, uid)


def restarted(h: Harness) -> None:
    """A new operator process: a fresh Controller on the same API, the job as its watch lists it."""
    h.kube.crash = False  # type: ignore[attr-defined]
    h.controller = Controller(h.kube, clock=h.clock)
    h.body["status"] = copy.deepcopy(h.kube.statuses[-1])
    h.controller.bind(h.jobs, {KEY: h.pods})


def crash_on_first_failure(manifest: dict[str, Any], pod_status: dict[str, Any]) -> Harness:
    h = Harness(manifest)
    h.kube = CrashOnDelete()
    h.controller = Controller(h.kube, clock=h.clock)
    h.controller.bind(h.jobs, {KEY: h.pods})

    async def until_crash() -> None:
        await h.reconcile()
        h.watch(**RUNNING)
        await h.reconcile()
        assert h.status()["phase"] == "Running"
        h.watch(**RUNNING)
        h.pods[:] = [observe_pod({**pod, "status": pod_status}) if pod["metadata"]["name"] == "mnist-worker-1"
                     else observe_pod({**pod, "status": RUNNING}) for pod in h.kube.pods()]
        h.kube.crash = True  # type: ignore[attr-defined]
        with pytest.raises(Crash):
            await h.reconcile()
    asyncio.run(until_crash())
    return h


@pytest.mark.parametrize("scope", ["Job", "Pod"])
def test_a_failure_written_before_a_crash_is_counted_once(scope: str) -> None:
    manifest = tf_job(worker=replica(2, "ExitCode"), run_policy={"restartScope": scope})
    h = crash_on_first_failure(manifest, KILLED)
    written = h.status()
    assert (written["phase"], written["restarts"]) == ("Restarting", 1), "the decision was written"
    assert len(h.kube.pods()) == 2, "and the pods it deletes are all still there"
    restarted(h)

    async def after_restart() -> None:
        await h.reconcile()
        assert h.status()["restarts"] == 1, "the same failure counted twice"
        deleted = 2 if scope == "Job" else 1
        assert len(h.kube.pods()) == 2 - deleted, "the deletes the first operator announced are done"
        h.watch(**RUNNING)  # the watch shows what is left; then the new pods, running
        await h.reconcile()
        h.watch(**RUNNING)
        await h.reconcile()
        assert len(h.kube.pods()) == 2
        assert (h.status()["phase"], h.status()["restarts"]) == ("Running", 1)
    asyncio.run(after_restart())


def test_kubelet_restarts_of_deleted_pods_are_banked_once() -> None:
    """OnFailure pods' container restarts count toward RESTARTS; those of a pod the operator
    deletes move to operatorRestarts in the status that announces the delete, once."""
    manifest = tf_job(worker=replica(2, "ExitCode"), run_policy={"backoffLimit": 10})
    restarted_then_killed = {"phase": "Failed", "containerStatuses": [{"name": "c", "restartCount": 2, "state": {
        "terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
    h = crash_on_first_failure(manifest, restarted_then_killed)
    first = h.status()
    # 1 restart of the job, and the 2 container restarts of the failed pod it deletes.
    assert (first["restarts"], first["operatorRestarts"]) == (3, 3)
    restarted(h)

    async def after_restart() -> None:
        await h.reconcile()
        assert (h.status()["restarts"], h.status()["operatorRestarts"]) == (3, 3)
    asyncio.run(after_restart())


def test_discover_hosts_follows_the_workers_after_an_operator_restart() -> None:
    """Issue 21, defect 9: the ConfigMap was kept current only for jobs this process had created
    something for (an in-memory set), so after a restart or failover discover_hosts.sh froze."""
    from disttrain.builders.mpi import DISCOVER_HOSTS
    from manifests import mpi_job

    def statuses(running: set[str]) -> None:
        h.pods[:] = [observe_pod({**pod, "status": RUNNING if pod["metadata"]["name"] in running else {}})
                     for pod in h.kube.pods()]

    async def scenario() -> None:
        await h.reconcile()
        assert len(h.kube.pods()) == 3, "the launcher too (launcherStart: Immediately)"
        statuses({"mnist-worker-0", "mnist-launcher"})
        await h.reconcile()
        script = h.kube.objects[("ConfigMap", "ml", "mnist-mpi")]["data"][DISCOVER_HOSTS]
        assert "mnist-worker-0." in script and "mnist-worker-1." not in script
        restarted(h)  # nothing left to create: the new process creates nothing
        statuses({"mnist-worker-0", "mnist-worker-1", "mnist-launcher"})
        await h.reconcile()
        script = h.kube.objects[("ConfigMap", "ml", "mnist-mpi")]["data"][DISCOVER_HOSTS]
        assert "mnist-worker-1." in script, script
    manifest = mpi_job("mnist", workers=2)
    manifest["spec"]["mpi"]["launcherStart"] = "Immediately"
    h = Harness(manifest)
    asyncio.run(scenario())


def running_only(h: Any, running: set[str]) -> None:
    """The harness's pods as the watch would show them: those named Running, the rest just made."""
    h.pods[:] = [observe_pod({**pod, "status": RUNNING if pod["metadata"]["name"] in running else {}})
                 for pod in h.kube.pods()]


def launcher_digest(h: Any) -> str | None:
    """The discover_hosts.sh digest annotated on the launcher (none yet: None)."""
    from disttrain.api.constants import DISCOVERY_ANNOTATION

    annotations = h.kube.objects[("Pod", "ml", "mnist-launcher")]["metadata"].get("annotations") or {}
    return annotations.get(DISCOVERY_ANNOTATION)


def test_an_elastic_jobs_launcher_is_touched_when_discovery_changes_after_a_restart_too() -> None:
    """The kubelet refreshes a ConfigMap volume when it syncs the pod: at the pod's next update, else
    once a minute. An elastic job's launcher gets the new discover_hosts.sh's digest as an
    annotation after each write, so horovodrun sees a worker come or go at once."""
    from manifests import mpi_job

    async def scenario() -> None:
        await h.reconcile()
        running_only(h, {"mnist-worker-0", "mnist-launcher"})
        await h.reconcile()
        first = launcher_digest(h)
        assert first is not None
        assert ("annotate", "Pod/ml/mnist-launcher") in h.kube.calls
        await h.reconcile()
        assert launcher_digest(h) == first and h.kube.calls.count(("annotate", "Pod/ml/mnist-launcher")) == 1, \
            "no change, no write"
        restarted(h)
        running_only(h, {"mnist-worker-0", "mnist-worker-1", "mnist-launcher"})
        await h.reconcile()
        assert launcher_digest(h) not in (None, first)
    manifest = mpi_job("mnist", workers=2)
    manifest["spec"]["mpi"].update(launcherStart="Immediately", elastic={"minReplicas": 1, "maxReplicas": 3})
    h = Harness(manifest)
    asyncio.run(scenario())


def test_a_failed_launcher_annotation_is_tried_again_by_the_next_pass() -> None:
    """Issue 31: the ConfigMap's write was remembered before the launcher was annotated, so an
    annotation the API server failed (429, 500, a timeout) was never tried again: the launcher
    waited for the kubelet's minute, longer than the 30 s scale-down delay."""
    from disttrain.apiserver.rest import ApiError
    from manifests import mpi_job

    async def scenario() -> None:
        await h.reconcile()
        running_only(h, {"mnist-worker-0", "mnist-launcher"})
        h.kube.annotate_failures.append(ApiError(429, "Too Many Requests", b"{}", {"Retry-After": "1"}))
        with contextlib.suppress(ApiError):  # the work queue retries the pass
            await h.reconcile()
        assert launcher_digest(h) is None, "the annotation failed"
        await h.reconcile()
        assert launcher_digest(h) is not None, "tried again by the next pass"
    manifest = mpi_job("mnist", workers=2)
    manifest["spec"]["mpi"].update(launcherStart="Immediately", elastic={"minReplicas": 1, "maxReplicas": 3})
    h = Harness(manifest)
    asyncio.run(scenario())
