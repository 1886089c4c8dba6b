"""The last step of every pass: the job's held GPU-seconds counted into `status.usage`, and when
that count must be written (the rule: decide/policies/usage.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.api.crd_usage import USES
from disttrain.api.status import Phase, micro_timestamp, true_since
from disttrain.api.times import epoch_seconds
from disttrain.decide.passes import Pass
from disttrain.decide.policies import usage

# How soon a count that holds a pod gone since the last write goes out: as the READY column's
# progress does (control/status_writes.py), so a 1,024-pod job's pods going make a write every
# 5 s, not one per pod.
DEPARTED_WRITE_SECONDS = 5.0
# How often a stalled job's count goes out: it makes no other write, and is the one whose GPUs'
# cost matters most to see growing; a minute's writes for each stalled job would be 12 an hour more.
STALLED_WRITE_SECONDS = 300.0


def count(p: Pass, stalled: str | None) -> None:
    """`stalled`: why the stall rule found the job stalled in this pass (None: it didn't)."""
    before = p.job.status.get("usage")
    before = before if isinstance(before, Mapping) else None
    if usage.finished_without_usage(Phase(p.job.status.get("phase") or Phase.PENDING), before):
        return
    resource, units = usage.units_by_type(p.spec)
    now = p.now.timestamp()
    since = epoch_seconds((before or {}).get("countedAt"))
    since = None if since is None else min(since, now)  # a countedAt ahead of the clock counts nothing twice
    seconds, unsettled = _kept(before), _number((before or {}).get("unsettledSeconds"))
    pods = [*p.own, *(d for d in p.job.departed if d.owner_uid == p.job.ref.uid)]
    phase = Phase(p.plan.status.get("phase") or Phase.PENDING)
    reached, redoing = _reached((before or {}).get("reached"), p.plan.status, phase)
    use = usage.use_of(phase, bool(p.plan.status.get("checkpoint")), stalled is not None and phase is Phase.RUNNING,
                       redoing)
    was = (before or {}).get("state")
    if was not in USES:  # a first count (an operator upgraded under the job): by the phase it was in
        was = usage.use_of(Phase(p.job.status.get("phase") or Phase.PENDING), bool(p.job.status.get("checkpoint")),
                           False, False)
    held = usage.held_between(pods, units, since, now)
    if was in usage.STEPPING and _steps_reported(p.plan.status):
        unsettled += held  # training or a stall, told when the step moves or the stall is found
    else:
        seconds[was] += held
    if unsettled and stalled is not None:
        seconds["stalled"] += unsettled  # stalled since its last new step
        unsettled = 0.0
    elif unsettled and (use != was or _moved(p.job.status, p.plan.status) or not _steps_reported(p.plan.status)):
        seconds[was] += unsettled
        unsettled = 0.0
    kept = before or {}
    if (before is not None and (kept.get("state"), kept.get("reached")) == (use, reached)
            and seconds == _kept(before) and unsettled == _number(kept.get("unsettledSeconds"))):
        return  # nothing held since, nothing new: the status stays as it is (a pass compares it)
    p.plan.status["usage"] = usage.counted(resource, seconds, unsettled, micro_timestamp(p.now), use, reached)
    _when_written(p, before, use, since)


def _when_written(p: Pass, before: Mapping[str, Any] | None, use: str, since: float | None) -> None:
    if before is not None and before.get("state") != use:
        p.plan.usage_write = 0.0
    elif any(d.ended_at is not None and (since is None or d.ended_at > since) for d in p.job.departed):
        p.plan.usage_write = DEPARTED_WRITE_SECONDS
    elif use == "stalled":
        # A hung job makes no other write: what it holds is shown growing, every STALLED_WRITE_SECONDS.
        p.plan.usage_write = STALLED_WRITE_SECONDS
        p.plan.requeue_within(STALLED_WRITE_SECONDS)


def _steps_reported(status: Mapping[str, Any]) -> bool:
    """Whether the training reports a step or an epoch (status.progress.advanced): only then can its
    Running seconds turn out to be a stall."""
    return bool((status.get("progress") or {}).get("advanced"))


def _moved(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether the training reported a new step (or epoch) in this pass."""
    def at(status: Mapping[str, Any]) -> Any:
        return ((status.get("progress") or {}).get("advanced") or {}).get("at")
    return bool(at(before) != at(after))


def _kept(before: Mapping[str, Any] | None) -> dict[str, float]:
    kept = (before or {}).get("seconds")
    return {name: _number((kept if isinstance(kept, Mapping) else {}).get(name)) for name in USES}


def _reached(kept: Any, status: Mapping[str, Any], phase: Phase) -> tuple[dict[str, Any] | None, bool]:
    """The furthest position the training reported, over all its attempts, and whether this attempt
    is short of it (redoing). The position shown is this attempt's once it was first seen after
    the attempt's pods all ran (status.progress.advanced)."""
    reached = dict(kept) if isinstance(kept, Mapping) and usage.position_key(kept) is not None else None
    if phase is not Phase.RUNNING:
        return reached, False
    progress = status.get("progress") or {}
    running = true_since(status, Phase.RUNNING.value)
    seen = epoch_seconds((progress.get("advanced") or {}).get("at"))
    here = usage.position_key(progress)
    ours = here is not None and running is not None and seen is not None and seen >= running.timestamp()
    if not ours:
        return reached, reached is not None
    assert here is not None
    top = usage.position_key(reached) if reached is not None else None
    if top is None or here >= top:
        return {k: progress[k] for k in ("epoch", "step") if progress.get(k) is not None}, False
    return reached, True


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else 0.0
