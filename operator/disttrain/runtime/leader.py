"""Leader election on a coordination.k8s.io Lease, as client-go controllers do it.

With several replicas only the Lease holder runs the operator; the others wait and take the
Lease once it has not been renewed for its duration. A holder that cannot renew in time exits
(its pod restarts and queues up as a standby) rather than risk two active operators. A holder
that stops (SIGTERM: a rollout, a drain, a deleted pod) releases the Lease once kopf has
stopped, as client-go's ReleaseOnCancel does, so a standby leads within its next try (2 s)
rather than a Lease duration later.

kopf's own peering was tried first and dropped: replicas with equal priorities all pause, and
in our tests a second replica often saw no peering events for a minute or more.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from disttrain.api.status import micro_timestamp
from disttrain.apiserver.rest import ApiError, Endpoint, Rest, path
from disttrain.apiserver.retries import TRANSIENT
from disttrain.runtime.clock import Clock, SystemClock

log = logging.getLogger(__name__)
LEASES = "coordination.k8s.io/v1"


class LeaseAPI(Protocol):
    """Reads and compare-and-swap writes of one Lease (`CoordinationLeases`; a fake in tests)."""

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def create(self, namespace: str, body: dict[str, Any]) -> bool: ...
    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool: ...


class CoordinationLeases:
    """LeaseAPI over the coordination.k8s.io/v1 API: False from a write means another replica
    wrote first (409)."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = await self.rest.request("GET", path(LEASES, "leases", namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return lease

    async def create(self, namespace: str, body: dict[str, Any]) -> bool:
        return await self._unless_conflict("POST", path(LEASES, "leases", namespace), body)

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        return await self._unless_conflict("PUT", path(LEASES, "leases", namespace, name), body)

    async def _unless_conflict(self, method: str, url_path: str, body: dict[str, Any]) -> bool:
        try:
            await self.rest.request(method, url_path, body=body)
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True


