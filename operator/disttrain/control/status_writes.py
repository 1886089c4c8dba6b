"""The job's status writes, fewer and never from a stale read.

The controller remembers the status it last wrote for each job (`WrittenStatus`). Until the job's
watch event shows that write, the index still holds the version before it: reconciling from it
would recompute from a stale status, and the write would be refused (409) and retried. And a
status whose only change is progress (ready counts, the Created condition) waits until
PROGRESS_WRITE_INTERVAL after the job's last write, and goes out with the next transition if one
comes first; a phase, reason, message, other condition or restart count is written at once.

Why 5 seconds: in `make bench`'s burst (200 jobs of 5 pods at once) a job's pods take 1-3 s from
its Pending write to all running. With 1 s, progress went out once or twice in that gap: 3.8
status writes per job where 2 are needed (Pending, then Running). With 5 s: 2.0. The cost: the
READY column of `kubectl get dtj` may lag up to 5 s while pods come up or go unready; phases,
failures and restarts never wait.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

PROGRESS_WRITE_INTERVAL = 5.0  # seconds a progress-only change waits after the job's last write
PROGRESS_FIELDS = frozenset({"ready", "replicaStatuses"})
# Conditions that mark progress within a phase, not a transition: Created (every pod of the
# attempt exists) comes a moment after the Pending write and before Running; written on its own
# it was a third write per job in `make bench`'s burst (issue 25).
PROGRESS_CONDITIONS = frozenset({"Created"})


class WrittenStatus:
    """Our last write of a job's status. Held for every job, so the status is kept as compact JSON
    (~1 KB, where its decoded dicts are ~4 KB: `make bench`, memory per pod held)."""

    __slots__ = ("_status", "after", "at", "before")

    def __init__(self, before: str, after: str, status: Mapping[str, Any], at: float) -> None:
        self.before = before  # the job's resourceVersion our write was made over
        self.after = after  # the one it made
        self._status = json.dumps(status, separators=(",", ":"))
        self.at = at  # monotonic seconds

    @property
    def status(self) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(self._status)
        return decoded


def with_own_status(written: WrittenStatus | None, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The job as of our last status write, when the index doesn't show that write yet."""
    meta = body.get("metadata") or {}
    if written is None or not written.after or meta.get("resourceVersion") != written.before:
        return body
    return {**body, "metadata": {**meta, "resourceVersion": written.after}, "status": written.status}


def progress_wait(written: WrittenStatus | None, current: Mapping[str, Any], new: Mapping[str, Any],
                  now: float) -> float | None:
    """Seconds to hold a progress-only status change back; None to write now."""
    if written is None or new == current:
        return None
    changed = {k for k in current.keys() | new.keys() if current.get(k) != new.get(k)}
    if "conditions" in changed and _beyond_progress(current.get("conditions"), new.get("conditions")):
        return None
    if not changed - {"conditions"} <= PROGRESS_FIELDS:
        return None
    wait = written.at + PROGRESS_WRITE_INTERVAL - now
    return wait if wait > 0 else None


def _beyond_progress(before: Any, after: Any) -> bool:
    """Whether two condition lists differ in anything but a progress condition."""
    def rest(conditions: Any) -> list[Any]:
        return [c for c in conditions or () if c.get("type") not in PROGRESS_CONDITIONS]
    return rest(before) != rest(after)


def version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
