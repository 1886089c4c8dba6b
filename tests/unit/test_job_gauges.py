"""Per-job gauges: what they show for a job body, and that a deleted job's series go away."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from disttrain.runtime.job_gauges import JobGauges, sample
from manifests import mwms_job, ps_job


def body(job: dict[str, Any], namespace: str = "ns", uid: str = "u1", **status: Any) -> dict[str, Any]:
    job = dict(job)
    job["metadata"] = {**job["metadata"], "namespace": namespace, "uid": uid,
                       "creationTimestamp": "2026-01-01T00:00:00Z"}
    job["status"] = status
    return job


RUNNING: dict[str, Any] = {
    "phase": "Running", "restarts": 2, "replicaStatuses": {"worker": {"ready": 3}, "ps": {"ready": 2}},
    "conditions": [{"type": "Running", "status": "True", "lastTransitionTime": "2026-01-01T00:00:42Z"}]}


def series(registry: CollectorRegistry, job_name: str) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("phase", "")): s.value for metric in registry.collect()
            for s in metric.samples if s.labels.get("job_name") == job_name}


def test_sample_reads_phase_pods_restarts_and_time_to_running() -> None:
    got = sample(body(ps_job("p"), **RUNNING))
    assert (got.phase, got.pods_ready, got.pods_desired, got.restarts, got.seconds_to_running) == \
        ("Running", 5, 7, 2, 42.0)
    fresh = sample(body(mwms_job("m", workers=2)))
    assert (fresh.phase, fresh.pods_ready, fresh.pods_desired, fresh.restarts, fresh.seconds_to_running) == \
        ("Pending", 0, 2, 0, None)
    not_running = {**RUNNING, "conditions": [{**RUNNING["conditions"][0], "status": "False"}]}
    assert sample(body(ps_job("p"), **not_running)).seconds_to_running is None


def test_gauges_show_one_phase_and_keep_the_first_time_to_running() -> None:
    registry = CollectorRegistry()
    gauges = JobGauges(registry)
    gauges.observe("ADDED", body(ps_job("p"), **RUNNING))
    later = {**RUNNING, "conditions": [{**RUNNING["conditions"][0], "lastTransitionTime": "2026-01-01T01:00:00Z"}]}
    gauges.observe("MODIFIED", body(ps_job("p"), **later))
    got = series(registry, "p")
    assert {phase for (name, phase), v in got.items() if name == "disttrain_job_phase" and v == 1} == {"Running"}
    assert [k for k in got if k[0] == "disttrain_job_phase"] == [("disttrain_job_phase", "Running")]
    assert got[("disttrain_job_pods_ready", "")] == 5 and got[("disttrain_job_pods_desired", "")] == 7
    assert got[("disttrain_job_restarts", "")] == 2
    assert got[("disttrain_job_seconds_to_running", "")] == 42.0


def test_a_deleted_jobs_series_go_away() -> None:
    registry = CollectorRegistry()
    gauges = JobGauges(registry)
    for i in range(50):  # jobs come and go: the series don't pile up
        gauges.observe(None, body(mwms_job(f"j{i}"), uid=f"u{i}", **RUNNING))
        gauges.observe("DELETED", body(mwms_job(f"j{i}"), uid=f"u{i}", **RUNNING))
    gauges.observe("ADDED", body(mwms_job("kept"), **RUNNING))
    names = {s.labels["job_name"] for metric in registry.collect() for s in metric.samples if "job_name" in s.labels}
    assert names == {"kept"}
    assert len(series(registry, "kept")) == 1 + 4


def test_a_job_made_again_under_the_same_name_starts_afresh() -> None:
    registry = CollectorRegistry()
    gauges = JobGauges(registry)
    gauges.observe("ADDED", body(mwms_job("again"), uid="old", **RUNNING))
    gauges.observe("ADDED", body(mwms_job("again"), uid="new", phase="Pending"))
    got = series(registry, "again")
    assert ("disttrain_job_seconds_to_running", "") not in got
    assert got[("disttrain_job_phase", "Pending")] == 1 and ("disttrain_job_phase", "Running") not in got


def test_a_report_ahead_of_its_jobs_first_event_is_kept() -> None:
    from disttrain.api.progress import parse_report

    registry = CollectorRegistry()
    gauges = JobGauges(registry)
    gauges.observe_report(("ns", "early"), "training", parse_report({"epoch": 1, "totalEpochs": 4,
                                                                      "metrics": {"loss": 0.5}}))
    gauges.observe("ADDED", body(mwms_job("early"), **RUNNING))
    got = {s.name: s.value for metric in registry.collect() for s in metric.samples
           if s.labels.get("job_name") == "early"}
    assert got["disttrain_job_progress_percent"] == 25 and got["disttrain_job_metric"] == 0.5
    assert got["disttrain_job_phase"] == 1


def test_a_held_job_costs_a_row_not_a_gauge_child_per_series() -> None:
    """make bench's scale run: five prometheus_client children a job were 3 KB of each job held."""
    import tracemalloc

    registry = CollectorRegistry()
    gauges = JobGauges(registry)
    jobs = [body(mwms_job(f"j{i}"), uid=f"u{i}", **RUNNING) for i in range(2000)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for job in jobs:
        gauges.observe("ADDED", job)
    grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown / len(jobs) < 600, f"{grown / len(jobs):.0f} bytes a job"
    assert sum(1 for metric in registry.collect() for _ in metric.samples) == 2000 * 5


def test_a_reporter_sending_new_names_keeps_at_most_16_series_a_role() -> None:
    """Issue 31: the 16-metric bound held per report only; 1,000 reports of 16 new names each grew
    one job's series to 16,000 (and the operator's memory and /metrics with them)."""
    from disttrain.api.progress import MAX_METRICS, Report

    registry = CollectorRegistry()
    gauges = JobGauges(registry)
    gauges.observe("ADDED", body(mwms_job("m")))
    for n in range(1000):
        gauges.observe_report(("ns", "m"), "training", Report(metrics={f"m{n}_{i}": 1.0 for i in range(MAX_METRICS)}))
    gauges.observe_report(("ns", "m"), "evaluation", Report(metrics={"acc": 0.5}))
    gauges.observe_report(("ns", "m"), "training", Report(metrics={"m0_3": 7.0}))
    metric = [s for m in registry.collect() for s in m.samples
              if s.name == "disttrain_job_metric" and s.labels["job_name"] == "m"]
    assert len([s for s in metric if s.labels["role"] == "training"]) == MAX_METRICS
    assert {s.labels["metric"] for s in metric if s.labels["role"] == "evaluation"} == {"acc"}
    assert {s.labels["metric"]: s.value for s in metric if s.labels["role"] == "training"}["m0_3"] == 7.0, \
        "the kept names still move"


def test_a_jobs_usage_is_a_counter_per_use_it_has_as_last_counted() -> None:
    registry = CollectorRegistry()
    gauges = JobGauges(registry)
    counted = {"resource": "nvidia.com/gpu", "seconds": {"training": 480.0, "waiting": 64.0, "bogus": 1, "redone": "x"}}
    gauges.observe("MODIFIED", body(mwms_job("m"), **RUNNING, usage=counted))
    found = {(s.name, s.labels["use"], s.labels["resource"]): s.value for metric in registry.collect()
             for s in metric.samples if s.name.startswith("disttrain_job_usage_seconds")}
    assert found == {("disttrain_job_usage_seconds_total", "training", "nvidia.com/gpu"): 480.0,
                     ("disttrain_job_usage_seconds_total", "waiting", "nvidia.com/gpu"): 64.0}
    gauges.observe("MODIFIED", body(mwms_job("m"), **RUNNING, usage="junk"))
    assert not any(s.name.startswith("disttrain_job_usage") for m in registry.collect() for s in m.samples)
