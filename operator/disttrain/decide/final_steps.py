"""The steps every pass ends with, whoever runs the job: what its pods reported of their training,
and its deletion once finished for ttlSecondsAfterFinished."""

from __future__ import annotations

from disttrain.api.status import FINISHED, Phase
from disttrain.decide import progress
from disttrain.decide.passes import Pass
from disttrain.decide.policies import ttl


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
