"""What the controller reads and writes of Kueue for queued jobs (`queueing` builds, purely).

Reads: the job's Workload comes from the operator's watch (an index, no request); the
ResourceFlavors of an admission and a WorkloadPriorityClass's value are read when needed, each
remembered for a minute. A job without the queue label costs nothing, and a cluster without Kueue
sees no request about it. A job whose label was removed while it had a Workload is followed by
that Workload (its controller reference) until the Workload is deleted (queue_steps.leave).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from disttrain.api.constants import FIELD_MANAGER
from disttrain.api.objects import JobRef
from disttrain.apiserver.rest import ApiError
from disttrain.decide.passes import JobState
from disttrain.decide.plan import Plan, WorkloadOp
from disttrain.decide.queueing import (
    KUEUE_API,
    PRIORITY_LABEL,
    Flavor,
    ObservedWorkload,
    QueueState,
    prebuilt_workload,
    queue_name,
)
from disttrain.runtime.clock import Clock

CACHE_SECONDS = 60.0
UNREADABLE_RETRY_SECONDS = 5.0
WORKLOADS_UNLISTED_RETRY = 2.0  # seconds: how soon a queued job looks again while the Workloads haven't listed
log = logging.getLogger(__name__)


class QueueAPI(Protocol):
    async def create(self, obj: Mapping[str, Any]) -> str | None: ...
    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None: ...
    async def delete(self, obj: Mapping[str, Any], uid: str) -> None: ...
    async def patch(self, obj: Mapping[str, Any], body: Mapping[str, Any], *, status: bool = False,
                    apply: bool = False, manager: str = FIELD_MANAGER) -> None: ...
    async def json_patch(self, obj: Mapping[str, Any], operations: list[Mapping[str, Any]]) -> None: ...


class Queues:
    def __init__(self, kube: QueueAPI, clock: Clock) -> None:
        self.kube, self.clock = kube, clock
        self._cache: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}
        self.unshrinkable: set[str] = set()  # Workload uids whose shrink Kueue refused (_shrink)
        self.listed: Callable[[], bool] = lambda: True  # whether the Workload watch has listed

    def waiting_for_workloads(self, meta: Mapping[str, Any]) -> bool:
        """A queued job (or MultiKueue's worker copy of one) while the Workloads have not listed: read
        against them, its Workload would look gone and its running pods be stopped (queue_steps.py),
        so its pass waits (issue 45's review). Other jobs don't wait on Kueue's API. No log line: the
        Workload watch says what keeps it from listing (watch/reflector.py)."""
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        return not self.listed() and (queue_name(labels) is not None
                                      or prebuilt_workload(labels, annotations) is not None)

    async def observe(self, job: JobState, labels: Mapping[str, str], annotations: Mapping[str, str],
                      workloads: Iterable[ObservedWorkload]) -> JobState:
        state = self.state_of(job, labels, annotations, workloads)
        if state is None:
            return job
        workload = state.workload
        try:
            if workload is not None and workload.admitted:
                names = {f for assigned in workload.assignments.values() for f in assigned.values()}
                state = dataclasses.replace(state, flavors={n: await self.flavor(n) for n in sorted(names)})
            if labels.get(PRIORITY_LABEL):  # made with it, and followed after (queue_steps.follow_queue)
                state = dataclasses.replace(state, priority=await self.priority(labels[PRIORITY_LABEL]))
        except Exception as err:  # optional to the pass: only its pods and Workload need what it reads
            said = f"{type(err).__name__}: {err}"
            log.warning("%s/%s: could not read Kueue's flavors or priority (%s); its pods and Workload wait",
                        job.ref.namespace, job.ref.name, said)
            state = dataclasses.replace(state, unreadable=said)
        return dataclasses.replace(job, queue=state)

    @staticmethod
    def state_of(job: JobState, labels: Mapping[str, str], annotations: Mapping[str, str],
                 workloads: Iterable[ObservedWorkload]) -> QueueState | None:
        """The job's queue and Workload; None for a job outside any queue."""
        queue = queue_name(labels)
        if queue is None:
            # Without the label, a Workload of its own (its controller reference carries the job's
            # UID) means the job left its queue: queue_steps.leave deletes it once the pods are
            # gone. Issue 43: looked for only under the label, a job that dropped it while
            # suspending after a preemption kept the evicted Workload's quota (QuotaReserved=True)
            # for ever, and the preemptor never ran.
            own = next((w for w in workloads if w.owner_uid == job.ref.uid), None)
            return None if own is None else QueueState(own.queue_name, own, leaving=True)
        # MultiKueue's copy on a worker cluster: the Workload it made first, adopted by name.
        prebuilt = prebuilt_workload(labels, annotations)
        workload = next((w for w in workloads if (w.name == prebuilt if prebuilt else w.owner_uid == job.ref.uid)),
                        None)
        return QueueState(queue, workload, prebuilt=prebuilt)

    async def _shrink(self, ref: JobRef, target: dict[str, Any], op: WorkloadOp) -> None:
        """A Workload's count lowered in place, or, where Kueue refuses it (its webhook allows it
        only with ElasticJobsViaWorkloadSlices, beta and on in v0.19), left as it is: the job keeps
        its quota until it ends, as before, and is not held up by the refusal. Said once a Workload."""
        if op.uid in self.unshrinkable:
            return
        try:
            await self.kube.json_patch(target, op.body["patch"])
        except ApiError as err:
            if err.status in (409, 429) or err.status >= 500:
                raise  # a race or the API server's trouble: the next pass tries again
            self.unshrinkable.add(op.uid)
            log.warning("%s/%s: Kueue refused to lower Workload %s's worker count (%s); it keeps its quota until "
                        "the job ends", ref.namespace, ref.name, op.name, err)

    async def flavor(self, name: str) -> Flavor:
        found = await self._read("ResourceFlavor", name) or {}
        spec = found.get("spec") or {}
        return Flavor(dict(spec.get("nodeLabels") or {}), list(spec.get("tolerations") or []))

    async def priority(self, name: str) -> tuple[str, int] | None:
        found = await self._read("WorkloadPriorityClass", name)
        return None if found is None else (name, int(found.get("value") or 0))

    async def _read(self, kind: str, name: str) -> dict[str, Any] | None:
        now = self.clock.monotonic()
        cached = self._cache.get((kind, name))
        if cached is None or now - cached[0] > CACHE_SECONDS:
            cached = (now, await self.kube.get({"apiVersion": KUEUE_API, "kind": kind, "metadata": {"name": name}}))
            self._cache[(kind, name)] = cached
        return cached[1]

    @staticmethod
    def hold_unreadable(job: JobState, plan: Plan) -> Plan:
        """Without what Kueue's objects said (a read failed), no pod is made (it would lack the
        flavor's node labels) and no Workload written (it would lack its priority): looked at again
        soon. Everything else the pass decided stands."""
        if job.queue is not None and job.queue.unreadable is not None:
            plan.create = [o for o in plan.create if o["kind"] != "Pod"]
            plan.workload = []
            plan.requeue_within(UNREADABLE_RETRY_SECONDS)
        return plan

    async def write(self, ref: JobRef, ops: list[WorkloadOp]) -> None:
        for op in ops:
            target = {"apiVersion": KUEUE_API, "kind": "Workload",
                      "metadata": {"name": op.name, "namespace": ref.namespace}}
            if op.verb == "create":
                await self.kube.create(op.body)
            elif op.verb == "delete":
                await self.kube.delete(target, op.uid)
            elif op.verb == "condition":
                # Server-side apply of this one condition: Kueue applies its own the same way, and
                # the conditions list merges by type. A field manager per condition type: an apply
                # drops what its manager applied before and omits now, so one manager applying
                # Finished after PodsReady left PodsReady with its type alone, and the API server
                # refused the Workload (422, "status.conditions[5].status: Required value": a
                # preempted job that finished, tests/e2e).
                await self.kube.patch(target, {**target, "status": {"conditions": [op.body]}}, status=True,
                                      apply=True, manager=f"{FIELD_MANAGER}-{str(op.body['type']).lower()}")
            elif op.verb in ("adopt", "update"):  # metadata, or the queue and priority it follows
                await self.kube.patch(target, op.body)
            elif op.verb == "json-patch":  # a podSet's count lowered in place (queue_steps.shrink)
                await self._shrink(ref, target, op)
            elif op.verb == "release":
                body = {"metadata": {"resourceVersion": op.resource_version}, "status": op.body}
                await self.kube.patch(target, body, status=True)
            else:  # active
                await self.kube.patch(target, {"spec": op.body})
