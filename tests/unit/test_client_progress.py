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
