"""A job whose namespace is being deleted gets no new pod, no status write and no event
(teardown.py): the namespace controller deletes the pods first, and they are not lost ones."""

from __future__ import annotations

import asyncio
from typing import Any

from fakes import FakeKube
from test_controller import RUNNING, Harness

from disttrain.api.observed import observe_pod
from disttrain.apiserver.api_errors import ErrorKind, classify
from disttrain.control.teardown import RECHECK_SECONDS
from manifests import mwms_job

TERMINATING_403 = (b'{"kind":"Status","status":"Failure","message":"pods \\"a\\" is forbidden: unable to create new '
                   b'content in namespace ml because it is being terminated","reason":"Forbidden","details":{"name":'
                   b'"a","kind":"pods","causes":[{"reason":"NamespaceTerminating","message":"namespace ml is being '
                   b'terminated","field":"metadata.namespace"}]},"code":403}')


def running_job() -> Harness:
    h = Harness(mwms_job("mnist", workers=2))

    async def start() -> None:
        await h.reconcile()
        h.watch(**RUNNING)
        await h.reconcile()
        h.watch(**RUNNING)  # the status written shows in the job's watch
    asyncio.run(start())
    assert h.status()["phase"] == "Running"
    return h


def deleted_by_the_namespace_controller(h: Harness) -> None:
    h.pods[:] = [observe_pod({**p, "metadata": {**p["metadata"], "deletionTimestamp": "2026-11-22T12:00:05Z"},
                              "status": RUNNING}) for p in h.kube.pods()]


def quiet(h: Harness) -> tuple[int, int, int]:
    return len(h.kube.statuses), len(h.kube.events), len([w for w in h.kube.writes("create")])


def test_pods_deleted_with_their_namespace_are_not_replaced() -> None:
    h = running_job()
    h.kube.terminating.add("ml")
    deleted_by_the_namespace_controller(h)
    before = quiet(h)
    h.clock.advance(1)  # within the cached answer's life: asked afresh, pods went without us

    async def scenario() -> None:
        assert await h.reconcile() is None
        h.pods.clear()  # gone
        h.clock.advance(RECHECK_SECONDS + 1)
        assert await h.reconcile() is None
    asyncio.run(scenario())
    assert quiet(h) == before, "no status write, event or create in a namespace going away"
    assert h.kube.writes("get").count("Namespace/ml") == 3  # at start, on the deletion, after the cache ran out


def test_a_pod_deleted_by_a_user_is_still_replaced() -> None:
    h = running_job()
    h.pods[:] = [p for p in h.pods if p.name != "mnist-worker-1"]

    async def scenario() -> None:
        await h.reconcile()
    asyncio.run(scenario())
    assert (h.status()["phase"], h.status()["reason"]) == ("Restarting", "PodDeleted")


class NoNamespaceRights(FakeKube):
    async def namespace_terminating(self, namespace: str) -> bool | None:
        self.calls.append(("get", f"Namespace/{namespace}"))
        return None  # 403: the operator may not get namespaces


def test_without_rights_to_get_namespaces_the_first_refused_create_stops_it() -> None:
    h = Harness(mwms_job("mnist", workers=2))
    h.kube = NoNamespaceRights(terminating={"ml"})
    h.controller.kube = h.kube
    h.controller.namespaces.kube = h.kube
    h.controller.children.kube = h.kube

    async def scenario() -> None:
        assert await h.reconcile() is None
        creates = len(h.kube.writes("create"))
        assert await h.reconcile() is None
        assert len(h.kube.writes("create")) == creates, "refused once, not again"
    asyncio.run(scenario())
    assert h.kube.writes("get").count("Namespace/ml") == 1, "asked once, not on every reconcile"


def test_the_refusal_is_told_from_other_403s() -> None:
    assert classify(403, TERMINATING_403).kind is ErrorKind.NAMESPACE_TERMINATING
    other: Any = b'{"kind":"Status","reason":"Forbidden","code":403,"message":"pods is forbidden: User cannot"}'
    assert classify(403, other).kind is not ErrorKind.NAMESPACE_TERMINATING
    assert classify(409, TERMINATING_403).kind is not ErrorKind.NAMESPACE_TERMINATING
    assert classify(403, "not json").kind is ErrorKind.ADMISSION
