"""A stalled training: a Running job whose reported step stands still (issue 46).

A collective that never returns (a peer frozen mid-all-reduce, a NCCL or Gloo deadlock), a data
loader stuck on a mount: every pod stays Running, every GPU stays allocated, and Kubernetes sees
nothing wrong. What does see it is the training's own report (decide/progress.py): its step stops
moving. `status.progress.advancedAt` says when the reported step (or epoch) last changed (checked
against the history, `still_since`); this rule reads it against the clock.

The rule, for a job in phase Running:
- a job whose training never reported a step or an epoch is never stalled: there is nothing to
  judge it by (no hook, or a script that reports metrics only);
- the timeout is runPolicy.stallTimeoutSeconds, or, unset, STILL_FACTOR times the longest the
  job's reported position has stood before changing (its history), never under FLOOR_SECONDS
  (below); unset and not yet known (its history shows fewer than two changes), not judged;
- the attempt's first new step gets FIRST_STEP_FACTOR timeouts, counted from when its pods all
  ran (the Running condition's time): graph building, XLA compilation, a dataset's first shuffle
  buffer and a checkpoint's restore all come before it, and are each many steps long;
- after that, the step may stand still one timeout from when it last changed.

Not judged: a job stopping on purpose (a checkpoint requested before a suspend, an eviction or a
drain, decide/checkpoint_steps.py: its training is saving, not stepping), a training that has
reported its last step (its export or upload after it reports none), and any phase but Running
(queued, pending, restarting, suspended, finished). A step that goes back (a restart resumed at
its checkpoint) counts as a change: it is this attempt moving.

Why the job's own pace, three times, and ten minutes: what a healthy job looks like is its own
history (`status.progress.history`, a point per status write with a new report, each with its step
and epoch). The time from one change of position to the next is how long it stands between
moves: a status interval for a job reporting each step, longer at an epoch's end (its evaluation
and checkpoint), a whole epoch for a job reporting epochs only, twenty minutes for one reporting a
step every twenty. The longest of those is the longest it has stood and come back; the position
standing now is left out (counted, a stall would lengthen its own timeout). Three times leaves room
for a pause longer than any before; thinning the history (past 40 points) can only lengthen the
intervals, so the timeout errs long. The floor: a
checkpoint of a large model to object storage, or an evaluation pass, takes minutes with no step
reported, and ten minutes is the watchdog NCCL's users know (PyTorch's default collective
timeout). The history is in the status, so an operator restarted derives the same timeout.

Who can move this: only the job's own training reporter (the endpoint checks the token's pod
against the job and its role, docs/api.md). It can make its own job read as stalled (reporting
the same step) or not (reporting new ones): a restart it so causes counts against its own job's
backoffLimit. No other job's pods, and no other namespace's, can touch it.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from disttrain.api.spec import RunPolicy
from disttrain.api.status import parse_timestamp, timestamp

FLOOR_SECONDS = 600.0
STILL_FACTOR = 3
FIRST_STEP_FACTOR = 3


def timeout_seconds(run: RunPolicy, history: Sequence[Mapping[str, Any]]) -> float | None:
    """How long the reported step may stand still: the job's own setting, else derived from its
    history; None while that can't be told (fewer than two changes seen)."""
    if run.stall_timeout_seconds is not None:
        return float(run.stall_timeout_seconds)
    starts = run_starts(history)
    if len(starts) < 2:
        return None
    # The current run (the one a stall would be) is left out: counted, a stall would lengthen its own timeout.
    longest = max((later - earlier).total_seconds() for earlier, later in itertools.pairwise(starts))
    return max(FLOOR_SECONDS, STILL_FACTOR * longest)


def run_starts(history: Sequence[Mapping[str, Any]]) -> list[datetime.datetime]:
    """When each run of history points at one (epoch, step) began: the times the position changed. A
    point without a step or an epoch (metrics alone) keeps the one before, as the status does."""
    starts: list[datetime.datetime] = []
    last: tuple[Any, Any] = (None, None)
    for point in history:
        at = parse_timestamp(point.get("at"))
        where = (point.get("epoch", last[0]), point.get("step", last[1]))
        if at is not None and where != (None, None) and (not starts or where != last):
            starts.append(at)
        last = where
    return starts


def still_since(progress: Mapping[str, Any]) -> datetime.datetime | None:
    """Since when the reported position has stood: `advancedAt`, but never before the history's last
    run began (an `advancedAt` left from another step: an operator rolled back, which kept the field
    and moved the step, then forward again), nor missing where the history or `reportedAt` dates it
    (a status written before the field: an operator upgraded under a hung job)."""
    found = run_starts(progress.get("history") or ())[-1:]
    if (advanced := parse_timestamp(progress.get("advancedAt"))) is not None:
        found.append(advanced)
    return max(found) if found else parse_timestamp(progress.get("reportedAt"))


def position(progress: Mapping[str, Any]) -> str | None:
    """`step 1500` (with its epoch when reported), `epoch 3`; None: neither reported."""
    step, epoch = progress.get("step"), progress.get("epoch")
    if step is not None:
        return f"step {step}" + (f" (epoch {epoch})" if epoch is not None else "")
    return f"epoch {epoch}" if epoch is not None else None


def finished_steps(progress: Mapping[str, Any]) -> bool:
    """Every step (or epoch) of the training reported done: what comes after (a model's export, a
    last evaluation, an upload) reports no step, and is no stall."""
    for done, total in (("step", "totalSteps"), ("epoch", "totalEpochs")):
        if progress.get(done) is not None and progress.get(total):
            return bool(progress[done] >= progress[total])
    return False


def stalled(run: RunPolicy, progress: Mapping[str, Any] | None, running_since: datetime.datetime | None,
            now: datetime.datetime) -> tuple[str | None, float | None]:
    """For a Running job, not stopping on purpose: (why it is stalled, None), or (None, seconds until
    it would be: to look again then), or (None, None) when it can't be judged."""
    where = position(progress or {})
    if progress is None or where is None or running_since is None or finished_steps(progress):
        return None, None
    advanced, timeout = still_since(progress), timeout_seconds(run, progress.get("history") or ())
    if advanced is None or timeout is None:
        return None, None
    rule = (f"runPolicy.stallTimeoutSeconds {run.stall_timeout_seconds}s" if run.stall_timeout_seconds is not None
            else f"the stall timeout derived from its history: {timeout:.0f}s")
    reporter = progress.get("reporter") or "its training reporter"
    if advanced >= running_since:
        since, allowed = advanced, timeout
        what = f"the training has reported {where} since {timestamp(advanced)} ({reporter}) and nothing new since"
        limit = rule
    else:
        since, allowed = running_since, FIRST_STEP_FACTOR * timeout
        what = (f"the training has reported no new step since its pods all ran at {timestamp(running_since)} "
                f"(the last: {where} at {timestamp(advanced)})")
        limit = f"{FIRST_STEP_FACTOR} x {rule} for an attempt's first step"
    still = (now - since).total_seconds()
    if still < allowed:
        return None, allowed - still
    # No "for N s": the message is the condition's, and a message that changed each pass would be a
    # status write each pass. The condition's lastTransitionTime says when it was found.
    return f"{what}: longer than {limit}", None
