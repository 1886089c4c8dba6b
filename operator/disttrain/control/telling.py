"""What happened to a job, told: its Events, with the same line in the operator's log (what
happened to a job, in order, once events have expired), and a pass the API server failed, told
once per new message."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from disttrain.api.objects import JobRef
from disttrain.apiserver.kube_api import KubeAPI
from disttrain.apiserver.retries import Explained
from disttrain.decide.plan import Event
from disttrain.decide.reasons import Reason
from disttrain.runtime import metrics
from disttrain.runtime.clock import Clock

log = logging.getLogger(__name__)
RETOLD_AFTER = 300.0  # seconds before the same failure is told again


class Telling:
    def __init__(self, kube: KubeAPI, clock: Clock) -> None:
        self.kube, self.clock = kube, clock
        self.retried: dict[tuple[str, str], tuple[str, float]] = {}  # the last failure told, and when

    async def tell(self, ref: JobRef, events: Iterable[Event]) -> None:
        """A pass's transitions, in order, each counted in the transitions metric."""
        for event in events:
            await self.event(ref, event)
            metrics.count_transition(event.reason)

    async def event(self, ref: JobRef, event: Event) -> None:
        log.info("%s/%s: %s: %s", ref.namespace, ref.name, event.reason, event.message)
        try:
            await self.kube.post_event(ref.namespace, ref.name, ref.uid, event.type, event.reason, event.message)
        except Exception:  # an event lost must never stop the job
            log.warning("could not post event %s for %s/%s", event.reason, ref.namespace, ref.name, exc_info=True)

    async def retrying(self, ref: JobRef, failure: Explained) -> None:
        """A pass the API server failed (throttled, a server error, RBAC): the work queue retries it
        with backoff; the job's events say so, once per new message (again after 5 minutes)."""
        key, now = (ref.namespace, ref.name), self.clock.monotonic()
        last = self.retried.get(key)
        told = last is not None and last[0] == failure.what and now - last[1] < RETOLD_AFTER
        if not failure.tell_the_job or told:
            return
        self.retried[key] = (failure.what, now)
        await self.event(ref, Event("Warning", Reason.API_REQUEST_RETRIED, f"{failure.what}; retrying with backoff"))

    def forget(self, key: tuple[str, str]) -> None:
        self.retried.pop(key, None)
