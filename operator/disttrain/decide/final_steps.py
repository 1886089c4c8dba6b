"""The steps every pass ends with, whoever runs the job: what its pods reported of their training,
its stall, what its GPUs were used for, and its deletion once finished for ttlSecondsAfterFinished."""

from __future__ import annotations

from disttrain.api.status import FINISHED, Phase
from disttrain.decide import checkpoint_steps, progress, stall_steps, usage_steps
from disttrain.decide.passes import Pass
from disttrain.decide.policies import ttl


def report(p: Pass, stalled: stall_steps.Judged) -> None:
    """After the ladder, in this order: the progress the stall record goes into, the stall, a
    checkpoint request no stop needs any longer, the usage (by the use all of those leave), the TTL."""
    report_progress(p)
    stall_steps.report(p, stalled)
    checkpoint_steps.drop_when_not_stopping(p)
    usage_steps.count(p, stalled.why)
    delete_after_ttl(p)


def report_progress(p: Pass) -> None:
    """What the job's pods reported of their training (decide/progress.py)."""
    found, recheck = progress.progress_status(p.job.progress, p.job.status.get("progress"), p.phase, p.now)
    if found is not None:
        p.plan.status["progress"] = found
    if recheck is not None:
        p.plan.requeue_within(recheck)


def delete_after_ttl(p: Pass) -> None:
    if Phase(p.plan.status.get("phase") or Phase.PENDING) not in FINISHED:
        return
    remaining = ttl.ttl_remaining(p.spec.run_policy, p.plan.status.get("completionTime"), p.now)
    if remaining is None:
        return
    if remaining <= 0:
        p.plan.delete_job = True
    else:
        p.plan.requeue_within(remaining)
