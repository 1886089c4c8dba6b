"""Time, injected: the controller, its expectations and leader election read it from here, so
unit tests can move it by hand."""

from __future__ import annotations

import datetime
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime.datetime:
        """Wall-clock time, timezone-aware UTC: what goes into status and Leases."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps: for measuring how long something has waited."""


class SystemClock:
    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)

    def monotonic(self) -> float:
        return time.monotonic()
