"""Pod creates the API server refuses for a reason that may pass: admission says no (403).

A ResourceQuota exceeded, a PriorityClass that doesn't exist yet, a PodSecurity level the
template violates, an admission webhook's veto: the pod is valid (a 422 fails the job:
InvalidPodTemplate) but may not be made now. Found by the API fuzz (tests/chaos/
test_fuzz_manifests.py): runPolicy.priorityClassName naming no PriorityClass made the operator
retry the create with a traceback on every attempt. As the Job controller does (a FailedCreate
event, then retries with backoff), the job waits: status reason PodCreateRefused with the API
server's words, one Warning event per new refusal, and creates tried again after a backoff that
doubles up to five minutes. The job's own status write carries the reason, so it doesn't flip
back on the next reconcile.
"""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.decide.plan import Plan
from disttrain.decide.reasons import Reason

FIRST_BACKOFF_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 300.0


@dataclass(frozen=True)
class Refusal:
    reason: Reason  # PodCreateRefused, or CreateRefused for a supporting object
    message: str  # "<kind> <name> can't be created: <which refusal it was>: <the API server's message>"
    retry_at: float  # monotonic seconds
    backoff: float


def refused(previous: Refusal | None, reason: Reason, message: str, now: float) -> Refusal:
    """The refusal just met, retried after the backoff (doubled from the last one's)."""
    backoff = FIRST_BACKOFF_SECONDS if previous is None else min(previous.backoff * 2, MAX_BACKOFF_SECONDS)
    return Refusal(reason, message, now + backoff, backoff)


def hold(refusal: Refusal | None, plan: Plan, now: float) -> Plan:
    """`plan` without its creates while a refusal's backoff runs, saying why in its status (the
    supporting objects come first: a refused Secret holds back the pods that mount it)."""
    if refusal is None or not plan.create:
        return plan
    say_why(plan, refusal)
    if now < refusal.retry_at:
        plan.create = []
        plan.requeue_within(refusal.retry_at - now)
    return plan


def passed(refusal: Refusal | None, plan: Plan) -> bool:
    """After a pass whose creates all succeeded: whether they were what `refusal` held back, tried once
    its backoff ran out (`hold` empties `plan.create` until then), or, for a supporting object's
    refusal, a lost one restored. A ConfigMap restored within a pod's backoff says nothing of the quota
    that refused the pod: forgetting the refusal then cost 8 refused creates and a backoff from 5 s again."""
    return refusal is not None and (bool(plan.create) or (bool(plan.restore)
                                                          and refusal.reason is Reason.CREATE_REFUSED))


def say_why(plan: Plan, refusal: Refusal) -> None:
    plan.status["reason"] = refusal.reason.value
    plan.status["message"] = refusal.message
