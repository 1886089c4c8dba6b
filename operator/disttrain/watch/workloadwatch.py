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

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from disttrain.api.constants import JOB_NAME_LABEL
from disttrain.apiserver.rest import Rest
from disttrain.apiserver.wire import event_decoder, page_decoder
from disttrain.decide.queueing import KUEUE_API, ObservedWorkload, observe_workload
from disttrain.watch.by_job import ByJob, JobKey, Listed
from disttrain.watch.reflector import Reflector, Resource

# Workloads are small, and queueing reads much of one: decoded whole (observe_workload keeps its part).
decode_event = event_decoder(dict[str, Any], lambda workload: workload)
decode_list = page_decoder(dict[str, Any], lambda workload: workload)


WORKLOADS = Resource(KUEUE_API, "workloads", JOB_NAME_LABEL, decode_list, decode_event, optional=True)


class WorkloadWatch:
    def __init__(self, rest: Rest, namespaces: Iterable[str], changed: Callable[[JobKey], None]) -> None:
        self.changed = changed
        self.view: ByJob[ObservedWorkload] = ByJob()  # the index the controller reads
        self.reflector: Reflector[Listed[ObservedWorkload]] = Reflector(rest, WORKLOADS, namespaces, self._hold,
                                                                        self._replace, self._apply)
        self.synced = self.reflector.synced

    async def run(self) -> None:
        await self.reflector.run()

    def _key(self, meta: Mapping[str, Any]) -> JobKey | None:
        name = (meta.get("labels") or {}).get(JOB_NAME_LABEL)
        namespace = meta.get("namespace", "")
        return (namespace, name) if name and self.reflector.keeps(namespace) else None

    def _hold(self, workload: Mapping[str, Any]) -> Listed[ObservedWorkload] | None:
        meta = workload.get("metadata") or {}
        key = self._key(meta)
        return None if key is None else (key, str(meta.get("uid", "")), observe_workload(workload))

    def _replace(self, scope: str | None, listed: list[Listed[ObservedWorkload]]) -> None:
        for key in self.view.replace(scope, listed):
            self.changed(key)

    def _apply(self, kind: str, workload: Mapping[str, Any]) -> None:
        meta = workload.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        key = None if kind == "DELETED" else self._key(meta)
        left, changed = self.view.apply(uid, key, observe_workload(workload))
        if left is not None:
            self.changed(left)
        if changed and key is not None:
            self.changed(key)
