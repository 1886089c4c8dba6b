"""The last step of every pass: the job's held GPU-seconds counted into `status.usage`, and when
that count must be written (the rule: decide/policies/usage.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.api.crd_usage import USES
from disttrain.api.observed import ObservedPod
from disttrain.api.status import Phase, micro_timestamp, true_since
from disttrain.api.times import epoch_seconds
from disttrain.decide.passes import Pass
from disttrain.decide.policies import usage

# How soon a count that holds a pod gone since the last write goes out: as the READY column's
# progress does (control/status_writes.py), so a 1,024-pod job's pods going make a write every
# 5 s, not one per pod.
DEPARTED_WRITE_SECONDS = 5.0


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
    seconds = _kept(before)
    pods = [*p.own, *(d for d in p.job.departed if d.owner_uid == p.job.ref.uid)]
    phase = Phase(p.plan.status.get("phase") or Phase.PENDING)
    reached, redoing = _reached((before or {}).get("reached"), p.plan.status, phase)
    use = usage.use_of(phase, bool(p.plan.status.get("checkpoint")), stalled is not None and phase is Phase.RUNNING,
                       redoing)
    was = (before or {}).get("state")
    if was not in USES:  # a first count (an operator upgraded under the job): by the phase it was in
        was = usage.use_of(Phase(p.job.status.get("phase") or Phase.PENDING), bool(p.job.status.get("checkpoint")),
                           False, False)
    seconds[was] += usage.held_between(pods, units, since, now)
    if stalled is not None and was in ("training", "redone"):
        _move_stall(p, pods, units, seconds, was)
    unchanged = before is not None and (before.get("state"), before.get("reached")) == (use, reached)
    if unchanged and seconds == _kept(before):
        return  # nothing held since, nothing new: the status stays as it is (a pass compares it)
    p.plan.status["usage"] = usage.counted(resource, seconds, micro_timestamp(p.now), use, reached)
    if before is not None and before.get("state") != use:
        p.plan.usage_write = 0.0
    elif any(d.ended_at is not None and (since is None or d.ended_at > since) for d in p.job.departed):
        p.plan.usage_write = DEPARTED_WRITE_SECONDS


def _move_stall(p: Pass, pods: list[ObservedPod], units: Mapping[str, float], seconds: dict[str, float],
                was: str) -> None:
    """A stall found now began at the training's last new step (or its pods' start, if none since):
    what was counted as `was` since then moves to stalled."""
    now = p.now.timestamp()
    advanced = epoch_seconds(((p.plan.status.get("progress") or {}).get("advanced") or {}).get("at"))
    running = true_since(p.job.status, Phase.RUNNING.value)  # as the stall was judged: a restart for it ends it
    start = max(advanced or now, running.timestamp() if running else now)
    moved = min(seconds[was], usage.held_between(pods, units, start, now))
    seconds[was] -= moved
    seconds["stalled"] += moved


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
