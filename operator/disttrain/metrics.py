"""Prometheus metrics of the operator (served by `disttrain run --metrics-port`)."""

from prometheus_client import Counter, Histogram

JOBS = Counter("disttrain_job_transitions_total", "Job phase transitions, by reason", ["reason"])
JOBS_CREATED = Counter("disttrain_jobs_created_total", "Jobs the operator started")
JOBS_SUCCEEDED = Counter("disttrain_jobs_succeeded_total", "Jobs that succeeded")
JOBS_FAILED = Counter("disttrain_jobs_failed_total", "Jobs that failed")
JOBS_RESTARTED = Counter("disttrain_jobs_restarted_total", "Pod- or job-level restarts the operator made")
PODS_CREATED = Counter("disttrain_pods_created_total", "Pods the operator created")
PODS_DELETED = Counter("disttrain_pods_deleted_total", "Pods the operator deleted")
RECONCILE_SECONDS = Histogram("disttrain_reconcile_duration_seconds", "Time of one reconcile, API writes included")

_BY_REASON = {
    "JobSucceeded": JOBS_SUCCEEDED,
    "PodFailed": JOBS_RESTARTED,
    "PodDeleted": JOBS_RESTARTED,
}


def count_transition(reason: str) -> None:
    JOBS.labels(reason=reason).inc()
    counter = _BY_REASON.get(reason)
    if counter is not None:
        counter.inc()
    elif reason in ("ReplicaFailed", "BackoffLimitExceeded", "DeadlineExceeded", "InvalidSpec", "InvalidPodTemplate"):
        JOBS_FAILED.inc()
