"""A stalled training: a Running job whose reported step stands still (issue 46).

A collective that never returns (a peer frozen mid-all-reduce, a NCCL or Gloo deadlock), a data
loader stuck on a mount: every pod stays Running, every GPU stays allocated, and Kubernetes sees
nothing wrong. What does see it is the training's own report (decide/progress.py): its step stops
moving. `status.progress.advanced` records when the reported position (epoch, step) was first seen,
which position that was, and the longest a position has stood before moving on (`advance`); this
rule reads it against the clock.

The rule, for a job in phase Running:
- a job whose training never reported a step or an epoch is never stalled: there is nothing to
  judge it by (no hook, or a script that reports metrics only);
- the timeout is runPolicy.stallTimeoutSeconds, or, unset, STILL_FACTOR times the longest the
  job's position has stood before moving on, within one attempt and never past the timeout then in
  force (a stall recovered from is no pace), never under FLOOR_SECONDS; unset and not yet known
  (no move seen within an attempt), not judged;
- the attempt's first new step gets FIRST_STEP_FACTOR timeouts, counted from when its pods all
  ran (the Running condition's time): graph building, XLA compilation, a dataset's first shuffle
  buffer and a checkpoint's restore all come before it, and are each many steps long; so does a
  training past its last reported step (an export, a last evaluation, an upload, a hang in the
  teardown of its process group);
- after that, the step may stand still one timeout from when it last changed.

Not judged: a job stopping on purpose (a checkpoint requested before a suspend, an eviction or a
drain, decide/checkpoint_steps.py: its training is saving, not stepping), and any phase but Running
(queued, pending, restarting, suspended, finished). A step that goes back (a restart resumed at its
checkpoint) counts as a change: it is this attempt moving.

Why the job's own pace, three times, and ten minutes: what a healthy job looks like is how long its
position stands between moves: a report interval for a job reporting each step, longer at an
epoch's end (its evaluation and checkpoint), a whole epoch for a job reporting epochs only. Three
times the longest seen leaves room for a pause longer than any before. Kept as a running maximum
in the status, not read from `status.progress.history`: that is thinned as it grows, and its old
points end up hours apart. The floor: a checkpoint of a large model to object storage, or an
evaluation pass, takes minutes with no step reported, and ten minutes is the watchdog NCCL's users
know (PyTorch's default collective timeout). The record is in the status, so an operator restarted
derives the same timeout.

Who can move this: only the job's own training reporter (the endpoint checks the token's pod
against the job and its role, docs/api.md). It can make its own job read as stalled (reporting
the same step) or not (reporting new ones): a restart it so causes counts against its own job's
backoffLimit. No other job's pods, and no other namespace's, can touch it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from disttrain.api.spec import RunPolicy
from disttrain.api.status import timestamp
from disttrain.api.times import parse_timestamp
from disttrain.decide.progress import fraction_of

FLOOR_SECONDS = 600.0
STILL_FACTOR = 3
FIRST_STEP_FACTOR = 3


def position_of(progress: Mapping[str, Any]) -> tuple[Any, Any]:
    return progress.get("epoch"), progress.get("step")


def advance(record: Mapping[str, Any] | None, shown_before: Mapping[str, Any], current: Mapping[str, Any],
            running_since: datetime.datetime | None, run: RunPolicy) -> dict[str, Any] | None:
    """`status.progress.advanced` for the progress `current` shows, from the record the status held
    (`record`, written with `shown_before`): kept while the position stands; on a change, dated by the
    report that shows it (never earlier than the change: the status it is compared with is at most an
    interval old), and the stand that ended counted toward `longestStillSeconds` when it was all this
    attempt's Running and no stall (no longer than the timeout then in force). A record that dates
    another position than the status showed (an operator rolled back, which kept it and moved the
    step) is dropped, and the latest report dates the position: later than it was, never earlier."""
    now_at = parse_timestamp(current.get("reportedAt"))
    where = position_of(current)
    if now_at is None or where == (None, None):
        return None
    old = dict(record or {})
    since = parse_timestamp(old.get("at"))
    valid = since is not None and (old.get("epoch"), old.get("step")) == position_of(shown_before)
    if valid and where == position_of(shown_before):
        return old
    longest = float(old.get("longestStillSeconds") or 0.0) if valid else 0.0
    if valid and since is not None and running_since is not None and since >= running_since:
        stood = (now_at - since).total_seconds()
        limit = timeout_seconds(run, longest if longest > 0 else None)
        if limit is None or stood <= limit:
            longest = max(longest, stood)
    out: dict[str, Any] = {"at": timestamp(now_at), "epoch": where[0], "step": where[1]}
    out = {k: v for k, v in out.items() if v is not None}
    if longest > 0:
        out["longestStillSeconds"] = round(longest, 1)
    return out


def timeout_seconds(run: RunPolicy, longest_still: float | None) -> float | None:
    """How long the reported step may stand still: the job's own setting, else derived from the
    longest it has stood before; None while that can't be told."""
    if run.stall_timeout_seconds is not None:
        return float(run.stall_timeout_seconds)
    if not longest_still:
        return None
    return max(FLOOR_SECONDS, STILL_FACTOR * longest_still)


