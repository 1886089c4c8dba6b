"""Pods the watch never saw go, and the last state of pods it saw go: tombstones, as client-go's
informers keep them (DeletedFinalStateUnknown).

kopf removes a pod from its index only on a DELETED event. After a watch expires (410 Gone: an API
server restart, a long partition) it lists again and carries on, but what the new list lacks is
never purged: a pod deleted in the gap stays "Running" in the index for good, and its job with it
(issue 21, defect 10). Every RESYNC_SECONDS the pods of each namespace that holds indexed pods are
listed (their uids only). A pod that was in the index before the list began and is absent from it
no longer exists (a uid never comes back), so the controller stops seeing it and its job is
looked at again. The tombstones are worked out afresh at each resync from what the index still
holds, so they never outgrow it, and after a restart nothing needs remembering: the new process
lists its pods anew.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from disttrain.api.observed import ObservedPod
from disttrain.api.times import epoch_seconds

RESYNC_SECONDS = 300.0
log = logging.getLogger(__name__)
Key = TypeVar("Key")


class PodLister(Protocol):
    async def pod_uids(self, namespace: str) -> set[str]: ...


class Tombstones:
    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now  # seconds since the epoch: when a pod went
        self.gone: frozenset[str] = frozenset()
        # The final state of pods deleted for a disruption, from their DELETED event: a pod the
        # taint manager or the pod GC deletes carries DisruptionTarget, and when its DELETED event
        # overtakes the update that showed it, the pod would be merely gone (a retryable loss) where
        # the update makes it a failure (restartPolicy Never fails the job). Kept until a status
        # names it in deletedPods (judged once), or the job is forgotten; after an operator restart
        # the pod is merely gone, as before.
        self.final: dict[Any, dict[str, ObservedPod]] = {}
        # Pods gone that held GPUs (or CPUs) past the job's last usage count, ended when they went:
        # kept until a status counts past that (status.usage.countedAt, decide/usage_steps.py), or the
        # job is forgotten. At most a job's pods of one attempt and the one before; after an operator
        # restart, what they held since the last count is not counted (docs/api.md, Usage).
        self.departed: dict[Any, dict[str, ObservedPod]] = {}

    def pod_deleted(self, key: Any, pod: ObservedPod) -> None:
        """A disrupted pod still running is held as terminating (judged as a disruption); one
        already marked Failed (the pod garbage collector fails an orphan as it adds the condition,
        then deletes it) as the failed pod the overtaken update showed."""
        if pod.disruption is not None and pod.phase != "Succeeded":
            self.final.setdefault(key, {})[pod.uid] = dataclasses.replace(pod, terminating=pod.phase != "Failed")
        if pod.scheduled:
            went = self.now()
            ended = went if pod.ended_at is None else min(pod.ended_at, went)
            self.departed.setdefault(key, {})[pod.uid] = dataclasses.replace(pod, ended_at=ended, terminating=True)

    def departed_of(self, key: Any, status: Mapping[str, Any]) -> tuple[ObservedPod, ...]:
        """The job's pods gone since its status last counted usage (status.usage.countedAt): those
        it counted are let go."""
        held = self.departed.get(key)
        if not held:
            return ()
        usage = status.get("usage")
        if not isinstance(usage, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
            del self.departed[key]  # finished before usage was counted: never counted (usage_steps.py)
            return ()
        counted_at = epoch_seconds(usage.get("countedAt")) if isinstance(usage, Mapping) else None
        if counted_at is not None:
            counted_at = min(counted_at, self.now())  # one ahead of the clock (a status writer's) counts up to now
            for uid in [u for u, p in held.items() if p.ended_at is not None and p.ended_at <= counted_at]:
                del held[uid]
            if not held:
                del self.departed[key]
                return ()
        return tuple(held.values())

    def view(self, key: Any, pods: Iterable[ObservedPod], judged: Collection[str]) -> list[ObservedPod]:
        """The job's pods as they are: without the gone, with the disrupted ones whose deletion
        came first, until a status has judged them (`judged`: its deletedPods)."""
        alive = [p for p in pods if p.uid not in self.gone] if self.gone else list(pods)
        final = self.final.get(key)
        if final:
            for uid in [u for u in final if u in judged]:
                del final[uid]
            seen = {p.uid for p in alive}
            alive += [p for uid, p in final.items() if uid not in seen]
        return alive

    def forget(self, key: Any) -> None:
        self.final.pop(key, None)
        self.departed.pop(key, None)

    async def resync(self, kube: PodLister, index: Mapping[tuple[str, Key], Iterable[ObservedPod]]
                     ) -> set[tuple[str, Key]]:
        """List, compare, remember; the keys of the jobs that lost a pod since the last resync."""
        before = {key: {p.uid for p in pods if p.uid} for key, pods in list(index.items())}  # before the lists
        gone: set[str] = set()
        touched = set()
        for namespace in sorted({key[0] for key in before}):
            present = await kube.pod_uids(namespace)
            for key, uids in before.items():
                lost = uids - present if key[0] == namespace else set()
                if lost - self.gone:
                    touched.add(key)
                    log.info("%s/%s: pods %s are gone, though no watch event said so (a re-list's gap)",
                             key[0], key[1], sorted(lost - self.gone))
                gone |= lost
        self.gone = frozenset(gone)
        return touched


async def resync_forever(resync: Callable[[], Awaitable[object]], seconds: float = RESYNC_SECONDS) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await resync()
        except Exception as err:  # the next one tries again; reconciles go on meanwhile
            log.warning("pod resync failed: %s: %s", type(err).__name__, err)
