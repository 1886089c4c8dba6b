"""Where job events come in: the operator's own list+watch of DistTrainJobs (reflector.py).

kopf followed them until issue 45, through an index and an event handler: for each event a body
view, a memo, a state, the index's old and new values compared, and a handler task (8% of the
operator's CPU in a 1,000-job burst, profiled, where our own decode and hold is a fraction of
that: job_events.py). kopf still logs in and runs the start-up and clean-up (handlers.py); Kueue's
Workloads are ours too (workloadwatch.py).

A job is queued on every event that changed what is held (its metadata, spec or status), and on
its deletion; a re-list drops what went while no watch ran, and queues it, as a DELETED event would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from disttrain.api.constants import GROUP, PLURAL, VERSION
from disttrain.apiserver.rest import Rest
from disttrain.watch.job_events import HeldJob, decode_event, decode_list
from disttrain.watch.reflector import Reflector, Resource

JobKey = tuple[str, str]
# Every job: the selector is empty, and what the CRD serves is all ours.
JOBS = Resource(f"{GROUP}/{VERSION}", PLURAL, "", decode_list, decode_event)


class JobsByKey(Mapping[JobKey, tuple[HeldJob]]):
    """The index the controller reads: a job's key -> (the job,), as kopf's index gave it."""

    def __init__(self, held: dict[JobKey, HeldJob]) -> None:
        self._held = held

    def __getitem__(self, key: JobKey) -> tuple[HeldJob]:
        return (self._held[key],)

    def __iter__(self) -> Iterator[JobKey]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


class JobWatch:
    def __init__(self, rest: Rest, namespaces: Iterable[str], changed: Callable[[JobKey], None],
                 observed: Callable[[str | None, Mapping[str, Any]], None] = lambda kind, job: None) -> None:
        """`changed(key)` when a job was made, changed or deleted; `observed(kind, job)` on each (the
        job gauges: runtime/job_gauges.py; kind None for a listed one, as kopf's)."""
        self.changed, self.observed = changed, observed
        self.held: dict[JobKey, HeldJob] = {}
        self.view = JobsByKey(self.held)
        self.reflector: Reflector[HeldJob] = Reflector(rest, JOBS, namespaces, self._hold, self._replace,
                                                       self._apply)
        self.synced = self.reflector.synced

    async def run(self) -> None:
        await self.reflector.run()

    def _hold(self, job: HeldJob) -> HeldJob | None:
        return job if self.reflector.keeps(job.metadata.get("namespace", "")) else None

    def _replace(self, scope: str | None, listed: list[HeldJob]) -> None:
        found = {_key(job): job for job in listed}
        for key in [k for k in self.held if (scope is None or k[0] == scope) and k not in found]:
            gone = self.held.pop(key)
            self.observed("DELETED", gone)
            self.changed(key)
        for key, job in found.items():
            self.observed(None, job)
            if self.held.get(key) != job:
                self.held[key] = job
                self.changed(key)

    def _apply(self, kind: str, job: Mapping[str, Any]) -> None:
        assert isinstance(job, HeldJob)
        key = _key(job)
        if self._hold(job) is None:
            return
        self.observed(kind, job)
        if kind == "DELETED":
            if self.held.pop(key, None) is not None:
                self.changed(key)
            return
        if self.held.get(key) != job:
            self.held[key] = job
            self.changed(key)


def _key(job: HeldJob) -> JobKey:
    return job.metadata.get("namespace", ""), job.metadata.get("name", "")
