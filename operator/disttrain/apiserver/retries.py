"""Why a pass failed, in one line, and how long the API server asked us to wait before the next.

A pass that fails on the API server's account (throttled, a server error, a refusal, the server
unreachable) is retried with backoff by the work queue; its log line says what the API server
said, not a traceback: the traceback is kept for what the API server can't explain (a bug of
ours, or an object it found invalid). A 429's Retry-After is honoured, as client-go does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from disttrain.apiserver.api_errors import ErrorKind, classify
from disttrain.apiserver.rest import ApiError

# Failures of the connection, not of our code: the API server restarted, paused or unreachable.
TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)
_OURS = {ErrorKind.INVALID, ErrorKind.OTHER}  # the API server's answer to an object we got wrong


@dataclass(frozen=True)
class Explained:
    what: str  # for the log: the kind of failure and the API server's words
    wait_at_least: float = 0.0  # seconds: the API server's Retry-After
    tell_the_job: bool = True  # False: the API server unreachable (nothing would take an event), or the object gone


def explain(err: BaseException) -> Explained | None:
    if isinstance(err, TRANSIENT):
        return Explained(f"{type(err).__name__}: {err}", tell_the_job=False)
    if isinstance(err, ApiError):
        error = classify(err.status, err.body, err.reason)
        if error.kind in _OURS:
            return None
        return Explained(error.describe(), _retry_after(err.headers.get("Retry-After")),
                         tell_the_job=error.kind is not ErrorKind.NOT_FOUND)
    return None


def _retry_after(value: str | None) -> float:
    """Retry-After in seconds (the API server sends seconds; an HTTP date is ignored), at most 60."""
    try:
        return min(60.0, max(0.0, float(value))) if value else 0.0
    except ValueError:
        return 0.0
