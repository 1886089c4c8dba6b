"""What the operator did that its watch hasn't shown yet, as client-go controllers track it.

The pod index lags the API server by a watch event. Pods we created but haven't seen count as
Pending (so they aren't created again); pods we deleted count as terminating until their
deletion shows (so one failure is never handled twice).
"""

from __future__ import annotations

import dataclasses

from disttrain.clock import Clock
from disttrain.objects import PodKey
from disttrain.observed import ObservedPod

# How long a created pod may stay unseen before we stop assuming it exists.
CREATE_EXPECTATION_SECONDS = 30.0


class Expectations:
    def __init__(self, clock: Clock, owner_uid: str) -> None:
        self.clock, self.owner_uid = clock, owner_uid
        self.created: dict[str, tuple[PodKey, float]] = {}  # pod name -> (key, when)
        self.deleted: set[str] = set()  # pod uids

    def expect_created(self, name: str, key: PodKey) -> None:
        self.created[name] = (key, self.clock.monotonic())

    def not_created(self, name: str) -> None:
        self.created.pop(name, None)

    def expect_deleted(self, uid: str) -> None:
        self.deleted.add(uid)

    def apply(self, observed: list[ObservedPod]) -> list[ObservedPod]:
        """The pods as the API server has them now, as far as we know: `observed` with our
        deletions marked terminating and our creations added."""
        names = {p.name for p in observed if p.owner_uid == self.owner_uid}
        self.deleted &= {p.uid for p in observed}
        pods = [dataclasses.replace(p, terminating=True) if p.uid in self.deleted else p for p in observed]
        now = self.clock.monotonic()
        for name, (key, when) in list(self.created.items()):
            if name in names or now - when > CREATE_EXPECTATION_SECONDS:
                del self.created[name]
            else:
                pods.append(ObservedPod.expected(name, key, self.owner_uid))
        return pods
