"""How `Client.wait()` shows a job's progress: a plain line each time something changed (a
terminal, a log file, CI), or one line kept up to date in a notebook (IPython's display)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from disttrain.client.curves import short


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands, from its `status` (what `kubectl get dtj` shows)."""

    name: str
    phase: str  # "" until the operator has written a status
    ready: str  # "2/4": Ready pods / pods wanted
    restarts: int
    reason: str
    message: str
    training: str = ""  # what its pods reported: "epoch 3/4, 75%, ETA 12s, loss 0.0213" (client/curves.py)

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> JobStatus:
        status = job.get("status") or {}
        return cls(name=(job.get("metadata") or {}).get("name", ""), phase=status.get("phase", ""),
                   ready=status.get("ready", ""), restarts=int(status.get("restarts") or 0),
                   reason=status.get("reason", ""), message=status.get("message", ""),
                   training=short(status.get("progress")))

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def line(self) -> str:
        """`mnist: Running, 2/2 ready, 0 restarts, epoch 3/4, 75%, ETA 12s, loss 0.0213 (AllPodsRunning: ...)`"""
        head = f"{self.name}: {self.phase or 'waiting for the operator'}"
        if self.ready:
            head += f", {self.ready} ready"
        head += f", {self.restarts} restart{'' if self.restarts == 1 else 's'}"
        if self.training:
            head += f", {self.training}"
        why = ": ".join(x for x in (self.reason, self.message) if x)
        return f"{head} ({why})" if why else head


Progress = Callable[[JobStatus], None]


def print_changes(stream: TextIO | None = None) -> Progress:
    """A line each time the job's line changes."""
    last: list[str] = []

    def show(status: JobStatus) -> None:
        line = status.line()
        if not last or last[0] != line:
            print(line, file=stream or sys.stderr, flush=True)
            last[:] = [line]
    return show


def notebook_display() -> Progress | None:
    """One line updated in place, when running in a notebook kernel; None elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import Pretty, display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):  # a terminal IPython prints lines like any terminal
        return None
    handle: list[Any] = []

    def show(status: JobStatus) -> None:
        shown = Pretty(status.line())
        if not handle:
            handle.append(display(shown, display_id=True))
        else:
            handle[0].update(shown)
    return show


def default_progress() -> Progress:
    return notebook_display() or print_changes()
