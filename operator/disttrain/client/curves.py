"""`disttrain progress JOB`: a job's training as its status tells it (status.progress), drawn for a
terminal: where it is, when it will end, and a sparkline per metric over its history.

    mnist-mwms  Running  epoch 3/4  step 150/200  75%  ETA 12s  (mnist-mwms-worker-0, 2s ago)
      loss      █▆▄▃▂▂▁▁  0.0213
      evaluation (mnist-evaluator-0, 40s ago): loss 0.0245

Pure functions of the job's object and the clock (the command reads, and with -f follows, the job).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any

from disttrain.api.times import parse_timestamp

BARS = "▁▂▃▄▅▆▇█"
WIDTH = 40  # sparkline columns at most: the history holds up to 40 points (decide/progress.py)


def sparkline(values: Sequence[float], width: int = WIDTH) -> str:
    """One character per value (the last `width`), scaled between their least and greatest."""
    values = [v for v in values if math.isfinite(v)][-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    return "".join(BARS[0 if span == 0 else min(len(BARS) - 1, int((v - low) / span * len(BARS)))] for v in values)


def number(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"


def ago(when: str | None, now: datetime.datetime) -> str:
    moment = parse_timestamp(when)
    if moment is None:
        return "?"
    seconds = max(0, int((now - moment).total_seconds()))
    return f"{seconds}s ago" if seconds < 120 else f"{seconds // 60}m ago"


def headline(progress: Mapping[str, Any]) -> str:
    """`epoch 3/4  step 150/200  75%  ETA 12s`: what is known of it."""
    parts = []
    for done, total, word in (("epoch", "totalEpochs", "epoch"), ("step", "totalSteps", "step")):
        if progress.get(done) is not None:
            parts.append(f"{word} {progress[done]}" + (f"/{progress[total]}" if progress.get(total) else ""))
    if progress.get("percent") is not None:
        parts.append(f"{progress['percent']}%")
    if progress.get("eta"):
        parts.append("stale: no report lately" if progress.get("stale") else f"ETA {progress['eta']}")
    return "  ".join(parts)


def draw(job: Mapping[str, Any], now: datetime.datetime) -> list[str]:
    """The lines `disttrain progress` prints for `job` (as the API serves it)."""
    name = (job.get("metadata") or {}).get("name", "")
    status = job.get("status") or {}
    progress = status.get("progress") or {}
    phase = status.get("phase") or "(no phase yet)"
    if not progress:
        return [f"{name}  {phase}  no progress reported yet (its pods report with disttrain_progress)"]
    lines = [f"{name}  {phase}  {headline(progress)}  ({progress.get('reporter', '?')}, "
             f"{ago(progress.get('reportedAt'), now)})"]
    history = progress.get("history") or []
    names = list(progress.get("metrics") or {})
    width = max((len(n) for n in names), default=0)
    for metric in names:
        series = [float(point["metrics"][metric]) for point in history if metric in (point.get("metrics") or {})]
        lines.append(f"  {metric:<{width}}  {sparkline(series)}  {number(float(progress['metrics'][metric]))}")
    evaluation = progress.get("evaluation")
    if evaluation:
        values = " ".join(f"{k} {number(float(v))}" for k, v in (evaluation.get("metrics") or {}).items())
        lines.append(f"  evaluation ({evaluation.get('reporter', '?')}, {ago(evaluation.get('reportedAt'), now)}): "
                     f"{values}")
    return lines


def short(progress: Mapping[str, Any] | None) -> str:
    """One clause for a status line (Client.wait): `epoch 3/4, 75%, ETA 12s, loss 0.0213`."""
    if not progress:
        return ""
    parts = [p for p in headline(progress).split("  ") if p]
    loss = (progress.get("metrics") or {}).get("loss")
    if loss is not None:
        parts.append(f"loss {number(float(loss))}")
    return ", ".join(parts)
