"""The Stalled condition, its Warning event, and the restart runPolicy.onStall: Restart asks for
(the rule: decide/policies/stall.py).

The condition is True from the pass that finds the training stalled until its reported step
changes again, or the job leaves for Suspended, Queued or a finish. Through a restart for it
(Restarting, Pending, the new attempt's first step) it stays True: the job still has made no
progress, and the restart is the remedy under way; the new attempt's first new step clears it.
One status write at each edge, none between; the event comes with the edge to True.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disttrain.api.spec import OnStall
from disttrain.api.status import FINISHED, Phase, set_condition, timestamp, true_since
from disttrain.api.times import parse_timestamp
from disttrain.decide import progress
from disttrain.decide.passes import Pass
from disttrain.decide.plan import Event
from disttrain.decide.policies import failure, stall
from disttrain.decide.reasons import Reason

CONDITION = "Stalled"
LEFT_FOR = (Phase.SUSPENDED, Phase.QUEUED, *FINISHED)  # the condition ends with these phases


@dataclass(frozen=True)
class Judged:
    why: str | None  # the job is stalled, and why; None: it is not (or can't be told)
    record: Mapping[str, Any] | None  # status.progress.advanced for this pass (policies/stall.py advance)


NOT_JUDGED = Judged(None, None)  # a job finished or suspended: only its condition's end is reported


def judge(p: Pass) -> Judged:
    """Before the ladder: whether the job is stalled now; a look again when it would be."""
    before = p.job.status.get("progress") or {}
    current, _ = progress.progress_status(p.job.progress, before, p.phase, p.now)
    since = true_since(p.job.status, Phase.RUNNING.value)  # when its pods last all ran
    record = stall.advance(before.get("advanced"), before, current or {}, since, p.spec.run_policy)
    if p.phase is not Phase.RUNNING or p.stopping or p.job.status.get("checkpoint"):
        return Judged(None, record)  # a stop under way: the training is saving, not stepping
    why, recheck = stall.stalled(p.spec.run_policy, current, record, since, p.now)
    if recheck is not None:
        p.plan.requeue_within(recheck)
    return Judged(why, record)


def restart_decision(p: Pass, judged: Judged) -> failure.Restart | None:
    """runPolicy.onStall: Restart, for a stalled job: the whole job, through the same restart as a
    failure's (counted toward backoffLimit; past it, the job fails), to resume from its last
    checkpoint. No checkpoint is asked for first: a training that no longer steps can't save one."""
    if judged.why is None or p.spec.run_policy.on_stall is not OnStall.RESTART:
        return None
    return failure.decide(p.spec, p.restarts_so_far, p.kubelet_restarts, judged.why, 1, True,
                          Reason.TRAINING_STALLED)


def report(p: Pass, judged: Judged) -> None:
    """After the ladder and the progress: the record, the condition, and the event for a job that
    is left running."""
    found = p.plan.status.get("progress")
    if judged.record is not None and isinstance(found, dict):
        p.plan.status["progress"] = {**found, "advanced": dict(judged.record)}
    conditions = list(p.plan.status.get("conditions") or [])
    was = next((c for c in conditions if c.get("type") == CONDITION), None)
    stalled_before = was is not None and was.get("status") == "True"
    now = timestamp(p.now)
    # Restarting for it: carry_out moved the job, with a Warning event of its own. Any other move in
    # the same pass (succeeded, failed on a pod, evicted) outranks the stall.
    restarting = p.phase is Phase.RESTARTING and p.plan.status.get("reason") == Reason.TRAINING_STALLED
    if judged.why is not None and (p.phase is Phase.RUNNING or restarting):
        if stalled_before and not restarting:
            return  # as first found: its words (a derived timeout, the reporter) never rewrite the status
        report_only = p.spec.run_policy.on_stall is OnStall.REPORT
        action = ("runPolicy.onStall is Report: its pods are left running" if report_only
                  else "runPolicy.onStall is Restart: the whole job restarts")
        message = f"{judged.why}; {action}"
        p.plan.status["conditions"] = set_condition(conditions, CONDITION, True, Reason.STALLED, message, now)
        if not stalled_before and report_only:  # a restart's own Warning event says it otherwise
            p.plan.events.append(Event("Warning", Reason.STALLED, message))
        return
    if not stalled_before:
        return
    assert was is not None
    if p.phase in LEFT_FOR:
        p.plan.status["conditions"] = set_condition(
            conditions, CONDITION, False, str(p.plan.status.get("reason") or p.phase.value),
            f"the job is {p.phase.value}", now)
        return
    record = judged.record or {}
    advanced = parse_timestamp(record.get("at"))
    since = parse_timestamp(was.get("lastTransitionTime"))
    if advanced is not None and since is not None and advanced > since:
        where = stall.position(record) or "a new step"
        p.plan.status["conditions"] = set_condition(
            conditions, CONDITION, False, Reason.TRAINING_ADVANCED,
            f"the training reported {where} at {timestamp(advanced)}", now)

