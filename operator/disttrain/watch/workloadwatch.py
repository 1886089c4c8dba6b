"""Where Kueue's Workloads come in: the operator's own list+watch (reflector.py) of those labelled
with a job's name, reduced to what queueing reads (decide/queueing.py, ObservedWorkload).

kopf followed them until issue 45. Ours for the reason jobs and pods are (jobwatch.py), and one
more: a queued job is reconciled only once the Workloads have listed (controller.py). Read before
its Workload is known, it reads as one whose Workload is gone, and its running pods are stopped
(queue_steps.py); kopf's index was bound only in its own handlers, which a job watch of our own no
longer waited for (a restarted operator did just that: tests/integration/test_kueue.py).

Without Kueue the resource is not served: a 404 that discovery confirms counts as listed, and it
is looked for again each minute (reflector.py, `optional`), so a Kueue installed later is followed
without a restart. Nothing held is ever dropped but by a list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec

from disttrain.api.constants import JOB_NAME_LABEL
from disttrain.apiserver.rest import Rest
from disttrain.decide.queueing import KUEUE_API, ObservedWorkload, observe_workload
from disttrain.watch.reflector import Reflector, Resource

JobKey = tuple[str, str]
Listed = tuple[JobKey, str, ObservedWorkload]  # a Workload of a job: its job's key, its uid, what is held


class _Event(msgspec.Struct):
    type: str
    object: dict[str, Any]


class _ListMetadata(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _WorkloadList(msgspec.Struct):
    items: list[dict[str, Any]] | None = None
    metadata: _ListMetadata = msgspec.field(default_factory=_ListMetadata)


_events = msgspec.json.Decoder(_Event)
_lists = msgspec.json.Decoder(_WorkloadList)


def decode_event(line: bytes) -> tuple[str, Any]:
    event = _events.decode(line)
    return event.type, event.object


def decode_list(page: bytes) -> tuple[list[dict[str, Any]], str, str]:
    found = _lists.decode(page)
    return found.items or [], found.metadata.resourceVersion, found.metadata.continue_


WORKLOADS = Resource(KUEUE_API, "workloads", JOB_NAME_LABEL, decode_list, decode_event, optional=True)


class WorkloadsByJob(Mapping[JobKey, Iterable[ObservedWorkload]]):
    """The index the controller reads: a job's key -> the Workloads labelled with its name."""

    def __init__(self, held: dict[JobKey, dict[str, ObservedWorkload]]) -> None:
        self._held = held

    def __getitem__(self, key: JobKey) -> Iterable[ObservedWorkload]:
        return self._held[key].values()

    def __iter__(self) -> Iterator[JobKey]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


class WorkloadWatch:
    def __init__(self, rest: Rest, namespaces: Iterable[str], changed: Callable[[JobKey], None]) -> None:
        self.changed = changed
        self.held: dict[JobKey, dict[str, ObservedWorkload]] = {}
        self.where: dict[str, JobKey] = {}  # uid -> job: a Workload whose label changes is found
        self.view = WorkloadsByJob(self.held)
        self.reflector: Reflector[Listed] = Reflector(rest, WORKLOADS, namespaces, self._hold, self._replace,
                                                      self._apply)
        self.synced = self.reflector.synced

    async def run(self) -> None:
        await self.reflector.run()

    def _key(self, meta: Mapping[str, Any]) -> JobKey | None:
        name = (meta.get("labels") or {}).get(JOB_NAME_LABEL)
        namespace = meta.get("namespace", "")
        return (namespace, name) if name and self.reflector.keeps(namespace) else None

    def _hold(self, workload: Mapping[str, Any]) -> Listed | None:
        meta = workload.get("metadata") or {}
        key = self._key(meta)
        return None if key is None else (key, str(meta.get("uid", "")), observe_workload(workload))

    def _replace(self, scope: str | None, listed: list[Listed]) -> None:
        found: dict[JobKey, dict[str, ObservedWorkload]] = {}
        for key, uid, observed in listed:
            found.setdefault(key, {})[uid] = observed
        for key in [k for k in self.held if scope is None or k[0] == scope]:
            for uid in self.held[key]:
                self.where.pop(uid, None)
            if key not in found:
                del self.held[key]
                self.changed(key)
        for key, workloads in found.items():
            self.where.update(dict.fromkeys(workloads, key))
            if self.held.get(key) != workloads:
                self.held[key] = workloads
                self.changed(key)

    def _apply(self, kind: str, workload: Mapping[str, Any]) -> None:
        meta = workload.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        key = None if kind == "DELETED" else self._key(meta)
        held_at = self.where.get(uid)
        if held_at is not None and held_at != key:  # deleted, or its job-name label changed
            workloads = self.held[held_at]
            del workloads[uid], self.where[uid]
            if not workloads:
                del self.held[held_at]
            self.changed(held_at)
        if key is None:
            return
        observed = observe_workload(workload)
        workloads = self.held.setdefault(key, {})
        if workloads.get(uid) != observed:
            workloads[uid], self.where[uid] = observed, key
            self.changed(key)
