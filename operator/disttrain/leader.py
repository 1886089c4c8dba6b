"""Leader election on a coordination.k8s.io Lease, as client-go controllers do it.

With several replicas only the Lease holder runs the operator; the others wait and take the
Lease once it has not been renewed for its duration. A holder that cannot renew in time exits
(its pod restarts and queues up as a standby) rather than risk two active operators.

kopf's own peering was tried first and dropped: replicas with equal priorities all pause, and
in our tests a second replica often saw no peering events for a minute or more.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import threading
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from disttrain.kube import new_api_client

log = logging.getLogger(__name__)
MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _micro(moment: datetime.datetime) -> str:
    return moment.strftime(MICRO)


class LeaseElector:
    def __init__(self, namespace: str, name: str, identity: str, duration: int = 15) -> None:
        self.namespace, self.name, self.identity, self.duration = namespace, name, identity, duration

    async def _try(self, api: Any) -> bool:
        """One attempt to take or keep the Lease; True if we hold it afterwards."""
        now = _now()
        try:
            lease = await api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            try:
                await api.create_namespaced_lease(self.namespace, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                             "acquireTime": _micro(now), "renewTime": _micro(now), "leaseTransitions": 0}})
            except ApiException as create_err:
                if create_err.status == 409:  # another replica was faster
                    return False
                raise
            return True
        body: dict[str, Any] = api.api_client.sanitize_for_serialization(lease)
        spec = body.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = lease.spec.renew_time or now
        expired = now - renewed > datetime.timedelta(seconds=int(spec.get("leaseDurationSeconds") or self.duration))
        if holder not in (self.identity, None, "") and not expired:
            return False
        new_spec = dict(spec, holderIdentity=self.identity, leaseDurationSeconds=self.duration,
                        renewTime=_micro(now))
        if holder != self.identity:
            new_spec.update(acquireTime=_micro(now), leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        body["spec"] = new_spec
        try:
            # The resourceVersion in `body` makes this a compare-and-swap: of two replicas
            # taking an expired Lease at once, one wins.
            await api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def acquire(self) -> None:
        async with await new_api_client(4) as api_client:
            api = client.CoordinationV1Api(api_client)
            announced = False
            while True:
                try:
                    if await self._try(api):
                        log.info("became the leader (Lease %s/%s) as %s", self.namespace, self.name, self.identity)
                        return
                except ApiException as err:
                    log.warning("leader election: %s", err.reason)
                if not announced:
                    log.info("standing by: another replica holds Lease %s/%s", self.namespace, self.name)
                    announced = True
                await asyncio.sleep(2)

    async def keep(self) -> None:
        """Renew every third of the duration; exit the process if the Lease can't be kept."""
        async with await new_api_client(4) as api_client:
            api = client.CoordinationV1Api(api_client)
            last_renewed = _now()
            while True:
                await asyncio.sleep(self.duration / 3)
                try:
                    if await self._try(api):
                        last_renewed = _now()
                        continue
                    log.error("lost Lease %s/%s to another replica: exiting", self.namespace, self.name)
                except Exception:
                    log.warning("renewing Lease %s/%s failed", self.namespace, self.name, exc_info=True)
                    if _now() - last_renewed < datetime.timedelta(seconds=self.duration * 2 / 3):
                        continue
                    log.error("could not renew Lease %s/%s in time: exiting", self.namespace, self.name)
                os._exit(1)  # nothing graceful: another replica may already be acting


def lead(namespace: str, name: str, identity: str, duration: int = 15) -> None:
    """Block until this process holds the Lease, then keep it renewed from a daemon thread."""
    elector = LeaseElector(namespace, name, identity, duration)
    asyncio.run(elector.acquire())
    threading.Thread(target=lambda: asyncio.run(elector.keep()), name="lease-renewal", daemon=True).start()
