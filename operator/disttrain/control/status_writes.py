"""The job's status writes, fewer and never from a stale read.

The controller remembers the status it last wrote for each job (`WrittenStatus`). Until the job's
watch event shows that write, the index still holds the version before it: reconciling from it
would recompute from a stale status, and the write would be refused (409) and retried. And a
status whose only change is progress (ready counts, the Created condition) waits until
PROGRESS_WRITE_INTERVAL after the job's last write, and goes out with the next transition if one
comes first; a phase, reason, other condition or restart count is written at once, and so is a message that
comes with a new reason. A message alone, its reason the same, is progress too: its counts move on
with every pass of a large job ("waiting for gang scheduling: 412/1024 pods scheduled"), and a
1,024-worker job's status was written 30 to 61 times while its pods came up (`make bench`, large
jobs; issue 45).

Why 5 seconds: in `make bench`'s burst (200 jobs of 5 pods at once) a job's pods take 1-3 s from
its Pending write to all running. With 1 s, progress went out once or twice in that gap: 3.8
status writes per job where 2 are needed (Pending, then Running). With 5 s: 2.0. The cost: the
READY column of `kubectl get dtj` may lag up to 5 s while pods come up or go unready; phases,
failures and restarts never wait.

Under a backlog (more jobs waiting for a reconcile than there are workers: a burst of new jobs, an
operator's restart; and as long again after it), a progress-only change of a job Kueue doesn't queue
waits BUSY_PROGRESS_WRITE_INTERVAL instead, and reported progress still no longer than its own. Why:
then the API server is what every job waits on, and a ready count is the write that can wait. In
`make bench`'s burst of 1,000 5-pod jobs a job's pods took 10-30 s from its Pending write to all
running, so at 5 s 0.69 more status writes per job went out (2.69 where Pending and Running are
2), and the burst took 1.08x the plain client making the same Service, pods, Pending, Running and
event. Phases, failures, restarts and usage due never wait longer; `kubectl get dtj`'s READY may
lag 30 s while the backlog lasts.

What the pods report of their training (`status.progress`, decide/progress.py) waits longer:
REPORTED_PROGRESS_INTERVAL after the job's last write (`disttrain run --progress-status-seconds`),
however often the pods report. Why 15 seconds: a status write is an etcd write of the whole job
(its pod templates: 5-30 KB), and a cluster of 1,000 training jobs then makes 67 of them a
second; kubectl's watch and the terminal's curves need no more, and the per-job gauges follow
every report for Prometheus (runtime/job_gauges.py).

`status.usage` (decide/usage_steps.py) is counted by every pass and goes out with the job's next
write, but for what the pass says is due on its own (Plan.usage_write): a change of use no other
field shows (at once), a pod gone since (within 5 s), and a count left unwritten 5 minutes (stalled)
or 30 (holding GPUs).

A new job's first status waits for its pods (`after_creates`): the pass that makes them writes
nothing before it makes them, and the pass right after (the pods now expected) writes Pending with
Created and the pods counted. As Kubernetes' Job controller does (create, then status): one status
write per job less in a burst, and the creates start one round trip sooner. `kubectl get dtj`
shows no phase for that moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import msgspec

from disttrain.api.objects import JobRef
from disttrain.apiserver.kube import Conflict
from disttrain.decide.plan import Plan
from disttrain.decide.queueing import prebuilt_workload, queue_name
from disttrain.runtime.clock import Clock

JobKey = tuple[str, str]

PROGRESS_WRITE_INTERVAL = 5.0  # seconds a progress-only change waits after the job's last write
BUSY_PROGRESS_WRITE_INTERVAL = 30.0  # the same, while reconciling has a backlog
MIN_BACKLOG = 16  # jobs waiting, at least, that make a backlog (`--workers 1`: not any second job)
PROGRESS_FIELDS = frozenset({"ready", "replicaStatuses"})
REPORTED = "progress"  # what the pods reported (decide/progress.py)
REPORTED_PROGRESS_INTERVAL = 15.0
USAGE = "usage"  # counted every pass, written only along with another change or when due (Plan.usage_write)
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
        self._status = msgspec.json.encode(status)
        self.at = at  # monotonic seconds

    @property
    def status(self) -> dict[str, Any]:
        decoded: dict[str, Any] = msgspec.json.decode(self._status)
        return decoded


def with_own_status(written: WrittenStatus | None, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The job as of our last status write, when the index doesn't show that write yet."""
    meta = body.get("metadata") or {}
    if written is None or not written.after or meta.get("resourceVersion") != written.before:
        return body
    return {**body, "metadata": {**meta, "resourceVersion": written.after}, "status": written.status}


