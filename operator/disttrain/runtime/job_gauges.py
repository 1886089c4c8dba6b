"""Per-job gauges: phase, pods ready and wanted, restarts, and how long a job took from `kubectl
apply` to every pod running. Read from the job's own object (the status the operator writes comes
back as a watch event), so they say what `kubectl get dtj` says.

Cardinality stays bounded: a job's series go away when it is deleted (its DELETED event), and the
labels are the job's namespace and name only, never a pod's. The labels are `job_namespace` and
`job_name`: `namespace` and `job` are the target labels Prometheus adds to every scraped series,
which would rename ours to `exported_*`.

A collector over one compact row per job, read when Prometheus scrapes, rather than a
prometheus_client Gauge child per series: a child (its lock, value and label tuple) is some 800
bytes, five of them a job, which was the largest share of the memory a held job costs
(tracemalloc in `make bench`'s scale run: 616 of the 2,100 bytes traced per pod held; issue 25)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from disttrain.api.crd_usage import USES
from disttrain.api.parse import SpecError, parse_spec
from disttrain.api.progress import MAX_METRICS, Report
from disttrain.api.status import Phase, true_since
from disttrain.api.times import parse_timestamp
from disttrain.decide.dispatch_steps import managed_elsewhere

LABELS = ("job_namespace", "job_name")


@dataclass(frozen=True)
class JobSample:
    uid: str
    phase: str
    pods_ready: int
    pods_desired: int
    restarts: int
    seconds_to_running: float | None  # once the job has had every pod running
    stalled: bool = False  # its Stalled condition is True (decide/stall_steps.py)
    usage: tuple[str, tuple[tuple[str, float], ...]] | None = None  # status.usage: resource, seconds by use


def sample(job: Mapping[str, Any]) -> JobSample:
    """What the gauges show for a job body (as the API serves it)."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    try:
        spec = parse_spec(job.get("spec") or {})
        desired, dispatched = spec.total_pods, managed_elsewhere(spec)
    except SpecError:
        desired, dispatched = 0, False  # the operator fails such a job; it wants no pods
    ready = sum(int(c.get("ready") or 0) for c in (status.get("replicaStatuses") or {}).values())
    return JobSample(uid=meta.get("uid", ""), phase=status.get("phase") or Phase.PENDING.value, pods_ready=ready,
                     pods_desired=desired, restarts=int(status.get("restarts") or 0),
                     seconds_to_running=seconds_to_running(meta, status),
                     stalled=any(c.get("type") == "Stalled" and c.get("status") == "True"
                                 for c in status.get("conditions") or []),
                     # A job run by another cluster (MultiKueue): its usage is that cluster's, which its
                     # operator exports; counted here too, a query over both would count it twice.
                     usage=None if dispatched else usage_of(status.get("usage")))


def usage_of(found: Any) -> tuple[str, tuple[tuple[str, float], ...]] | None:
    """status.usage's seconds by use, as written (only numbers, only the uses there are)."""
    if not isinstance(found, Mapping) or not isinstance(found.get("seconds"), Mapping):
        return None
    seconds = found["seconds"]
    return str(found.get("resource") or ""), tuple(
        (use, float(seconds[use])) for use in USES
        if isinstance(seconds.get(use), int | float) and not isinstance(seconds.get(use), bool))


def seconds_to_running(meta: Mapping[str, Any], status: Mapping[str, Any]) -> float | None:
    """From the job's creation to its Running condition turning True (every pod running); None
    while it is not True: the condition's time is then when it turned False."""
    created, since = parse_timestamp(meta.get("creationTimestamp")), true_since(status, Phase.RUNNING.value)
    if created is None or since is None:
        return None
    return max(0.0, (since - created).total_seconds())


JobKey = tuple[str, str]
FAMILIES = (  # name, help, labels after LABELS
    ("disttrain_job_phase", "1, labelled with the job's current phase", ("phase",)),
    ("disttrain_job_pods_ready", "Ready pods of the job", ()),
    ("disttrain_job_pods_desired", "Pods the job wants", ()),
    ("disttrain_job_restarts", "Restarts of the job so far (status.restarts)", ()),
    ("disttrain_job_seconds_to_running", "Seconds from the job's creation to every pod running, first time", ()),
    ("disttrain_job_stalled", "1 while the job's Stalled condition is True (no series otherwise): its training's "
                              "reported step has stood still past its timeout (runPolicy.stallTimeoutSeconds)", ()),
    # What the pods report (api/progress.py): at most MAX_METRICS names per role per job, the first reported.
    ("disttrain_job_progress_percent", "Percent of the training done, as the job's training reporter last said", ()),
    ("disttrain_job_metric", "The latest value of a metric a job's pod reported (loss, accuracy, ...); role is "
                             "training or evaluation", ("role", "metric")),
)
# A counter: the job's held GPU-seconds (or CPU core-seconds) by use, as status.usage last counted them.
USAGE_FAMILY = ("disttrain_job_usage_seconds", "Resource-seconds the job's pods held (GPU-seconds; CPU core-seconds "
                "for a job without GPUs), by use: training, redone, waiting, checkpoint, stalled, other "
                "(status.usage, as of its last count)", ("resource", "use"))


