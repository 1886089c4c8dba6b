"""The last step of every pass: the job's held GPU-seconds counted into `status.usage`, and when
that count must be written (the rule: decide/policies/usage.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disttrain.api.constants import CLAIMED_GPUS
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
# How long a count may go unwritten while the job holds GPUs and makes no other write: a stalled job
# (the one whose cost matters most to see growing), and any other (a training that reports nothing is
# otherwise counted only at its transitions, and what its pods held since is lost if one goes unseen:
# a watch's gap, an operator down). Measured from the last count written, so a restarted operator
# doesn't write every job at once; a job that writes its progress never reaches them.
STALLED_WRITE_SECONDS = 300.0
IDLE_WRITE_SECONDS = 1800.0
# Uses the pass's other writes don't show: a change between them rides with the next write.
QUIET_CHANGES = frozenset({frozenset({"training", "redone"})})


def count(p: Pass, stalled: str | None) -> None:
    """`stalled`: why the stall rule found the job stalled in this pass (None: it didn't)."""
    before = p.job.status.get("usage")
    before = before if isinstance(before, Mapping) else None
    if usage.finished_without_usage(Phase(p.job.status.get("phase") or Phase.PENDING), before):
        return
    kept = before or {}
    resource, units = usage.units_by_type(p.spec, p.job.status.get(CLAIMED_GPUS))
    if kept.get("resource") not in (None, resource) and (any(_kept(before).values()) or kept.get("unsettledSeconds")):
        units = {}  # counted in one resource for good: a job's can't be told now (its claims unread) counts nothing
    now, since = p.now.timestamp(), _since(kept, p.now.timestamp())
    seconds, unsettled = _kept(before), _number(kept.get("unsettledSeconds"))
    pods = _held_by(p)
    phase = Phase(p.plan.status.get("phase") or Phase.PENDING)
    reached, short = _reached(kept.get("reached"), p.job.status, p.plan.status)
    redoing = short and phase is Phase.RUNNING
    use = usage.use_of(phase, bool(p.plan.status.get("checkpoint")), stalled is not None and phase is Phase.RUNNING,
                       redoing)
    was = str(kept["state"]) if kept.get("state") in USES else _first_use(p)
    advanced = _advanced_at(p.plan.status, now)
    if was in (*usage.STEPPING, "stalled") and advanced is not None and (since is None or _moved(p)):
        # A new step since the last count, told by its report's own time however late the pass or the
        # write: the seconds before it were `was`'s (training, redone, or stalled), those after it the
        # new step's, unsettled until the next one or a stall. (A report dated before the last count:
        # one that came in while that pass ran, or within its second: from the count on.)
        split = advanced if since is None else max(advanced, since)
        seconds[was] += usage.held_between(pods, units, since, split) + (unsettled if was != "stalled" else 0.0)
        unsettled = usage.held_between(pods, units, split, now)
        was = "redone" if short else "training"
    elif was in usage.STEPPING and advanced is not None:
        unsettled += usage.held_between(pods, units, since, now)
    else:
        seconds[was] += usage.held_between(pods, units, since, now)
    if unsettled and stalled is not None:
        seconds["stalled"] += unsettled  # stalled since its last new step
        unsettled = 0.0
    elif unsettled and (use not in usage.STEPPING or advanced is None):
        seconds[was] += unsettled
        unsettled = 0.0
    if (before is not None and (kept.get("state"), kept.get("reached")) == (use, reached)
            and seconds == _kept(before) and unsettled == _number(kept.get("unsettledSeconds"))):
        return  # nothing held since, nothing new: the status stays as it is (a pass compares it)
    p.plan.status["usage"] = usage.counted(resource if units else kept.get("resource", resource), seconds,
                                           unsettled, micro_timestamp(p.now), use, reached)
    _when_written(p, kept.get("state", use), use, since, units)


def _since(kept: Mapping[str, Any], now: float) -> float | None:
    """When the status last counted up to; None for a first count."""
    since = epoch_seconds(kept.get("countedAt"))
    if since is None and kept.get("seconds"):
        return now  # counted before, its time unreadable (a status writer's): nothing is counted twice
    return None if since is None else min(since, now)  # a countedAt ahead of the clock, likewise


def _held_by(p: Pass) -> list[ObservedPod]:
    """The job's pods, and those gone since its last count (a disrupted pod's last state is among
    both: tombstones.py)."""
    departed = [d for d in p.job.departed if d.owner_uid == p.job.ref.uid]
    gone = {d.uid for d in departed}
    return [*(pod for pod in p.own if pod.uid not in gone), *departed]


def _first_use(p: Pass) -> str:
    """A first count (an operator upgraded under the job): by the phase it was in."""
    return usage.use_of(Phase(p.job.status.get("phase") or Phase.PENDING), bool(p.job.status.get("checkpoint")),
                        False, False)


def _when_written(p: Pass, was: str, use: str, since: float | None, units: Mapping[str, float]) -> None:
    """Plan.usage_write: at once for a change of use the job's other fields don't carry; within 5 s for
    a pod gone since; else only along with another write, or once it has gone unwritten too long."""
    if was != use and frozenset({was, use}) not in QUIET_CHANGES:
        p.plan.usage_write = 0.0
        return
    if any(d.ended_at is not None and (since is None or d.ended_at > since)
           for d in p.job.departed if d.owner_uid == p.job.ref.uid):
        p.plan.usage_write = DEPARTED_WRITE_SECONDS
        return
    holding = any(units.get(pod.replica_type) and pod.scheduled and pod.ended_at is None for pod in p.own)
    if not holding or since is None:
        return
    due = since + (STALLED_WRITE_SECONDS if use == "stalled" else IDLE_WRITE_SECONDS) - p.now.timestamp()
    if due <= 0:
        p.plan.usage_write = 0.0
    else:
        p.plan.requeue_within(due)


def _advanced_at(status: Mapping[str, Any], now: float) -> float | None:
    """When the training's reported step (or epoch) last moved (status.progress.advanced), never after
    now (another writer's clock ahead of ours); None for a training that reports none: its Running
    seconds can't turn out to be a stall."""
    found = epoch_seconds(((status.get("progress") or {}).get("advanced") or {}).get("at"))
    return None if found is None else min(found, now)


def _moved(p: Pass) -> bool:
    """Whether the training reported a new step (or epoch) since the status last written: its record
    (status.progress.advanced) is another."""
    def record(status: Mapping[str, Any]) -> Any:
        return (status.get("progress") or {}).get("advanced")
    return bool(record(p.plan.status) != record(p.job.status))


def _kept(before: Mapping[str, Any] | None) -> dict[str, float]:
    kept = (before or {}).get("seconds")
    return {name: _number((kept if isinstance(kept, Mapping) else {}).get(name)) for name in USES}


def _reached(kept: Any, was: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """The furthest position the training reported, over all its attempts, and whether this attempt
    is short of it (redoing, while Running). The position shown is this attempt's once it was first seen after the
    attempt's pods all ran (status.progress.advanced): the attempt running before this pass (`was`),
    or one that started in it; counted even on the pass that ends it (a restart's)."""
    reached = dict(kept) if isinstance(kept, Mapping) and usage.position_key(kept) is not None else None
    progress = status.get("progress") or {}
    running = true_since(was, Phase.RUNNING.value) or true_since(status, Phase.RUNNING.value)
    seen = epoch_seconds((progress.get("advanced") or {}).get("at"))
    here = usage.position_key(progress)
    ours = here is not None and running is not None and seen is not None and seen >= running.timestamp()
    top = usage.position_key(reached) if reached is not None else None
    if ours and here is not None and (top is None or here >= top):
        reached, top = {k: progress[k] for k in ("epoch", "step") if progress.get(k) is not None}, here
    return reached, top is not None and (not ours or (here is not None and here < top))


# Past this, a count is a status writer's, not ours: a million GPU-years (docs/api.md).
MOST_SECONDS = 1e6 * 365.25 * 86400


def _number(value: Any) -> float:
    """A count as written, or 0 for what isn't one (a string, a negative, inf or NaN, one past any real job's)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MOST_SECONDS:
        return float(value)
    return 0.0
