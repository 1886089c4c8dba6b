"""What the controller reads and deletes of gang groups (`gang` builds them, purely).

- Which gang-scheduling APIs the cluster serves, from discovery, until a job has chosen its
  provider (Auto); read at most once a minute.
- A Volcano group's phase, until its pods exist: pods are made once Volcano has taken the group
  into its queue (`gang.admitted`).
- Deleting a finished, suspended or restarting job's group, once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from disttrain.api.objects import JobRef, is_controlled_by
from disttrain.api.spec import GangProvider
from disttrain.api.status import FINISHED, Phase
from disttrain.builders import gang
from disttrain.builders.gang import GroupStatus
from disttrain.decide.passes import JobState
from disttrain.runtime.clock import Clock

log = logging.getLogger(__name__)

# How long discovery's answer (which gang-scheduling APIs are served) is trusted.
GANG_API_TTL_SECONDS = 60.0


class GroupAPI(Protocol):
    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...
    async def get_metadata(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...
    async def delete(self, obj: Mapping[str, Any], uid: str) -> None: ...
    async def served_group_versions(self) -> set[str]: ...


class Groups:
    def __init__(self, kube: GroupAPI, clock: Clock) -> None:
        self.kube, self.clock = kube, clock
        self.released: set[tuple[str, str, str]] = set()  # (job uid, kind, name) deleted
        self._served: tuple[float, frozenset[str]] | None = None  # (when read, gang APIs served)

    def forget(self, uid: str) -> None:
        """The job is gone, or its group made again: it may be released (again)."""
        self.released = {r for r in self.released if r[0] != uid}

    async def observe(self, job: JobState) -> JobState:
        """`job` with what reconciling its gang needs of the cluster."""
        settings = job.spec.run_policy.scheduling.gang
        if settings is None or Phase(job.status.get("phase") or Phase.PENDING) in FINISHED:
            return job
        chosen = (job.status.get("gang") or {}).get("provider")
        if chosen is None:
            return dataclasses.replace(job, gang_apis=await self.served())
        if chosen == GangProvider.KUBERNETES:  # its version may have changed under it (decide/passes.py, gang_api)
            try:
                job = dataclasses.replace(job, gang_apis=await self.served())
            except Exception as err:  # discovery failed: the version kept in its status stands
                log.warning("%s/%s: could not read which gang APIs are served (%s: %s); using %s",
                            job.ref.namespace, job.ref.name, type(err).__name__, err,
                            (job.status.get("gang") or {}).get("apiVersion"))
        if chosen == GangProvider.VOLCANO and job.status.get("phase") != Phase.RUNNING:
            group = gang.objects(job.ref, job.spec, settings, GangProvider.VOLCANO)[0]
            try:
                found = await self.kube.get(group)
            except Exception as err:  # optional: the pass goes on, its pods wait for the group
                log.warning("%s/%s: could not read PodGroup %s (%s: %s); its pods wait as if it were not admitted",
                            job.ref.namespace, job.ref.name, group["metadata"]["name"], type(err).__name__, err)
                return job
            if found is not None:
                return dataclasses.replace(job, group=volcano_status(found))
        return job

    def forget_served(self) -> None:
        """A group's create found its API version not served (1.37 removed v1alpha2 under a running
        operator): the next pass reads what is served now, not within the TTL."""
        self._served = None

    async def served(self) -> frozenset[str]:
        """The gang APIs (group/versions) the cluster serves, looked up again after a TTL."""
        now = self.clock.monotonic()
        if self._served is None or now - self._served[0] > GANG_API_TTL_SECONDS:
            versions = await self.kube.served_group_versions()
            self._served = (now, frozenset(api for p in gang.API for api in gang.apis(p) if api in versions))
        return self._served[1]

    async def release(self, ref: JobRef, objects: list[dict[str, Any]]) -> bool:
        """Delete the job's group objects (only ours, once); True if anything was released now."""
        released = False
        for obj in objects:
            memo = (ref.uid, obj["kind"], obj["metadata"]["name"])
            if memo in self.released:
                continue
            meta = await self.kube.get_metadata(obj)
            if meta is not None and is_controlled_by(meta, ref):
                await self.kube.delete(obj, str(meta["uid"]))
            self.released.add(memo)
            released = True
        return released


def volcano_status(group: Mapping[str, Any]) -> GroupStatus:
    status = group.get("status") or {}
    said = [c.get("message") or c.get("reason") or "" for c in status.get("conditions") or []
            if c.get("status") == "True" and c.get("type") == "Unschedulable"]
    return GroupStatus(str(status.get("phase") or "Pending"), "; ".join(said))
