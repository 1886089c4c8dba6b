"""Per-job gauges: phase, pods ready and wanted, restarts, and how long a job took from `kubectl
apply` to every pod running. Read from the job's own object (the status the operator writes comes
back as a watch event), so they say what `kubectl get dtj` says.

Cardinality stays bounded: a job's series go away when it is deleted (its DELETED event), and the
labels are the job's namespace and name only, never a pod's. The labels are `job_namespace` and
`job_name`: `namespace` and `job` are the target labels Prometheus adds to every scraped series,
which would rename ours to `exported_*`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from disttrain.api.progress import Report
from disttrain.api.spec import SpecError, parse_spec
from disttrain.api.status import Phase, parse_timestamp

LABELS = ("job_namespace", "job_name")


@dataclass(frozen=True)
class JobSample:
    uid: str
    phase: str
    pods_ready: int
    pods_desired: int
    restarts: int
    seconds_to_running: float | None  # once the job has had every pod running


def sample(job: Mapping[str, Any]) -> JobSample:
    """What the gauges show for a job body (as the API serves it)."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    try:
        desired = parse_spec(job.get("spec") or {}).total_pods
    except SpecError:
        desired = 0  # the operator fails such a job; it wants no pods
    ready = sum(int(c.get("ready") or 0) for c in (status.get("replicaStatuses") or {}).values())
    return JobSample(uid=meta.get("uid", ""), phase=status.get("phase") or Phase.PENDING.value, pods_ready=ready,
                     pods_desired=desired, restarts=int(status.get("restarts") or 0),
                     seconds_to_running=seconds_to_running(meta, status))


def seconds_to_running(meta: Mapping[str, Any], status: Mapping[str, Any]) -> float | None:
    """From the job's creation to its Running condition turning True (every pod running); None
    while it is not True: the condition's time is then when it turned False."""
    running = next((c for c in status.get("conditions") or [] if c.get("type") == Phase.RUNNING.value), None)
    created = parse_timestamp(meta.get("creationTimestamp"))
    since = parse_timestamp(running.get("lastTransitionTime")) if running and running.get("status") == "True" else None
    if created is None or since is None:
        return None
    return max(0.0, (since - created).total_seconds())


class JobGauges:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        def gauge(name: str, doc: str, *extra: str) -> Gauge:
            return Gauge(name, doc, [*LABELS, *extra], registry=registry)

        # One series per job, for its current phase (value 1): seven per job, six of them 0, were
        # most of the operator's series at 10,000 jobs; `sum by (phase)` counts the same (issue 25).
        self.phase = gauge("disttrain_job_phase", "1, labelled with the job's current phase", "phase")
        self.pods_ready = gauge("disttrain_job_pods_ready", "Ready pods of the job")
        self.pods_desired = gauge("disttrain_job_pods_desired", "Pods the job wants")
        self.restarts = gauge("disttrain_job_restarts", "Restarts of the job so far (status.restarts)")
        self.seconds_to_running = gauge("disttrain_job_seconds_to_running",
                                        "Seconds from the job's creation to every pod running, first time")
        # What the pods report (api/progress.py): bounded by its MAX_METRICS per role.
        self.progress_percent = gauge("disttrain_job_progress_percent",
                                      "Percent of the training done, as the job's training reporter last said")
        self.metric = gauge("disttrain_job_metric", "The latest value of a metric a job's pod reported (loss, "
                            "accuracy, ...); role is training or evaluation", "role", "metric")
        self._reported: dict[tuple[str, str], set[tuple[str, str]]] = {}  # job -> (role, metric) series
        self._uids: dict[tuple[str, str], str] = {}  # the jobs that have series, and whose they are
        self._phases: dict[tuple[str, str], str] = {}  # the phase each job's series is labelled with
        self._ran: set[tuple[str, str]] = set()  # the jobs whose seconds_to_running is set

    def observe(self, event_type: str | None, job: Mapping[str, Any]) -> None:
        """A watch event of a job: its gauges set, or removed when it is deleted."""
        meta = job.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.forget(*key)
            return
        now = sample(job)
        if self._uids.get(key) not in (None, now.uid):
            self.forget(*key)  # deleted and made again under the same name: start afresh
        self._uids[key] = now.uid
        before = self._phases.get(key)
        if before is not None and before != now.phase:
            self.phase.remove(*key, before)
        self.phase.labels(*key, now.phase).set(1)
        self._phases[key] = now.phase
        self.pods_ready.labels(*key).set(now.pods_ready)
        self.pods_desired.labels(*key).set(now.pods_desired)
        self.restarts.labels(*key).set(now.restarts)
        # The first time only: a restarted job's Running condition moves, its start-up latency doesn't.
        if now.seconds_to_running is not None and key not in self._ran:
            self.seconds_to_running.labels(*key).set(now.seconds_to_running)
            self._ran.add(key)

    def observe_report(self, key: tuple[str, str], role: str, report: Report) -> None:
        """A report a job's pod made: its percent and each of its metrics."""
        fraction = report.fraction
        if role == "training" and fraction is not None:
            self.progress_percent.labels(*key).set(round(fraction * 100, 2))
        series = self._reported.setdefault(key, set())
        for name, value in report.metrics.items():
            self.metric.labels(*key, role, name).set(value)
            series.add((role, name))

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        for role, metric in self._reported.pop(key, ()):
            self.metric.remove(*key, role, metric)
        self._uids.pop(key, None)
        self._ran.discard(key)
        phase = self._phases.pop(key, None)
        if phase is not None:
            self.phase.remove(*key, phase)
        for gauge in (self.pods_ready, self.pods_desired, self.restarts, self.seconds_to_running,
                      self.progress_percent):
            gauge.remove(*key)

