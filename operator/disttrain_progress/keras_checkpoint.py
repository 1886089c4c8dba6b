"""A checkpoint when the operator asks for one (issue 33), for a Keras fit with a BackupAndRestore
callback: saved with that callback's own state (so a resumed fit continues from the saved step,
not the epoch), and confirmed to the operator by the reporting pod.

Every `every_steps` batches each worker reads its checkpoint-request file (one small read); the
workers of a MultiWorkerMirroredStrategy agree with an all-reduce of that flag, so every worker
saves at the same step (a collective save), though the kubelet writes each pod's file at its own
moment. tf_keras's own BackupAndRestore(save_before_preemption=True) would do this only on GCP
(tf_keras/src/distribute/distributed_file_utils.py: support_on_demand_checkpoint_callback).

A stop that gives no notice (a drain, a taint eviction, the scheduler's preemption: the pod is
deleted as its DisruptionTarget is written, and the kubelet's SIGTERM is the first word of it) is
saved the same way: while the fit runs, SIGTERM asks for a checkpoint at the next poll (the peers
join through the all-reduce), and once it is saved and confirmed the process exits 143, as SIGTERM
would have it (a training running as PID 1 would otherwise ignore SIGTERM and wait out its grace
period for the SIGKILL). A SIGTERM within a minute of a checkpoint saved exits at once: it is the
stop that checkpoint was for (the operator stops the pods as soon as one is confirmed), and a
second save would need peers that may be gone already; and after a save the operator asked for,
the fit waits for that SIGTERM (steps trained in the second before it would be done again). A
script with its own SIGTERM handler keeps it, and none of this is installed.

For the resumed fit to start at the saved batch, the training state's save frequency is made a
step count once a batch was saved (tf_keras's WorkerTrainingState reads the saved batch only
then), and the saved batch is kept at the epoch's last step otherwise, so an epoch-end backup
still resumes at the next epoch.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import disttrain_progress as progress

MARK = "_disttrain_checkpoint"
STEP_COUNT = 2**62  # a save frequency no training reaches: batches are read back, no save is added
TERMINATED = 128 + signal.SIGTERM  # a process ended by SIGTERM, as a shell and the kubelet report it
FRESH_SECONDS = 60.0  # a SIGTERM this soon after a save ends the process without another
ON_SIGTERM = "sigterm"  # the request a save on SIGTERM confirms when the file names none


class OnSigterm:
    """SIGTERM, while a fit runs: a checkpoint at the next poll, then the exit (`exit_after_save`)."""

    def __init__(self) -> None:
        self.received, self.installed = False, False
        self.previous: Any = None  # the handler this one replaced, while it is installed
        self.saved_at: float | None = None
        self.pid = os.getpid()

    def install(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a script's own handler stays
                self.previous = signal.signal(signal.SIGTERM, self.handle)
                self.installed = True
        except ValueError:  # not the main thread: the fit runs elsewhere, SIGTERM stays as it was
            self.installed = False

    def uninstall(self) -> None:
        """At the fit's end: SIGTERM as it was; one received in the fit's last batches ends the process."""
        if self.installed and signal.getsignal(signal.SIGTERM) == self.handle:
            signal.signal(signal.SIGTERM, self.previous)
        self.installed = False
        if self.received:
            exit_now()

    def handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:  # a process forked while the fit runs (a data loader's pool)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.recently_saved():
            exit_now()  # the stop that checkpoint was for: nothing more to save
        self.received = True

    def recently_saved(self) -> bool:
        return self.saved_at is not None and time.monotonic() - self.saved_at < FRESH_SECONDS

    def exit_after_save(self) -> None:
        if self.received:
            exit_now()

    def await_stop(self, request: str) -> None:
        """After a save the operator asked for, the stop follows within a second or two: steps
        trained meanwhile would only be done again. Wait for its SIGTERM (the handler exits) while
        the file still asks, a minute at most; a stop called off empties the file and training goes
        on. Not with a script's own SIGTERM handler, which may never end the process."""
        if not self.installed:
            return
        until = time.monotonic() + FRESH_SECONDS
        while time.monotonic() < until and progress.request_in_file() == request:
            time.sleep(0.1)


def exit_now() -> None:
    progress.flush(2.0)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(TERMINATED)


def checkpoint_callback(backup: Any, every_steps: int = 10) -> Any:
    import tensorflow as tf

    class CheckpointOnRequest(tf.keras.callbacks.Callback):  # type: ignore[misc]
        _disttrain_checkpoint = True
        _supports_tf_logs = True  # its batch hooks read no logs: Keras needn't copy them to numpy each batch

        def __init__(self) -> None:
            super().__init__()
            self.epoch, self.steps, self.seen, self.saved_step, self.enabled = 0, 0, 0, 0, False
            self.sigterm = OnSigterm()

        def _state(self) -> Any:
            return getattr(self.model, "_training_state", None)

        def on_train_begin(self, logs: Any = None) -> None:
            # Only a fit of known length: tf_keras resumes mid-epoch from steps_per_epoch (None for a
            # dataset of unknown cardinality, where it would fail on every resume).
            self.enabled = self._state() is not None and bool(self.params.get("steps"))
            if self.enabled and int(self._state()._ckpt_saved_batch.numpy()) >= 0:
                self._state()._save_freq = STEP_COUNT
            if self.enabled:
                self.sigterm.install()

        def on_train_end(self, logs: Any = None) -> None:
            self.sigterm.uninstall()

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch, self.steps = epoch, int(self.params.get("steps") or 0)
            if self.enabled:
                self._state()._ckpt_saved_batch.assign(self.steps - 1)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.seen += 1
            if not self.enabled or self.seen % every_steps:
                return
            request = progress.checkpoint_requested()
            if request is not None and self.sigterm.recently_saved():
                # Read after the save it asked for (a peer read it first, or a SIGTERM came first):
                # that save answers it, on every worker alike (they saved together).
                self.confirm(request)
                request = None
            request = request or (ON_SIGTERM if self.sigterm.received else None)
            if not agreed(self.model.distribute_strategy, request is not None):
                return
            state = self._state()
            state._ckpt_saved_epoch.assign(self.epoch)
            state._ckpt_saved_batch.assign(batch)
            state.back_up(self.epoch, batch)
            state._ckpt_saved_batch.assign(self.steps - 1)
            state._save_freq = STEP_COUNT
            self.saved_step = self.epoch * self.steps + batch + 1
            self.sigterm.saved_at = time.monotonic()
            # A peer's SIGTERM or request before this worker read its own file: the file's, if any.
            answered = request if request not in (None, ON_SIGTERM) else progress.checkpoint_requested()
            self.confirm(answered or ON_SIGTERM)
            self.sigterm.exit_after_save()
            if answered is not None:
                self.sigterm.await_stop(answered)

        def confirm(self, request: str) -> None:
            progress.confirm_checkpoint(request, step=self.saved_step, path=str(getattr(backup, "backup_dir", "")))

    return CheckpointOnRequest()


def agreed(strategy: Any, mine: bool) -> bool:
    """Whether any worker saw the request: every worker of a MultiWorkerMirroredStrategy calls this
    at the same step, and they all get the same answer."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return mine
    flag = strategy.experimental_distribute_values_from_function(lambda _: tf.constant(int(mine)))
    return int(strategy.reduce(tf.distribute.ReduceOp.SUM, flag, axis=None)) > 0
