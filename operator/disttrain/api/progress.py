"""Training progress as pods report it: who may report for a job, and what a report may hold.

A job's pods report to the operator's progress endpoint (endpoint/server.py) with a
projected service-account token that names the pod; the operator keeps the latest report of each
role and writes `status.progress` from it (decide/progress.py). One pod reports a job's training
(TensorFlow: the chief, or worker 0 without one, which is the coordinator of a ParameterServer
job; MPI: rank 0, which runs on a worker or the launcher), and the evaluator its evaluation.

Reports are bounded so that no pod can grow a job's status or the operator's metrics: at most
MAX_METRICS metrics, named like Prometheus labels, each a finite number.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from disttrain.api.spec import JobSpec, ReplicaType

# The audience of the tokens pods report with: a token for it is good for nothing else (the API
# server refuses it), and a token for the API server is refused here.
AUDIENCE = "disttrain.dev/progress"
MAX_METRICS = 16
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_COUNT = 10**12  # epochs and steps: a bound that no training reaches and a JSON number holds exactly
MAX_PATH = 1024
REQUEST_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # decide/checkpoint_steps.py makes them
FIELDS = {"epoch": "epoch", "totalEpochs": "total_epochs", "step": "step", "totalSteps": "total_steps"}


class Role(StrEnum):
    TRAINING = "training"
    EVALUATION = "evaluation"


def reporter_role(spec: JobSpec, replica_type: str, index: int) -> Role | None:
    """What a pod of the job may report, if anything."""
    if spec.tensorflow is not None:
        if replica_type == ReplicaType.EVALUATOR:
            return Role.EVALUATION
        if ReplicaType.CHIEF in spec.replicas:
            return Role.TRAINING if replica_type == ReplicaType.CHIEF else None
        return Role.TRAINING if (replica_type, index) == (ReplicaType.WORKER, 0) else None
    # MPI: whichever pod runs rank 0 (the hostfile's first worker, or the launcher's own ranks).
    return Role.TRAINING if replica_type in (ReplicaType.LAUNCHER, ReplicaType.WORKER) else None


class ReportError(ValueError):
    """A report the operator refuses: the message says which field and why."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint the training confirms it saved, for the request it answers (a stop the
    operator holds until then: decide/checkpoint_steps.py)."""

    request: str  # the request's id, as the pod read it from its checkpoint-request file
    step: int | None = None  # the step it holds: a resumed training continues from there
    path: str = ""  # where it is, as the training names it (a folder on the shared volume, a URL)


@dataclass(frozen=True)
class Report:
    epoch: int | None = None  # epochs completed
    total_epochs: int | None = None
    step: int | None = None  # steps completed, over the whole training
    total_steps: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None

    @property
    def fraction(self) -> float | None:
        """How much of the training is done, 0 to 1: by steps when both are known, else by epochs."""
        for done, total in ((self.step, self.total_steps), (self.epoch, self.total_epochs)):
            if done is not None and total:
                return min(1.0, done / total)
        return None


def parse_report(body: Any) -> Report:
    """A report's JSON body: `{"epoch": 3, "totalEpochs": 10, "step": 1200, "totalSteps": 4000,
    "metrics": {"loss": 0.23}, "checkpoint": {"request": "r1", "step": 1200, "path": "/ckpt/1200"}}`,
    every field optional."""
    if not isinstance(body, Mapping):
        raise ReportError("a report is a JSON object")
    unknown = sorted(set(body) - set(FIELDS) - {"metrics", "checkpoint"})
    if unknown:
        raise ReportError(f"unknown field {unknown[0]!r}: a report has "
                          f"{', '.join([*FIELDS, 'metrics', 'checkpoint'])}")
    counts: dict[str, int | None] = {}
    for name, attr in FIELDS.items():
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT):
            raise ReportError(f"{name} must be a whole number from 0 to {MAX_COUNT}, not {value!r}")
        counts[attr] = value
    for total in ("totalEpochs", "totalSteps"):
        if body.get(total) == 0:
            raise ReportError(f"{total} must be at least 1")
    return Report(**counts, metrics=parse_metrics(body.get("metrics")),
                  checkpoint=parse_checkpoint(body.get("checkpoint")))


def parse_checkpoint(body: Any) -> Checkpoint | None:
    """`{"request": ID, "step": N, "path": TEXT}`: the request an id as the operator writes them,
    the path printable text of at most MAX_PATH characters (it goes to the job's status)."""
    if body is None:
        return None
    if not isinstance(body, Mapping):
        raise ReportError("checkpoint must be an object: request, step, path")
    unknown = sorted(set(body) - {"request", "step", "path"})
    if unknown:
        raise ReportError(f"unknown field checkpoint.{unknown[0]}: a checkpoint has request, step, path")
    request, step, path = body.get("request"), body.get("step"), body.get("path", "")
    if not isinstance(request, str) or not REQUEST_ID.fullmatch(request):
        raise ReportError("checkpoint.request must be the id read from the checkpoint-request file")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_COUNT):
        raise ReportError(f"checkpoint.step must be a whole number from 0 to {MAX_COUNT}")
    if not isinstance(path, str) or len(path) > MAX_PATH or not path.isprintable():
        raise ReportError(f"checkpoint.path must be printable text of at most {MAX_PATH} characters")
    return Checkpoint(request, step, path)


def parse_metrics(metrics: Any) -> dict[str, float]:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise ReportError("metrics must be an object of names to numbers")
    if len(metrics) > MAX_METRICS:
        raise ReportError(f"at most {MAX_METRICS} metrics, not {len(metrics)}")
    out = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            raise ReportError(f"metric name {name!r}: letters, digits and _, not starting with a digit, "
                              "at most 64 characters")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(number := _float(value)):
            raise ReportError(f"metric {name} must be a finite number, not {str(value)[:40]}")
        out[name] = number
    return out


def _float(value: int | float) -> float:
    """An int past a float's range (JSON has no bound on digits) is not finite, not an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf
