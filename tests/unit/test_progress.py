"""Training progress, the pure half: what a report may hold (api/progress.py), who reports
(`reporter_role`), what status.progress says of it (decide/progress.py), and what a reporting pod
is given (builders/progress.py)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import pytest

from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.api.progress import AUDIENCE, Report, ReportError, Role, parse_report, reporter_role
from disttrain.api.status import Phase
from disttrain.builders.desired import job_pod
from disttrain.builders.progress import PROGRESS_DIR, ProgressEndpoint
from disttrain.decide.progress import MAX_HISTORY, ProgressState, Reported, human_duration, progress_status
from manifests import mpi_job, mwms_job, replica, tf_job

T0 = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_a_report_is_read_and_bounded() -> None:
    report = parse_report({"epoch": 3, "totalEpochs": 10, "step": 300, "totalSteps": 1000,
                           "metrics": {"loss": 0.25, "val_accuracy": 1}})
    assert report == Report(3, 10, 300, 1000, {"loss": 0.25, "val_accuracy": 1.0})
    assert report.fraction == 0.3
    assert Report(epoch=2, total_epochs=8).fraction == 0.25 and Report(step=5).fraction is None


@pytest.mark.parametrize(("body", "says"), [
    ([], "a report is a JSON object"),
    ({"epochs": 3}, "unknown field 'epochs'"),
    ({"epoch": -1}, "epoch must be a whole number"),
    ({"step": 1.5}, "step must be a whole number"),
    ({"epoch": True}, "epoch must be a whole number"),
    ({"totalSteps": 0}, "totalSteps must be at least 1"),
    ({"metrics": [1]}, "metrics must be an object"),
    ({"metrics": {"1st": 1}}, "metric name '1st'"),
    ({"metrics": {"loss": float("nan")}}, "metric loss must be a finite number"),
    ({"metrics": {"loss": "0.2"}}, "metric loss must be a finite number"),
    ({"metrics": {f"m{i}": i for i in range(17)}}, "at most 16 metrics"),
])
def test_a_bad_report_is_refused_naming_the_field(body: Any, says: str) -> None:
    with pytest.raises(ReportError, match=says):
        parse_report(body)


def test_who_reports_for_each_kind_of_job() -> None:
    ps = parse_spec(tf_job("ps", None, chief=replica(1), ps=replica(1), worker=replica(2),
                           evaluator=replica(1))["spec"])
    assert reporter_role(ps, "chief", 0) is Role.TRAINING  # the coordinator
    assert reporter_role(ps, "worker", 0) is None and reporter_role(ps, "ps", 0) is None
    assert reporter_role(ps, "evaluator", 0) is Role.EVALUATION
    mwms = parse_spec(mwms_job("m", workers=3)["spec"])
    assert [reporter_role(mwms, "worker", i) for i in range(3)] == [Role.TRAINING, None, None]
    mpi = parse_spec(mpi_job("h", workers=2)["spec"])
    assert {reporter_role(mpi, t, i) for t, i in (("launcher", 0), ("worker", 0), ("worker", 1))} == {Role.TRAINING}


def state(*reports: tuple[float, Report], evaluation: tuple[float, Report] | None = None,
          gap: float | None = None) -> ProgressState:
    seconds, report = reports[-1]
    return ProgressState(training=Reported(report, "mnist-worker-0", at(seconds)),
                         evaluation=Reported(evaluation[1], "mnist-evaluator-0", at(evaluation[0]))
                         if evaluation else None, gap_seconds=gap)


def written_over(reports: Sequence[tuple[float, Report]], phase: Phase = Phase.RUNNING,
                 now: float | None = None) -> dict[str, Any]:
    """status.progress after a status write for each report in turn."""
    progress: dict[str, Any] | None = None
    for seconds, report in reports:
        progress, _ = progress_status(state((seconds, report)), progress, phase, at(seconds if now is None else now))
    assert progress is not None
    return progress


def test_percent_eta_and_history_from_the_reports() -> None:
    reports = [(t, Report(epoch=t // 60, total_epochs=10, step=t, total_steps=600, metrics={"loss": 1 / (1 + t)}))
               for t in (0, 60, 120, 180)]
    progress = written_over(reports)
    assert progress["percent"] == 30 and progress["step"] == 180 and progress["totalSteps"] == 600
    assert progress["remainingSeconds"] == 420 and progress["eta"] == "7m"  # a step a second, 420 left
    assert progress["metrics"] == {"loss": 1 / 181} and progress["reporter"] == "mnist-worker-0"
    assert [p["step"] for p in progress["history"]] == [0, 60, 120, 180]
    assert "stale" not in progress


def test_no_eta_from_a_single_report_nor_once_finished() -> None:
    first = written_over([(0, Report(step=10, total_steps=100))])
    assert "eta" not in first and first["percent"] == 10
    done = written_over([(0, Report(step=10, total_steps=100)), (10, Report(step=20, total_steps=100))],
                        phase=Phase.SUCCEEDED)
    assert "eta" not in done and "remainingSeconds" not in done
    assert done["percent"] == 20 and done["step"] == 20, "a finished job keeps its last values"


def test_a_running_job_silent_too_long_is_stale_and_looked_at_again_in_time() -> None:
    reports = [(0, Report(step=1, total_steps=100)), (10, Report(step=2, total_steps=100))]
    progress = written_over(reports)
    again, recheck = progress_status(state(reports[-1], gap=10), progress, Phase.RUNNING, at(20))
    assert again is not None and "stale" not in again and recheck == 290  # 5 minutes after the last report
    stale, _ = progress_status(state(reports[-1], gap=10), progress, Phase.RUNNING, at(310))
    assert stale is not None and stale["stale"] is True and stale["eta"] == "stale"
    slow, _ = progress_status(state(reports[-1], gap=600), progress, Phase.RUNNING, at(1000))
    assert slow is not None and "stale" not in slow, "a job reporting every 10 minutes is not stale after 5"


def test_the_evaluators_report_stands_apart() -> None:
    progress, _ = progress_status(state((5, Report(epoch=1, total_epochs=4, metrics={"loss": 0.9})),
                                        evaluation=(6, Report(epoch=1, metrics={"loss": 0.7, "accuracy": 0.8}))),
                                  None, Phase.RUNNING, at(6))
    assert progress is not None and progress["metrics"] == {"loss": 0.9}
    assert progress["evaluation"]["metrics"] == {"loss": 0.7, "accuracy": 0.8}
    assert progress["evaluation"]["reporter"] == "mnist-evaluator-0"


def test_the_history_stays_bounded_and_spans_the_training() -> None:
    progress = written_over([(t, Report(step=t, total_steps=10_000)) for t in range(500)])
    history = progress["history"]
    assert len(history) <= MAX_HISTORY
    assert history[0]["step"] == 0 and history[-1]["step"] == 499
    assert [p["step"] for p in history] == sorted(p["step"] for p in history)


def test_nothing_reported_adds_nothing() -> None:
    assert progress_status(None, None, Phase.RUNNING, T0) == (None, None)


def test_durations_read_as_kubectls() -> None:
    assert [human_duration(s) for s in (45, 432, 3600, 3600 * 3 + 240, 86400 * 2 + 3600 * 5)] == \
        ["45s", "7m12s", "1h", "3h4m", "2d5h"]


def test_a_reporting_pod_gets_its_token_address_and_ca() -> None:
    job = JobRef("mnist", "ml", "uid-1")
    spec = parse_spec(mwms_job("mnist", workers=2)["spec"])
    endpoint = ProgressEndpoint("https://disttrain-progress.disttrain-system.svc:8443", "-----BEGIN CERTIFICATE-----")
    pod = job_pod(job, spec, PodKey("worker", 0), report_to=endpoint)
    annotations = pod["metadata"]["annotations"]
    assert annotations["disttrain.dev/progress-url"] == ("https://disttrain-progress.disttrain-system.svc:8443/apis/"
                                                         "disttrain.dev/v1/namespaces/ml/disttrainjobs/mnist/progress")
    assert annotations["disttrain.dev/progress-role"] == "training"
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "disttrain-progress"]
    token = volume["projected"]["sources"][0]["serviceAccountToken"]
    assert token == {"audience": AUDIENCE, "expirationSeconds": 3600, "path": "token"}
    container = pod["spec"]["containers"][0]
    assert {"name": "disttrain-progress", "mountPath": PROGRESS_DIR, "readOnly": True} in container["volumeMounts"]
    assert {"name": "DISTTRAIN_PROGRESS_DIR", "value": PROGRESS_DIR} in container["env"]
    url = annotations["disttrain.dev/progress-url"]
    assert {"name": "DISTTRAIN_PROGRESS_URL", "value": url} in container["env"]
    other = job_pod(job, spec, PodKey("worker", 1), report_to=endpoint)
    assert "disttrain.dev/progress-url" not in (other["metadata"].get("annotations") or {}), "worker 1 doesn't report"
    assert job_pod(job, spec, PodKey("worker", 0)) == job_pod(job, spec, PodKey("worker", 0), report_to=None)


def test_reports_reach_the_status_once_an_interval_however_often_they_come() -> None:
    """However often the pods report, a job's status takes its progress at most once every
    REPORTED_PROGRESS_INTERVAL; a transition carries the latest at once, and a finished job keeps it."""
    import asyncio

    from test_controller import RUNNING, Harness

    from disttrain.control.status_writes import REPORTED_PROGRESS_INTERVAL

    async def scenario() -> None:
        h = Harness(mwms_job("mnist", workers=2))
        await h.run()
        writes = len(h.kube.statuses)
        for step in range(1, 101):  # a hundred reports within the interval
            h.controller.progress.record(("ml", "mnist"), "uid-1", Role.TRAINING, "mnist-worker-0",
                                         Report(step=step, total_steps=1000, metrics={"loss": 1 / step}),
                                         h.clock.now())
            h.body["status"] = h.status()
            await h.reconcile()
        assert len(h.kube.statuses) == writes, "held: the job's last write was just now"
        h.clock.advance(REPORTED_PROGRESS_INTERVAL)
        await h.reconcile()
        assert len(h.kube.statuses) == writes + 1
        assert h.status()["progress"]["step"] == 100 and h.status()["progress"]["percent"] == 10
        h.body["status"] = h.status()
        h.controller.progress.record(("ml", "mnist"), "uid-1", Role.TRAINING, "mnist-worker-0",
                                     Report(step=1000, total_steps=1000, metrics={"loss": 0.01}), h.clock.now())
        h.watch(phase="Succeeded", conditions=RUNNING["conditions"])
        await h.reconcile()
        assert h.status()["phase"] == "Succeeded", "a transition is written at once, with the latest report"
        assert h.status()["progress"]["metrics"] == {"loss": 0.01} and "eta" not in h.status()["progress"]
    asyncio.run(scenario())
