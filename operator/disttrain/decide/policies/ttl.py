"""runPolicy.ttlSecondsAfterFinished: the DistTrainJob (and what it owns) is deleted this long
after it finished."""

from __future__ import annotations

import datetime

from disttrain.api.spec import RunPolicy
from disttrain.api.times import parse_timestamp


def ttl_remaining(run: RunPolicy, completion_time: str | None, now: datetime.datetime) -> float | None:
    """Seconds until the finished job is deleted (<= 0: now); None without a TTL."""
    if run.ttl_seconds_after_finished is None:
        return None
    finished = parse_timestamp(completion_time) or now
    return (finished - now).total_seconds() + run.ttl_seconds_after_finished
