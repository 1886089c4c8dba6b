"""An MPI job's workers' GPUs through DRA claims (control/claims.py reads them, builders/claims.py
counts them): what the reconcile does with what was read.

- A claim that can't be counted (a GPU request of mode All, alternatives of different counts) or a
  GPU claim shared by several workers: the job fails naming it, before it is queued or started,
  since no pod of it could train as written.
- A claim object not there yet (applied with the job, a moment later): a job with no pods waits,
  saying for which object, and looks again every CLAIM_POLL_SECONDS. A job whose pods exist goes
  on: they hold their devices, and the count kept in its status stands.
- The count, once read, is kept in `status.claimedGPUsPerWorker`: an operator restarted after a
  claim object was deleted still builds the same hostfile.
"""

from __future__ import annotations

from disttrain.api.constants import CLAIMED_GPUS
from disttrain.api.status import Phase
from disttrain.decide.passes import Pass
from disttrain.decide.reasons import Reason

CLAIM_POLL_SECONDS = 5.0


def refuse_uncountable(p: Pass) -> bool:
    trouble = p.job.claims.trouble
    return trouble is not None and p.finish(Phase.FAILED, Reason.INVALID_SPEC, trouble)


def wait_for_claims(p: Pass) -> bool:
    missing = p.job.claims.missing
    if missing is None or p.own:
        return False
    p.plan.requeue_within(CLAIM_POLL_SECONDS)
    message = f"waiting for {missing}, which its workers' resourceClaims name, to be created"
    if p.plan.status.get("message") != message:
        p.move(Phase.PENDING, Reason.WAITING_FOR_CLAIMS, message)
    return True


def record(p: Pass) -> None:
    gpus = p.job.claims.gpus
    if gpus is not None and p.plan.status.get(CLAIMED_GPUS) != gpus:
        p.plan.status[CLAIMED_GPUS] = gpus
