"""`status.progress`: what the job's reporting pods said last, how far along that is, when it will
end at the recent rate, and a short history for the terminal's curves.

A pure function of what the pods reported (the operator keeps the latest report of each role in
memory, control/progress_book.py), the status written before, the job's phase and the clock. The
history lives in the status itself, so after an operator restart the ETA and the curves carry on
from it: nothing but the latest report needs remembering.

- percent: steps done / total steps when both are reported, else epochs done / total epochs;
- ETA: the rate over the history's last RATE_WINDOW_SECONDS (at least two points), applied to
  what is left; none while the rate is unknown, once stale, or once the job has finished;
- stale: a Running job whose training reporter has been silent for STALE_SECONDS, or three of
  its usual intervals between reports if longer: its ETA reads `stale`;
- advanced: when the reported step or epoch last changed, which a stall is judged by (kept by
  decide/stall_steps.py, carried here as any field of the status written before);
- history: a point per status write with a newer report, at most MAX_HISTORY; past that the older
  half is thinned (every other point dropped), so it always spans the whole training.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from disttrain.api.progress import Report
from disttrain.api.status import FINISHED, Phase, timestamp
from disttrain.api.times import parse_timestamp

MAX_HISTORY = 40
RATE_WINDOW_SECONDS = 600.0
STALE_SECONDS = 300.0


@dataclass(frozen=True)
class Reported:
    """A role's latest report, who sent it and when (the operator's clock)."""

    report: Report
    reporter: str  # the pod's name
    at: datetime.datetime


@dataclass(frozen=True)
class ProgressState:
    training: Reported | None = None
    evaluation: Reported | None = None
    gap_seconds: float | None = None  # the usual interval between training reports, when known
    # The latest report that confirmed a checkpoint: kept apart, so a later plain report can't
    # hide it before the job's next reconcile reads it (decide/checkpoint_steps.py).
    checkpoint: Reported | None = None


def progress_status(state: ProgressState | None, previous: Mapping[str, Any] | None, phase: Phase,
                    now: datetime.datetime) -> tuple[dict[str, Any] | None, float | None]:
    """The job's `status.progress` (None: nothing reported, ever) and, for a Running job, the
    seconds until it would turn stale (to look again then)."""
    previous = dict(previous or {})
    if state is None or (state.training is None and state.evaluation is None):
        if not previous:
            return None, None
        state = ProgressState()
    out = {k: v for k, v in previous.items() if k not in ("eta", "remainingSeconds", "stale")}
    if state.training is not None:
        out |= training_fields(state.training, previous)
    if state.evaluation is not None:
        out["evaluation"] = evaluation_fields(state.evaluation)
    recheck = None
    reported_at = parse_timestamp(out.get("reportedAt"))
    if phase not in FINISHED and reported_at is not None:
        silent_for = (now - reported_at).total_seconds()
        stale_after = max(STALE_SECONDS, 3 * (state.gap_seconds or 0.0))
        if phase is Phase.RUNNING and silent_for >= stale_after:
            out["stale"], out["eta"] = True, "stale"
        else:
            remaining = remaining_seconds(out)
            if remaining is not None:
                out["remainingSeconds"], out["eta"] = remaining, human_duration(remaining)
            recheck = max(0.0, stale_after - silent_for)
    return out, recheck


def training_fields(reported: Reported, previous: Mapping[str, Any]) -> dict[str, Any]:
    report = reported.report
    fields: dict[str, Any] = {name: value for name, value in (
        ("epoch", report.epoch), ("totalEpochs", report.total_epochs), ("step", report.step),
        ("totalSteps", report.total_steps)) if value is not None}
    fraction = report.fraction
    if fraction is not None:
        fields["percent"] = int(fraction * 100)
    fields["metrics"] = dict(report.metrics)
    fields["reporter"] = reported.reporter
    fields["reportedAt"] = timestamp(reported.at)
    point = {k: v for k, v in (("at", fields["reportedAt"]), ("epoch", report.epoch), ("step", report.step),
                               ("metrics", dict(report.metrics))) if v is not None}
    fields["history"] = with_point(list(previous.get("history") or ()), point)
    return fields


def evaluation_fields(reported: Reported) -> dict[str, Any]:
    report = reported.report
    fields: dict[str, Any] = {name: value for name, value in (("epoch", report.epoch), ("step", report.step))
                              if value is not None}
    return fields | {"metrics": dict(report.metrics), "reporter": reported.reporter,
                     "reportedAt": timestamp(reported.at)}


def with_point(history: list[dict[str, Any]], point: dict[str, Any]) -> list[dict[str, Any]]:
    """`history` with `point` (the latest report) at its end, unless it is there already."""
    if history and history[-1].get("at") == point["at"]:
        history[-1] = point  # a newer report within the same second
        return history
    history.append(point)
    while len(history) > MAX_HISTORY:
        half = len(history) // 2
        history = history[:half][::2] + history[half:]
    return history


def remaining_seconds(progress: Mapping[str, Any]) -> int | None:
    """Seconds left at the rate of the history's recent points; None while it can't be told."""
    history: Sequence[Mapping[str, Any]] = progress.get("history") or ()
    done = fraction_of(progress, progress)
    if done is None or len(history) < 2:
        return None
    if done >= 1.0:
        return 0
    last = parse_timestamp(history[-1].get("at"))
    if last is None:
        return None
    for point in history[:-1]:
        then, at = fraction_of(point, progress), parse_timestamp(point.get("at"))
        if then is None or at is None or (last - at).total_seconds() > RATE_WINDOW_SECONDS:
            continue
        elapsed = (last - at).total_seconds()
        if done > then and elapsed > 0:
            return round((1.0 - done) * elapsed / (done - then))
    return None


def fraction_of(point: Mapping[str, Any], totals: Mapping[str, Any]) -> float | None:
    for done, total in (("step", "totalSteps"), ("epoch", "totalEpochs")):
        if point.get(done) is not None and totals.get(total):
            return min(1.0, float(point[done]) / float(totals[total]))
    return None


def human_duration(seconds: int) -> str:
    """As kubectl writes ages: 45s, 7m12s, 3h4m, 2d5h."""
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs}s" if minutes < 10 and secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"