def progress_wait(written: WrittenStatus | None, current: Mapping[str, Any], new: Mapping[str, Any],
                  now: float, reported_interval: float = REPORTED_PROGRESS_INTERVAL,
                  usage_due: float | None = None, progress_interval: float = PROGRESS_WRITE_INTERVAL) -> float | None:
    """Seconds to hold a progress-only status change back; None to write now. `usage_due`: the
    plan's usage_write (a usage count due now, 0, or that long after the job's last write);
    `progress_interval`: PROGRESS_WRITE_INTERVAL, or BUSY_PROGRESS_WRITE_INTERVAL under a backlog."""
    if written is None or new == current:
        return None
    changed = {k for k in current.keys() | new.keys() if current.get(k) != new.get(k)}
    if "conditions" in changed and _beyond_progress(current.get("conditions"), new.get("conditions")):
        return None
    if USAGE in changed and usage_due == 0:
        return None  # the use the held seconds count as changed (decide/usage_steps.py)
    progress = PROGRESS_FIELDS | {REPORTED, USAGE}
    if current.get("reason") == new.get("reason"):
        progress |= {"message"}  # the same reason's message, its counts moved on ("412/1024 pods scheduled")
    if not changed - {"conditions"} <= progress:
        return None
    rest = changed - {USAGE}
    interval = reported_interval if rest == {REPORTED} else progress_interval
    if REPORTED in rest:  # what the pods report is never held past its own interval
        interval = min(interval, reported_interval)
    if USAGE in changed and usage_due is not None:
        interval = usage_due if not rest else min(interval, usage_due)
    wait = written.at + interval - now
    return wait if wait > 0 else None


def without_usage(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != USAGE}


def _beyond_progress(before: Any, after: Any) -> bool:
    """Whether two condition lists differ in anything but a progress condition."""
    def rest(conditions: Any) -> list[Any]:
        return [c for c in conditions or () if c.get("type") not in PROGRESS_CONDITIONS]
    return rest(before) != rest(after)


def after_creates(current: Mapping[str, Any], plan_status: Mapping[str, Any], creates_pods: bool) -> bool:
    """Whether this status waits until the pass's creates are made: a job never written yet, still
    Pending, whose pass makes pods. (A refusal or failure of those creates writes its own status.)"""
    return creates_pods and not current.get("phase") and plan_status.get("phase") == "Pending"


def merge_patch(was: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`new` as a JSON merge patch over `was` (RFC 7396): what `was` holds and `new` doesn't is sent
    as null, which removes it (a finished job's ETA); nested objects alike. Without the nulls a
    merge patch keeps every key it doesn't name."""
    out = dict(new)
    for name, before in was.items():
        if name not in new:
            out[name] = None
        elif isinstance(before, Mapping) and isinstance(new[name], Mapping):
            out[name] = merge_patch(before, new[name])
    return out


def version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class StatusAPI(Protocol):
    async def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any],
                               resource_version: str | None) -> dict[str, Any]: ...


class Backlog:
    """Whether reconciling has a backlog: more jobs waiting for a worker than there are workers (and
    than MIN_BACKLOG), or had one within BUSY_PROGRESS_WRITE_INTERVAL. The burst's tail needs the
    hold: its pods are still coming up, many jobs' at once, after the queue has drained."""

    def __init__(self, waiting: Callable[[], int], workers: int, clock: Clock) -> None:
        self.waiting, self.workers, self.clock = waiting, workers, clock
        self.until = float("-inf")

    def __call__(self) -> bool:
        now = self.clock.monotonic()
        if self.waiting() > max(self.workers, MIN_BACKLOG):
            self.until = now + BUSY_PROGRESS_WRITE_INTERVAL
        return now < self.until


