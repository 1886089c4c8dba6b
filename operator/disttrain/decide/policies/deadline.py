"""runPolicy.activeDeadlineSeconds: how long a job may be active, counted from its start or
its last resume (as a Kubernetes Job counts it)."""

from __future__ import annotations

import datetime

from disttrain.api.spec import RunPolicy
from disttrain.api.times import parse_timestamp


def deadline_remaining(run: RunPolicy, start_time: str | None, now: datetime.datetime) -> float | None:
    """Seconds left before the deadline (<= 0: passed); None without a deadline."""
    if run.active_deadline_seconds is None:
        return None
    start = parse_timestamp(start_time) or now
    return (start - now).total_seconds() + run.active_deadline_seconds


def deadline_message(run: RunPolicy) -> str:
    return f"the job was active longer than runPolicy.activeDeadlineSeconds ({run.active_deadline_seconds}s)"