@dataclass(slots=True)
class _Row:
    """A job's series. One series per job for its current phase (value 1): seven per job, six of
    them 0, were most of the operator's series at 10,000 jobs; `sum by (phase)` counts the same."""
    uid: str
    phase: str = Phase.PENDING.value
    ready: int = 0
    desired: int = 0
    restarts: int = 0
    seconds_to_running: float | None = None  # the first time only
    stalled: bool = False
    usage: tuple[str, tuple[tuple[str, float], ...]] | None = None
    percent: float | None = None
    metrics: dict[tuple[str, str], float] = field(default_factory=dict)  # (role, metric) -> value


class JobGauges(Collector):
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._rows: dict[JobKey, _Row] = {}
        registry.register(self)

    def observe(self, event_type: str | None, job: Mapping[str, Any]) -> None:
        """A watch event of a job: its gauges set, or removed when it is deleted."""
        meta = job.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self.forget(*key)
            return
        now = sample(job)
        row = self._rows.get(key)
        if row is None or row.uid not in ("", now.uid):  # new, or deleted and made again under its name: afresh
            row = self._rows[key] = _Row(now.uid)
        row.uid = now.uid
        row.phase, row.ready, row.desired, row.restarts = now.phase, now.pods_ready, now.pods_desired, now.restarts
        row.stalled, row.usage = now.stalled, now.usage
        # The first time only: a restarted job's Running condition moves, its start-up latency doesn't.
        if now.seconds_to_running is not None and row.seconds_to_running is None:
            row.seconds_to_running = now.seconds_to_running

    def observe_report(self, key: JobKey, role: str, report: Report) -> None:
        """A report a job's pod made: its percent and each of its metrics."""
        row = self._rows.get(key)
        if row is None:  # ahead of its job's first watch event: the event adopts the row
            row = self._rows[key] = _Row("")
        fraction = report.fraction
        if role == "training" and fraction is not None:
            row.percent = round(fraction * 100, 2)
        kept = sum(1 for (of, _) in row.metrics if of == role)
        for name, value in report.metrics.items():
            if (role, name) in row.metrics or kept < MAX_METRICS:
                kept += (role, name) not in row.metrics
                row.metrics[(role, name)] = value
            # else: a 17th name is left out of the metrics (status.progress still has it): the first
            # MAX_METRICS names a role reported are its series, however many reports bring new ones.

    def forget(self, namespace: str, name: str) -> None:
        self._rows.pop((namespace, name), None)

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, doc, extra in FAMILIES:
            yield GaugeMetricFamily(name, doc, labels=[*LABELS, *extra])
        yield CounterMetricFamily(USAGE_FAMILY[0], USAGE_FAMILY[1], labels=[*LABELS, *USAGE_FAMILY[2]])

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The series now. Scraped from the metrics server's thread while the event loop changes
        rows: list() of a dict's items is one step under the GIL, so what is read is consistent
        per row, never a dict that changes size under iteration."""
        phase, ready, desired, restarts, to_running, stalled, percent, metric = (
            GaugeMetricFamily(name, doc, labels=[*LABELS, *extra]) for name, doc, extra in FAMILIES)
        used = CounterMetricFamily(USAGE_FAMILY[0], USAGE_FAMILY[1], labels=[*LABELS, *USAGE_FAMILY[2]])
        for (namespace, name), row in list(self._rows.items()):
            labels = [namespace, name]
            phase.add_metric([*labels, row.phase], 1)
            ready.add_metric(labels, row.ready)
            desired.add_metric(labels, row.desired)
            restarts.add_metric(labels, row.restarts)
            if row.seconds_to_running is not None:
                to_running.add_metric(labels, row.seconds_to_running)
            if row.stalled:  # only then: a 0 per job would be a series per job for nothing (as the phase's)
                stalled.add_metric(labels, 1)
            if row.percent is not None:
                percent.add_metric(labels, row.percent)
            for (role, metric_name), value in list(row.metrics.items()):
                metric.add_metric([*labels, role, metric_name], value)
            if row.usage is not None:
                for use, seconds in row.usage[1]:
                    used.add_metric([*labels, row.usage[0], use], seconds)
        yield from (phase, ready, desired, restarts, to_running, stalled, percent, metric, used)