def position(progress: Mapping[str, Any]) -> str | None:
    """`step 1500` (with its epoch when reported), `epoch 3`; None: neither reported."""
    step, epoch = progress.get("step"), progress.get("epoch")
    if step is not None:
        return f"step {step}" + (f" (epoch {epoch})" if epoch is not None else "")
    return f"epoch {epoch}" if epoch is not None else None


def finished_steps(progress: Mapping[str, Any]) -> bool:
    """Every step (or epoch) of the training reported done: its percent's fraction (steps, else epochs) at 1."""
    return fraction_of(progress, progress) == 1.0


def stalled(run: RunPolicy, progress: Mapping[str, Any] | None, record: Mapping[str, Any] | None,
            running_since: datetime.datetime | None, now: datetime.datetime) -> tuple[str | None, float | None]:
    """For a Running job, not stopping on purpose: (why it is stalled, None), or (None, seconds until
    it would be: to look again then), or (None, None) when it can't be judged. `record`: this pass's
    `status.progress.advanced` (`advance`)."""
    where = position(progress or {})
    advanced = parse_timestamp((record or {}).get("at"))
    if progress is None or where is None or advanced is None or running_since is None:
        return None, None
    timeout = timeout_seconds(run, (record or {}).get("longestStillSeconds"))
    if timeout is None:
        return None, None
    rule = (f"runPolicy.stallTimeoutSeconds {run.stall_timeout_seconds}s" if run.stall_timeout_seconds is not None
            else f"the stall timeout derived from its pace: {timeout:.0f}s")
    reporter = progress.get("reporter") or "its training reporter"
    if advanced < running_since:
        since, allowed = running_since, FIRST_STEP_FACTOR * timeout
        what = (f"the training has reported no new step since its pods all ran at {timestamp(running_since)} "
                f"(the last: {where} at {timestamp(advanced)})")
        limit = f"{FIRST_STEP_FACTOR} x {rule} for an attempt's first step"
    elif finished_steps(progress):
        since, allowed = advanced, FIRST_STEP_FACTOR * timeout
        what = f"the training reported its last step, {where}, at {timestamp(advanced)} ({reporter}) and has not ended"
        limit = f"{FIRST_STEP_FACTOR} x {rule} after the last step"
    else:
        since, allowed = advanced, timeout
        what = f"the training has reported {where} since {timestamp(advanced)} ({reporter}) and nothing new since"
        limit = rule
    still = (now - since).total_seconds()
    if still < allowed:
        return None, allowed - still
    # No "for N s": the message is the condition's, and a message that changed each pass would be a
    # status write each pass. The condition's lastTransitionTime says when it was found.
    return f"{what}: longer than {limit}", None
