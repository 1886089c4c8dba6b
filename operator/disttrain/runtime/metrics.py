"""Prometheus metrics of the operator (served by `disttrain run --metrics-port`)."""

from prometheus_client import Counter, Gauge, Histogram

from disttrain.decide.reasons import FAILURES, RESTARTS, Reason
from disttrain.runtime.job_gauges import JobGauges

JOBS = Counter("disttrain_job_transitions_total", "Job phase transitions, by reason", ["reason"])
JOBS_CREATED = Counter("disttrain_jobs_created_total", "Jobs the operator started")
JOBS_SUCCEEDED = Counter("disttrain_jobs_succeeded_total", "Jobs that succeeded")
JOBS_FAILED = Counter("disttrain_jobs_failed_total", "Jobs that failed")
JOBS_RESTARTED = Counter("disttrain_jobs_restarted_total", "Pod- or job-level restarts the operator made")
PODS_CREATED = Counter("disttrain_pods_created_total", "Pods the operator created")
PODS_DELETED = Counter("disttrain_pods_deleted_total", "Pods the operator deleted")
PROGRESS_REPORTS = Counter(
    "disttrain_progress_reports_total", "Progress reports pods sent, by how they were answered: accepted, "
    "invalid, unauthenticated, forbidden, throttled, unavailable", ["result"])
# The endpoint's own process (endpoint/process.py) counts; the controller's /metrics shows them.
PROGRESS_CONNECTIONS = Gauge("disttrain_progress_connections", "Connections open to the progress endpoint")
PROGRESS_CONNECTIONS_CLOSED = Counter(
    "disttrain_progress_connections_closed_total", "Connections to the progress endpoint closed by its bounds: "
    "refused (past the connections from one address, or in all), expired (not answered within its deadline) or "
    "evicted (the oldest of the address holding the most, to make room for another's)",
    ["reason"])
PROGRESS_ENDPOINT_STARTS = Counter("disttrain_progress_endpoint_starts_total",
                                   "Times the progress endpoint's process was started (more than 1: it ended)")
RECONCILE_SECONDS = Histogram("disttrain_reconcile_duration_seconds", "Time of one reconcile, API writes included")
# Per job (phase, pods ready and wanted, restarts, time to running), set from the jobs' watch events.
JOB_GAUGES = JobGauges()


def count_transition(reason: Reason) -> None:
    JOBS.labels(reason=reason.value).inc()
    if reason is Reason.JOB_SUCCEEDED:
        JOBS_SUCCEEDED.inc()
    elif reason in RESTARTS:
        JOBS_RESTARTED.inc()
    elif reason in FAILURES:
        JOBS_FAILED.inc()
