"""A stalled training: a Running job whose reported step stands still (issue 46).

A collective that never returns (a peer frozen mid-all-reduce, a NCCL or Gloo deadlock), a data
loader stuck on a mount: every pod stays Running, every GPU stays allocated, and Kubernetes sees
nothing wrong. What does see it is the training's own report (decide/progress.py): its step stops
moving. `status.progress.advancedAt` says when the reported step (or epoch) last changed; this
rule reads it against the clock.

The rule, for a job in phase Running:
- a job whose training never reported a step or an epoch is never stalled: there is nothing to
  judge it by (no hook, or a script that reports metrics only);
- the timeout is runPolicy.stallTimeoutSeconds, or, unset, INTERVALS of the job's own usual
  interval between reports and never under FLOOR_SECONDS (below);
- the attempt's first new step gets FIRST_STEP_FACTOR timeouts, counted from when its pods all
  ran (the Running condition's time): graph building, XLA compilation, a dataset's first shuffle
  buffer and a checkpoint's restore all come before it, and are each many steps long;
- after that, the step may stand still one timeout from when it last changed.

Not judged: a job stopping on purpose (a checkpoint requested before a suspend, an eviction or a
drain, decide/checkpoint_steps.py: its training is saving, not stepping), and any phase but
Running (queued, pending, restarting, suspended, finished). A step that goes back (a restart
resumed at its checkpoint) counts as a change: it is this attempt moving.

Why ten intervals and ten minutes: the progress hook reports at most every 2 s, so the interval
the operator sees is the slower of a step and 2 s. A healthy job is still for a few intervals at
an epoch's end (its evaluation and checkpoint); ten leave room for that without waiting hours for
a slow one. The floor: a checkpoint of a large model to object storage, or an evaluation pass,
takes minutes with no step reported, and ten minutes is the watchdog NCCL's users know (PyTorch's
default collective timeout). The interval lives in memory (control/progress_book.py): after an
operator restart it is unknown until two reports, and the floor applies meanwhile.

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
from disttrain.api.status import parse_timestamp, timestamp

FLOOR_SECONDS = 600.0
INTERVALS = 10
FIRST_STEP_FACTOR = 3


def timeout_seconds(run: RunPolicy, gap_seconds: float | None) -> float:
    """How long the reported step may stand still: the job's own setting, else derived."""
    if run.stall_timeout_seconds is not None:
        return float(run.stall_timeout_seconds)
    return max(FLOOR_SECONDS, INTERVALS * (gap_seconds or 0.0))


def position(progress: Mapping[str, Any]) -> str | None:
    """`step 1500` (with its epoch when reported), `epoch 3`; None: neither reported."""
    step, epoch = progress.get("step"), progress.get("epoch")
    if step is not None:
        return f"step {step}" + (f" (epoch {epoch})" if epoch is not None else "")
    return f"epoch {epoch}" if epoch is not None else None


def stalled(run: RunPolicy, progress: Mapping[str, Any] | None, running_since: datetime.datetime | None,
            gap_seconds: float | None, now: datetime.datetime) -> tuple[str | None, float | None]:
    """For a Running job, not stopping on purpose: (why it is stalled, None), or (None, seconds until
    it would be: to look again then), or (None, None) when it can't be judged."""
    where = position(progress or {})
    advanced = parse_timestamp((progress or {}).get("advancedAt"))
    if progress is None or where is None or advanced is None or running_since is None:
        return None, None
    timeout = timeout_seconds(run, gap_seconds)
    rule = (f"runPolicy.stallTimeoutSeconds {run.stall_timeout_seconds}s" if run.stall_timeout_seconds is not None
            else f"the stall timeout derived from its reports: {timeout:.0f}s")
    reporter = progress.get("reporter") or "its training reporter"
    if advanced >= running_since:
        since, allowed = advanced, timeout
        what = f"the training has reported {where} since {timestamp(advanced)} ({reporter}) and no step since"
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
