"""What `Client.wait()` shows: one line per change, the phase, ready pods and restarts."""

from __future__ import annotations

import io

from disttrain.client.progress import JobStatus, default_progress, print_changes


def status(phase: str = "Running", ready: str = "2/2", restarts: int = 0, reason: str = "AllPodsRunning",
           message: str = "all 2 pods are running") -> JobStatus:
    return JobStatus.of({"metadata": {"name": "mnist"}, "status": {
        "phase": phase, "ready": ready, "restarts": restarts, "reason": reason, "message": message}})


def test_line_says_phase_ready_restarts_and_why() -> None:
    assert status().line() == "mnist: Running, 2/2 ready, 0 restarts (AllPodsRunning: all 2 pods are running)"
    restarting = status("Restarting", "1/2", 1, "PodFailed", "")
    assert restarting.line() == "mnist: Restarting, 1/2 ready, 1 restart (PodFailed)"
    assert JobStatus.of({"metadata": {"name": "new"}}).line() == "new: waiting for the operator, 0 restarts"


def test_a_line_per_change_only() -> None:
    out = io.StringIO()
    show = print_changes(out)
    for s in (status("Pending", "0/2", reason="", message=""), status(), status(), status("Succeeded", "0/2")):
        show(s)
    assert out.getvalue().splitlines() == [
        "mnist: Pending, 0/2 ready, 0 restarts",
        "mnist: Running, 2/2 ready, 0 restarts (AllPodsRunning: all 2 pods are running)",
        "mnist: Succeeded, 0/2 ready, 0 restarts (AllPodsRunning: all 2 pods are running)",
    ]


def test_outside_a_notebook_progress_is_plain_lines() -> None:
    assert default_progress().__qualname__.startswith("print_changes")


PROGRESS = {"epoch": 3, "totalEpochs": 4, "step": 150, "totalSteps": 200, "percent": 75, "eta": "12s",
            "remainingSeconds": 12, "metrics": {"loss": 0.0213, "accuracy": 0.91}, "reporter": "mnist-worker-0",
            "reportedAt": "2026-11-25T12:00:00Z",
            "history": [{"at": f"2026-11-25T11:59:{s:02d}Z", "step": s, "metrics": {"loss": 1 / (1 + s)}}
                        for s in range(0, 60, 10)],
            "evaluation": {"metrics": {"loss": 0.0245}, "reporter": "mnist-evaluator-0",
                           "reportedAt": "2026-11-25T11:59:20Z"}}


def test_wait_shows_the_epoch_and_loss() -> None:
    reported = JobStatus.of({"metadata": {"name": "mnist"}, "status": {
        "phase": "Running", "ready": "2/2", "restarts": 0, "progress": PROGRESS}})
    assert reported.line() == ("mnist: Running, 2/2 ready, 0 restarts, epoch 3/4, step 150/200, 75%, ETA 12s, "
                               "loss 0.0213")


def test_disttrain_progress_draws_where_it_is_and_a_curve_per_metric() -> None:
    import datetime

    from disttrain.client.curves import draw, sparkline

    now = datetime.datetime(2026, 11, 25, 12, 0, 2, tzinfo=datetime.UTC)
    lines = draw({"metadata": {"name": "mnist"}, "status": {"phase": "Running", "progress": PROGRESS}}, now)
    assert lines == [
        "mnist  Running  epoch 3/4  step 150/200  75%  ETA 12s  (mnist-worker-0, 2s ago)",
        "  loss      █▁▁▁▁▁  0.0213",
        "  accuracy    0.91",
        "  evaluation (mnist-evaluator-0, 42s ago): loss 0.0245",
    ]
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█" and sparkline([2, 2]) == "▁▁"
    assert draw({"metadata": {"name": "new"}, "status": {}}, now) == [
        "new  (no phase yet)  no progress reported yet (its pods report with disttrain_progress)"]


def test_disttrain_progress_shows_where_the_gpu_hours_went_and_a_stall() -> None:
    import datetime

    from disttrain.client.usage import usage_lines

    now = datetime.datetime(2026, 11, 29, 12, 0, 30, tzinfo=datetime.UTC)
    status = {"conditions": [{"type": "Stalled", "status": "True", "lastTransitionTime": "2026-11-29T12:00:00Z",
                              "message": "the training has reported step 50 since 11:58"}],
              "usage": {"resource": "nvidia.com/gpu", "allocatedSeconds": 7200.0, "goodputPercent": 75,
                        "countedAt": "2026-11-29T12:00:18Z",
                        "seconds": {"training": 5400.0, "redone": 720.0, "waiting": 360.0, "stalled": 720.0}}}
    assert usage_lines(status, now) == [
        "  Stalled (30s ago): the training has reported step 50 since 11:58",
        "  GPU-hours 2.00, goodput 75% (counted 12s ago): training 75%  redone 10%  waiting 5%  stalled 10%"]
    assert usage_lines({"usage": {"resource": "cpu", "seconds": {}, "allocatedSeconds": 0}}, now) == [
        "  CPU core-hours 0.00 (counted ?)"]
    assert usage_lines({"usage": "junk"}, now) == []
