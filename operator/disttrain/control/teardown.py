"""Namespaces going away: a job in one gets no new pod, no status write and no event.

Kubernetes 1.36 deletes a namespace's pods before anything else (OrderedNamespaceDeletion) while
its DistTrainJobs still exist. Taken for lost pods, that restarted every job: measured with 30
running jobs, the operator wrote their status and recreated their pods, every create refused with
403 ("unable to create new content in namespace ... because it is being terminated"), retrying
with backoff until the jobs themselves were deleted (tests/chaos/test_namespace_teardown.py).

So before a reconcile acts, the operator asks whether the job's namespace is terminating: a GET
of the namespace, cached, and asked afresh when some of the job's pods are being deleted by
someone other than the operator (the namespace controller's first move). Without the right to get
namespaces (a chart installed with only namespaced Roles), the first create the API server
refuses for that reason marks the namespace instead, once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.decide.plan import Plan
from disttrain.decide.reasons import Reason
from disttrain.runtime.clock import Clock

log = logging.getLogger(__name__)
# How long an answer stands: a namespace seen active is asked again after this long (sooner when
# its pods are deleted from under a job), one seen terminating is left alone this long.
RECHECK_SECONDS = 5.0


class NamespaceAPI(Protocol):
    async def namespace_terminating(self, namespace: str) -> bool | None:
        """True if being deleted or gone, False if active, None if not allowed to ask."""
        ...


class Namespaces:
    def __init__(self, kube: NamespaceAPI, clock: Clock) -> None:
        self.kube, self.clock = kube, clock
        self.answers: dict[str, tuple[bool, float]] = {}  # namespace -> (terminating, when)
        self.allowed = True

    def mark(self, namespace: str) -> None:
        if not self.terminating_known(namespace):
            log.info("namespace %s is being deleted: its jobs get no new pods or status writes", namespace)
        self.answers[namespace] = (True, self.clock.monotonic())

    def terminating_known(self, namespace: str) -> bool:
        answer = self.answers.get(namespace)
        return answer is not None and answer[0] and self.clock.monotonic() - answer[1] < RECHECK_SECONDS

    async def terminating(self, namespace: str, fresh: bool = False) -> bool:
        """Whether `namespace` is going away: the cached answer, or (stale, or `fresh`) the API's."""
        answer = self.answers.get(namespace)
        now = self.clock.monotonic()
        if answer is not None and (answer[0] or not fresh) and now - answer[1] < RECHECK_SECONDS:
            return answer[0]
        if not self.allowed:
            return False
        found = await self.kube.namespace_terminating(namespace)
        if found is None:
            self.allowed = False  # asked once: a 403 per reconcile would be the very noise we avoid
            log.warning("no permission to get namespaces: a job in a namespace being deleted is noticed on the "
                        "first create the API server refuses (grant get on namespaces to avoid it)")
            return False
        if found:
            self.mark(namespace)
        else:
            self.answers[namespace] = (False, now)
        return found

    async def going_away(self, ref: JobRef, plan: Plan, current: Mapping[str, Any], pods: Iterable[ObservedPod],
                         ours: set[str]) -> bool:
        """Whether `plan` must not be carried out: it acts (creates, deletes, writes status or
        events) and the job's namespace is being deleted. `pods`: the job's pods as watched;
        `ours`: the uids of those the operator deleted itself."""
        if not (plan.create or plan.delete or plan.events or plan.status != current):
            return False
        ours = ours | set(current.get("deletedPods") or ())
        others = any(p.terminating and p.owner_uid == ref.uid and p.uid not in ours for p in pods)
        lost = any(e.reason in (Reason.POD_DELETED, Reason.PODS_NOT_RUNNING) for e in plan.events)
        return await self.terminating(ref.namespace, fresh=others or lost)