class StatusWriter:
    """Writes jobs' statuses, each over the resourceVersion it was computed from, and remembers
    the last one written per job (`written`)."""

    def __init__(self, kube: StatusAPI, clock: Clock, reported_interval: float = REPORTED_PROGRESS_INTERVAL,
                 waiting: Callable[[], int] = lambda: 0, workers: int = 1) -> None:
        self.kube, self.clock, self.reported_interval = kube, clock, reported_interval
        self.busy = Backlog(waiting, workers, clock)  # progress-only writes wait longer while it lasts
        self.written: dict[JobKey, WrittenStatus] = {}
        self.deferred: set[JobKey] = set()  # new jobs whose first status waits for their creates

    def view(self, key: JobKey, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The job as of our last write, when the index doesn't show it yet."""
        return with_own_status(self.written.get(key), body)

    def awaits_checkpoint(self, key: JobKey, jobs: Mapping[JobKey, Iterable[Mapping[str, Any]]]) -> bool:
        """Whether the job's stop waits for a checkpoint (status.checkpoint), as of our last write."""
        body = next(iter(jobs.get(key, ())), None)
        return body is not None and bool((self.view(key, body).get("status") or {}).get("checkpoint"))

    def progress_interval(self, body: Mapping[str, Any]) -> float:
        """BUSY_PROGRESS_WRITE_INTERVAL under a backlog, but for a job Kueue queues: a MultiKueue
        manager reads PodsReady off the worker's copy of its ready counts (decide/dispatch_steps.py),
        and a count held 30 s could outlast waitForPodsReady's recoveryTimeout."""
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        if queue_name(labels) or prebuilt_workload(labels, meta.get("annotations") or {}) or not self.busy():
            return PROGRESS_WRITE_INTERVAL
        return BUSY_PROGRESS_WRITE_INTERVAL

    def progress_due(self, key: JobKey) -> float:
        """Seconds until reported progress may be written for the job."""
        last = self.written.get(key)
        return 0.0 if last is None else max(0.0, last.at + self.reported_interval - self.clock.monotonic())

    def forget(self, key: JobKey) -> None:
        self.written.pop(key, None)
        self.deferred.discard(key)

    def last_version(self, key: JobKey, status: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
        """The resourceVersion to write over, for a status drawn from `status`: the one our last
        write made if that write was `status`, else the body's."""
        last = self.written.get(key)
        if last is not None and last.status == status:
            return last.after
        return str(body["metadata"].get("resourceVersion") or "") or None

    async def write_plan(self, key: JobKey, ref: JobRef, body: Mapping[str, Any], plan: Plan) -> bool:
        """The plan's status, unless unchanged, only progress just after a write, or a new job's
        first (after its creates). False: the job changed since it was read."""
        current, now = body.get("status") or {}, self.clock.monotonic()
        deferred = key in self.deferred
        self.deferred.discard(key)
        if not deferred and after_creates(current, plan.status, any(o["kind"] == "Pod" for o in plan.create)):
            self.deferred.add(key)  # once: a pass whose creates must wait writes its status next time
            plan.requeue_within(0)  # the next pass writes it, with the pods just made counted
            return True
        if plan.usage_write is None and without_usage(plan.status) == without_usage(current):
            return True  # a usage count alone waits for a write the job needs anyway (decide/policies/usage.py)
        wait = progress_wait(self.written.get(key), current, plan.status, now, self.reported_interval,
                             plan.usage_write, self.progress_interval(body))
        if wait is not None:
            plan.requeue_within(wait)
        if wait is not None or plan.status == current:
            return True
        return await self.write(key, ref, plan.status, body["metadata"].get("resourceVersion"), current)

    async def write(self, key: JobKey, ref: JobRef, status: Mapping[str, Any], before: str | None,
                    was: Mapping[str, Any] | None = None, remember: bool = True) -> bool:
        """`status` over `before` (None: unconditionally), in place of `was` (what it was computed
        from: what it no longer holds is removed). False on a Conflict: the job changed since, and
        is reconciled again from its newer version."""
        try:
            written = await self.kube.patch_job_status(ref.namespace, ref.name, merge_patch(was or {}, status),
                                                       before or None)
        except Conflict:
            self.written.pop(key, None)
            return False
        if remember:
            self.written[key] = WrittenStatus(before or "", version(written), status, self.clock.monotonic())
        else:
            self.written.pop(key, None)
        return True
