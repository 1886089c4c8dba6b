"""What the operator did that its watch hasn't shown yet, as client-go controllers track it.

The pod index lags the API server by a watch event. Pods we created but haven't seen count as
Pending (so they aren't created again); pods we deleted count as terminating until their
deletion shows (so one failure is never handled twice).
"""

from __future__ import annotations

import dataclasses

from disttrain.api.objects import PodKey
from disttrain.api.observed import ObservedPod
from disttrain.runtime.clock import Clock

# How long a created pod may stay unseen before we stop assuming it exists, and a deleted one may
# show no deletion before we stop assuming it is going (and delete it again: with its uid as
# precondition a repeated delete is harmless). client-go's ControllerExpectations expire alike
# (5 minutes there; our watch is one process away, so a much shorter wait).
CREATE_EXPECTATION_SECONDS = 30.0
DELETE_EXPECTATION_SECONDS = 30.0


class Expectations:
    def __init__(self, clock: Clock, owner_uid: str) -> None:
        self.clock, self.owner_uid = clock, owner_uid
        self.created: dict[str, tuple[PodKey, float, str]] = {}  # pod name -> (key, when, uid once created)
        self.deleted: dict[str, float] = {}  # pod uid -> when its delete was sent

    def expect_created(self, name: str, key: PodKey) -> None:
        self.created[name] = (key, self.clock.monotonic(), "")

    def created_as(self, name: str, uid: str) -> None:
        """The create answered with the pod's uid: an unseen pod can be deleted by it (a delete
        with an empty uid precondition is refused)."""
        if name in self.created:
            key, when, _ = self.created[name]
            self.created[name] = (key, when, uid)

    def not_created(self, name: str) -> None:
        self.created.pop(name, None)

    def expect_deleted(self, uid: str) -> None:
        self.deleted[uid] = self.clock.monotonic()

    def not_deleted(self, uid: str) -> None:
        """The delete failed (429, 500, a timeout): the pod is as it was, and the next pass may
        delete it again."""
        self.deleted.pop(uid, None)

    def apply(self, observed: list[ObservedPod]) -> list[ObservedPod]:
        """The pods as the API server has them now, as far as we know: `observed` with our
        deletions marked terminating and our creations added."""
        names = {p.name for p in observed if p.owner_uid == self.owner_uid}
        now = self.clock.monotonic()
        present = {p.uid for p in observed}
        self.deleted = {uid: when for uid, when in self.deleted.items()
                        if uid in present and now - when <= DELETE_EXPECTATION_SECONDS}
        pods = [dataclasses.replace(p, terminating=True) if p.uid in self.deleted else p for p in observed]
        for name, (key, when, uid) in list(self.created.items()):
            if name in names or now - when > CREATE_EXPECTATION_SECONDS:
                del self.created[name]
            else:
                pods.append(ObservedPod.expected(name, key, self.owner_uid, uid))
        return pods
