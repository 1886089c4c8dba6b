"""A checkpoint request (and a hostfile's remount) reaches every pod of a large job at once, within the
operator's bound on writes in flight (issue 45: 1,024 workers within 2 s), and a patch that fails is the
only one the next pass makes again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.control.children import Children

REF = JobRef("big", "ns", "job-uid")


class ServerError(Exception):
    """A 500 from the API server, as the client raises it after its retries."""

ROUND_TRIP = 0.05


def pod(index: int) -> ObservedPod:
    return ObservedPod(name=f"big-worker-{index}", uid=f"uid-{index}", owner_uid=REF.uid, replica_type="worker",
                       index=index, phase="Running", ready=True, terminating=False, exit_code=None, reason=None,
                       container_restarts=0)


class SlowAnnotations:
    """An API server that takes ROUND_TRIP per patch, fails the pods named in `failing` once each."""

    def __init__(self, failing: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.failing = set(failing)
        self.in_flight = self.most_in_flight = 0
        self.patched: list[str] = []

    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str]) -> bool:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(ROUND_TRIP)
            if name in self.failing:
                self.failing.discard(name)
                raise ServerError("etcdserver: request timed out")
            self.patched.append(name)
            return True
        finally:
            self.in_flight -= 1

    async def create(self, obj: dict[str, Any]) -> str | None:
        raise AssertionError("no create here")

    async def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        raise AssertionError("no get here")

    async def get_metadata(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        raise AssertionError("no get here")

    async def patch_config_map_data(self, obj: dict[str, Any]) -> bool:
        raise AssertionError("no ConfigMap here")


def test_a_checkpoint_request_reaches_1024_pods_at_once_within_the_bound_on_writes() -> None:
    kube = SlowAnnotations()
    children = Children(kube, groups=None, create_concurrency=80)  # type: ignore[arg-type]
    marks = [(pod(i), {"disttrain.dev/checkpoint-request": "r1"}) for i in range(1024)]

    started = time.monotonic()
    asyncio.run(children.annotate(REF, marks))
    took = time.monotonic() - started

    assert sorted(kube.patched) == sorted(p.name for p, _ in marks)
    assert kube.most_in_flight == 80
    # One at a time this is 1,024 round trips (51 s here); 80 at a time, 13.
    assert took < 1024 * ROUND_TRIP / 10, took
    asyncio.run(children.annotate(REF, marks))  # made already: nothing is patched again
    assert len(kube.patched) == 1024


def test_a_failed_patch_is_raised_after_the_rest_and_is_the_only_one_made_again() -> None:
    kube = SlowAnnotations(failing={"big-worker-3"})
    children = Children(kube, groups=None, create_concurrency=8)  # type: ignore[arg-type]
    marks = [(pod(i), {"disttrain.dev/checkpoint-request": "r1"}) for i in range(20)]

    with pytest.raises(ServerError):
        asyncio.run(children.annotate(REF, marks))
    assert len(kube.patched) == 19 and "big-worker-3" not in kube.patched

    asyncio.run(children.annotate(REF, marks))  # the pass again, while the request stands
    assert kube.patched[19:] == ["big-worker-3"]


def test_a_job_forgotten_while_its_pods_are_patched_is_not_remembered_and_another_jobs_patches_are() -> None:
    """forget() builds new dicts: patches that ended after it were written to the old one and lost (the
    review: every pod patched again on the next pass), or, written to the new one, held forever."""
    kube = SlowAnnotations()
    children = Children(kube, groups=None, create_concurrency=8)  # type: ignore[arg-type]
    other = JobRef("other", "ns", "other-uid")
    marks = [(pod(i), {"disttrain.dev/checkpoint-request": "r1"}) for i in range(40)]

    async def scenario() -> None:
        fan_outs = asyncio.gather(children.annotate(REF, marks), children.annotate(other, marks))
        await asyncio.sleep(ROUND_TRIP / 2)
        children.forget(REF.uid)  # the job deleted while its request goes out
        children.forget("a-third-job")
        await fan_outs

    asyncio.run(scenario())
    assert not any(uid == REF.uid for uid, _ in children.marked)
    assert sum(1 for uid, _ in children.marked if uid == other.uid) == 40
    assert children.annotating == []