class LeaseElector:
    def __init__(self, namespace: str, name: str, identity: str, duration: int = 15,
                 clock: Clock | None = None) -> None:
        self.namespace, self.name, self.identity, self.duration = namespace, name, identity, duration
        self.clock: Clock = clock or SystemClock()
        # When (monotonic) we sent our last write that went through: a standby may take over
        # one duration after it saw that write.
        self.renewed_at: float | None = None
        # The other holder's record as last read, and when (monotonic) we first saw it so: the
        # Lease's times are the holder's wall clock, which ours may disagree with by any amount.
        # As client-go's LeaderElector: a record unchanged for a duration of our time has expired.
        self.observed: tuple[Any, ...] | None = None
        self.observed_at = 0.0

    async def try_hold(self, leases: LeaseAPI) -> bool:
        """One attempt to take or keep the Lease; True if we hold it afterwards."""
        sent = self.clock.monotonic()
        held = await self._try_hold(leases, self.clock.now())
        if held:
            self.renewed_at = sent
        return held

    def _expired(self, lease: dict[str, Any]) -> bool:
        """Whether the record has stayed the same for its duration, by this process's clock."""
        spec = lease.get("spec") or {}
        version = (lease.get("metadata") or {}).get("resourceVersion")
        record = (spec.get("holderIdentity"), spec.get("renewTime"), version)
        now = self.clock.monotonic()
        if record != self.observed:
            self.observed, self.observed_at = record, now
        return now - self.observed_at > int(spec.get("leaseDurationSeconds") or self.duration)

    async def _try_hold(self, leases: LeaseAPI, now: datetime.datetime) -> bool:
        lease, stamp = await leases.read(self.namespace, self.name), micro_timestamp(now)
        if lease is None:
            return await leases.create(self.namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                         "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0}})
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder not in (self.identity, None, "") and not self._expired(lease):
            return False
        new_spec = dict(spec, holderIdentity=self.identity, leaseDurationSeconds=self.duration,
                        renewTime=stamp)
        if holder != self.identity:
            new_spec.update(acquireTime=stamp, leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        # The resourceVersion in the body read makes this a compare-and-swap: of two replicas
        # taking an expired Lease at once, one wins.
        return await leases.replace(self.namespace, self.name, dict(lease, spec=new_spec))

    async def release(self, leases: LeaseAPI) -> bool:
        """Give the Lease up, if we still hold it: client-go's release, an empty holder with a
        duration of 1 s, which a standby takes at its next try. True if released."""
        lease = await leases.read(self.namespace, self.name)
        spec = (lease or {}).get("spec") or {}
        if lease is None or spec.get("holderIdentity") != self.identity:
            return False
        stamp = micro_timestamp(self.clock.now())
        released = dict(spec, holderIdentity="", leaseDurationSeconds=1, acquireTime=stamp, renewTime=stamp)
        return await leases.replace(self.namespace, self.name, dict(lease, spec=released))

    async def acquire(self, leases: LeaseAPI, retry_seconds: float = 2) -> None:
        announced = False
        while True:
            try:
                if await self.try_hold(leases):
                    log.info("became the leader (Lease %s/%s) as %s", self.namespace, self.name, self.identity)
                    return
            except ApiError as err:
                log.warning("leader election: %s", err)
            except TRANSIENT as err:  # the API server restarting or unreachable: a standby waits it out
                log.warning("leader election: %s: %s", type(err).__name__, err)
            if not announced:
                log.info("standing by: another replica holds Lease %s/%s", self.namespace, self.name)
                announced = True
            await asyncio.sleep(retry_seconds)

    async def keep(self, leases: LeaseAPI, stop: threading.Event | None = None) -> bool:
        """Renew every third of the duration; return False (the caller exits) once the Lease is
        lost, or two thirds of its duration after the renewTime of our last renewal that went
        through; True once `stop` is set and the Lease released (or the release tried).

        Renewals and the release are made here alone, one after another: a renewal racing the
        release from another thread could read the emptied Lease and take it back.

        Counted from that renewTime (taken before the request was sent), not from when the
        answer came, and each try is cut off at that deadline: with etcd paused a renewal hangs
        for as long as the pause, and one that went through late, counted from its answer, kept
        a replica leading past the moment its standby took over (`make chaos`, two replicas
        through an etcd pause: an overlap of a millisecond)."""
        give_up_after = self.duration * 2 / 3
        stop = stop or threading.Event()
        while True:
            if await asyncio.to_thread(stop.wait, self.duration / 3):
                await self._release_in_time(leases, give_up_after)
                return True
            deadline = (self.renewed_at or self.clock.monotonic()) + give_up_after
            try:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no renewal in {give_up_after:.0f}s")
                if await asyncio.wait_for(self.try_hold(leases), timeout=left):
                    continue
                log.error("lost Lease %s/%s to another replica: exiting", self.namespace, self.name)
                return False
            except Exception as err:  # the API server restarting, unreachable or hanging: retried below
                log.warning("renewing Lease %s/%s failed: %s: %s", self.namespace, self.name, type(err).__name__, err)
                if self.clock.monotonic() < deadline:
                    continue
                log.error("could not renew Lease %s/%s in time: exiting", self.namespace, self.name)
                return False

    async def _release_in_time(self, leases: LeaseAPI, timeout: float) -> None:
        """Release, or leave the Lease to expire: a stopping process waits no longer than this.

        Writes the operator sent before it stopped may still be in the API server's hands when
        the standby starts, as with client-go's ReleaseOnCancel: the standby's first write comes
        after its next try and its start-up, and ours carry resourceVersions or uids."""
        log.info("stopped acting: releasing Lease %s/%s", self.namespace, self.name)
        try:
            released = await asyncio.wait_for(self.release(leases), timeout=timeout)
        except Exception as err:  # the API server gone: the standby waits out the duration instead
            log.warning("releasing Lease %s/%s failed: %s: %s", self.namespace, self.name, type(err).__name__, err)
            return
        if released:
            log.info("released Lease %s/%s: a standby takes it at its next try", self.namespace, self.name)
        else:
            log.info("Lease %s/%s not released: no longer ours, or changed meanwhile", self.namespace, self.name)


class Leadership:
    """The Lease held by this process, renewed from a daemon thread."""

    def __init__(self, renewal: threading.Thread, stop: threading.Event) -> None:
        self._renewal, self._stop = renewal, stop

    def step_down(self, timeout: float = 10) -> None:
        """Stop renewing and release the Lease; call once the operator has stopped acting."""
        self._stop.set()
        self._renewal.join(timeout)


def lead(namespace: str, name: str, identity: str, login: Callable[[], Endpoint],
         duration: int = 15) -> Leadership:
    """Block until this process holds the Lease, then keep it renewed from a daemon thread, which
    ends the process the moment the Lease is lost: nothing graceful, another replica may
    already be acting."""
    elector, stop = LeaseElector(namespace, name, identity, duration), threading.Event()

    async def acquire() -> None:
        async with Rest(login, max_connections=4) as rest:
            await elector.acquire(CoordinationLeases(rest))

    async def keep() -> bool:
        async with Rest(login, max_connections=4) as rest:
            return await elector.keep(CoordinationLeases(rest), stop)

    asyncio.run(acquire())

    def keep_or_exit() -> None:
        try:
            stepped_down = asyncio.run(keep())
        except BaseException:  # renewals ended by surprise: the Lease lapses under a still-acting operator
            log.exception("renewing Lease %s/%s stopped: exiting", namespace, name)
            stepped_down = stop.is_set()
        if not stepped_down:
            os._exit(1)

    renewal = threading.Thread(target=keep_or_exit, name="lease-renewal", daemon=True)
    renewal.start()
    return Leadership(renewal, stop)
