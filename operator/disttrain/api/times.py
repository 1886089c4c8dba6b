"""Times as the API server writes them (RFC 3339), read one way everywhere."""

from __future__ import annotations

import datetime


def parse_timestamp(value: str | None) -> datetime.datetime | None:
    """An RFC 3339 time as the API server writes it, fractional seconds (MicroTime) included; None
    for none, or for what isn't a time. A job's status is written by whoever may patch
    disttrainjobs/status, and a time there that raised (Python reads no lowercase `t` or `z`,
    which RFC 3339 allows) failed every reconcile of that job; callers read None as "not set"."""
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.upper())
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def epoch_seconds(value: str | None) -> float | None:
    """`parse_timestamp`'s time as seconds since the epoch."""
    parsed = parse_timestamp(value)
    return None if parsed is None else parsed.timestamp()
