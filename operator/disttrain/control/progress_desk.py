"""The controller's side of a progress report: whose pod sent it, whether that pod reports for the
job it names, and into the book with it. The endpoint's process (endpoint/server.py) has reviewed
the token and checked the body; what it asks here is a few dictionary lookups, so however hard the
endpoint is flooded, reconciling pays for reports that came from a reporting pod only.

The report is parsed again: what comes over the link is trusted no more than the report it carries.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any, Protocol

from disttrain.api.observed import ObservedPod
from disttrain.api.progress import ReportError, Role, parse_report
from disttrain.control.progress_book import ProgressBook
from disttrain.runtime.progress_link import Identity, JobKey, Refused

log = logging.getLogger(__name__)


class Pods(Protocol):
    def find(self, uid: str) -> tuple[JobKey, ObservedPod] | None: ...


class ProgressDesk:
    def __init__(self, pods: Pods, book: ProgressBook, role_of: Callable[[JobKey, ObservedPod], Role | None],
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)) -> None:
        self.pods, self.book, self.role_of, self.now = pods, book, role_of, now

    async def submit(self, identity: Identity, job: JobKey, body: dict[str, Any]) -> str:
        return self.record(identity, job, body)

    def record(self, identity: Identity, job: JobKey, body: Any) -> str:
        """The accepted message, or Refused (403, or 400 for a report that doesn't parse)."""
        try:
            report = parse_report(body)
        except (ReportError, RecursionError, OverflowError) as err:
            raise Refused(400, "invalid", f"invalid report: {str(err)[:300]}") from err
        found = self.pods.find(identity.pod_uid)
        if found is None or found[1].name != identity.pod or found[0][0] != identity.namespace:
            raise Refused(403, "forbidden", f"pod {identity.namespace}/{identity.pod} is not a pod of a DistTrainJob")
        key, pod = found
        if key != job:
            log.warning("refused a report for %s/%s from pod %s/%s, a pod of job %s", *job, identity.namespace,
                        identity.pod, key[1])
            raise Refused(403, "forbidden", f"pod {identity.namespace}/{identity.pod} belongs to job {key[1]}, "
                                            f"not {job[1]}: a pod reports for its own job only")
        role = self.role_of(key, pod)
        if role is None:
            raise Refused(403, "forbidden", f"pod {identity.pod} does not report for job {key[1]}: its chief (or "
                                            "worker 0), evaluator or MPI rank 0 does")
        self.book.record(key, pod.owner_uid, role, pod.name, report, self.now())
        return f"accepted for {job[0]}/{job[1]} from {pod.name} ({role.value})"
