"""The progress endpoint's two bookkeeping shapes: a token bucket (a rate and a burst) and a
dictionary that keeps only its most recently used entries (every per-token and per-address record
is one, so a flood of names can't grow them)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class Bucket:
    """A token bucket: `rate` a second, `burst` at once."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float, cost: float = 1.0) -> float:
        """0 if allowed now (and taken); else the seconds until it would be."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate

    def charge(self, cost: float) -> None:
        self.tokens -= cost  # may go below zero: a debt paid back at `rate`


class Lru(OrderedDict[str, Any]):
    """At most `size` entries; the least recently put go first."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: str, value: Any) -> Any:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)
        return value
