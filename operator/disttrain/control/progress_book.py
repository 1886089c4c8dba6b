"""The latest report of each role of each job, as the progress endpoint accepted them.

Only the latest matters: `status.progress` keeps its own history (decide/progress.py), so what
lives here is one report per role per job and the usual gap between training reports, and
nothing is lost by a restart that the next report doesn't bring back. A report wakes the job's
reconcile through `wake`, which the controller times by the status writes' own interval: however
often pods report, a job is looked at for it once per interval, and at once only for a checkpoint
while the job's stop waits for one. A checkpoint confirms a held stop only from the training's
reporter (the role the endpoint's verified pod has: api/progress.py).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from dataclasses import dataclass

from disttrain.api.progress import Report, Role
from disttrain.decide.progress import ProgressState, Reported
from disttrain.runtime import metrics

JobKey = tuple[str, str]
GAP_WEIGHT = 0.3  # of the newest gap in the running average of gaps between training reports


@dataclass
class _Entry:
    uid: str  # the job's: a job made again under the same name starts afresh
    state: ProgressState


class ProgressBook:
    def __init__(self, wake: Callable[[JobKey], None] = lambda key: None,
                 wake_now: Callable[[JobKey], None] | None = None,
                 awaits_checkpoint: Callable[[JobKey], bool] = lambda key: False) -> None:
        """`awaits_checkpoint`: whether the job's stop waits for a checkpoint now (its status.checkpoint)."""
        self.wake, self.wake_now = wake, wake_now or wake
        self.awaits_checkpoint = awaits_checkpoint
        self._entries: dict[JobKey, _Entry] = {}

    def record(self, key: JobKey, job_uid: str, role: Role, reporter: str, report: Report,
               at: datetime.datetime) -> None:
        entry = self._entries.get(key)
        if entry is None or entry.uid != job_uid:
            entry = self._entries[key] = _Entry(job_uid, ProgressState())
        state = entry.state
        if role is not Role.TRAINING and report.checkpoint is not None:
            # Only the training's reporter saves what a resumed run starts from: an evaluator's
            # checkpoint is none of the training's, and its report would end a hold unsaved.
            report = dataclasses.replace(report, checkpoint=None)
        reported = Reported(report, reporter, at)
        checkpoint = reported if report.checkpoint is not None else state.checkpoint
        if role is Role.TRAINING:
            gap = state.gap_seconds
            if state.training is not None:
                newest = max(0.0, (at - state.training.at).total_seconds())
                gap = newest if gap is None else (1 - GAP_WEIGHT) * gap + GAP_WEIGHT * newest
            entry.state = ProgressState(training=reported, evaluation=state.evaluation, gap_seconds=gap,
                                        checkpoint=checkpoint)
        else:
            entry.state = ProgressState(training=state.training, evaluation=reported, gap_seconds=state.gap_seconds,
                                        checkpoint=checkpoint)
        metrics.JOB_GAUGES.observe_report(key, role.value, report)
        # A confirmed checkpoint releases a held stop (a preemptor waits on it): looked at now, not
        # at the status writes' interval. Only while a request waits: else a reporter sending
        # checkpoints would force a pass per report past that interval.
        now = report.checkpoint is not None and self.awaits_checkpoint(key)
        (self.wake_now if now else self.wake)(key)

    def state(self, key: JobKey, job_uid: str) -> ProgressState | None:
        entry = self._entries.get(key)
        return entry.state if entry is not None and entry.uid == job_uid else None

    def forget(self, key: JobKey) -> None:
        self._entries.pop(key, None)
