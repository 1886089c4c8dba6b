"""The columns `kubectl get disttrainjobs` shows (`-o wide`: those of priority 1 as well)."""

from __future__ import annotations

from disttrain.api.crd_spec import Schema


def printer_columns() -> list[Schema]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Phase of the job."},
        {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "Pods Ready / wanted."},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "description": "Restarts so far."},
        {"name": "Progress%", "type": "integer", "jsonPath": ".status.progress.percent",
         "description": "Percent of the training done, as its pods reported."},
        {"name": "ETA", "type": "string", "jsonPath": ".status.progress.eta",
         "description": "Time left at the recent rate, or stale when the reports stopped."},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason",
         "description": "Why the job is where it is: Queued, WaitingForGang, Unschedulable, ImagePullBackOff, ..."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Framework", "type": "string", "jsonPath": ".status.framework", "priority": 1},
        {"name": "Workers", "type": "integer", "jsonPath": ".status.elastic.workers", "priority": 1,
         "description": "An elastic job's workers in discovery now."},
        {"name": "Started", "type": "date", "jsonPath": ".status.startTime", "priority": 1},
        {"name": "Completed", "type": "date", "jsonPath": ".status.completionTime", "priority": 1},
        {"name": "Stalled", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Stalled\")].status",
         "priority": 1, "description": "True while the training's reported step stands still past its timeout."},
        {"name": "GPU-Hours", "type": "number", "jsonPath": ".status.usage.gpuHours", "priority": 1,
         "description": "GPU-hours the job's pods have held, as of status.usage.countedAt."},
        {"name": "CPU-Hours", "type": "number", "jsonPath": ".status.usage.cpuHours", "priority": 1,
         "description": "CPU core-hours a job without GPUs has held (requests), as of status.usage.countedAt."},
        {"name": "Goodput%", "type": "integer", "jsonPath": ".status.usage.goodputPercent", "priority": 1,
         "description": "Percent of the held GPU-seconds (or CPU) spent on training that counted."},
        {"name": "Metrics", "type": "string", "jsonPath": ".status.progress.metrics", "priority": 1,
         "description": "The latest reported training metrics."},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1,
         "description": "What the reason is, in words: Kueue's, the scheduler's, the kubelet's, the operator's."},
    ]
