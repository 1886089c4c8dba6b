"""A checkpoint when the operator asks for one (issue 33), for a Keras fit with a BackupAndRestore
callback: saved with that callback's own state (so a resumed fit continues from the saved step,
not the epoch), and confirmed to the operator by the reporting pod.

Every `every_steps` batches each worker reads its checkpoint-request file (one small read); the
workers of a MultiWorkerMirroredStrategy agree with an all-reduce of that flag, so every worker
saves at the same step (a collective save), though the kubelet writes each pod's file at its own
moment. tf_keras's own BackupAndRestore(save_before_preemption=True) would do this only on GCP
(tf_keras/src/distribute/distributed_file_utils.py: support_on_demand_checkpoint_callback).

For the resumed fit to start at the saved batch, the training state's save frequency is made a
step count once a batch was saved (tf_keras's WorkerTrainingState reads the saved batch only
then), and the saved batch is kept at the epoch's last step otherwise, so an epoch-end backup
still resumes at the next epoch.
"""

from __future__ import annotations

from typing import Any

import disttrain_progress as progress

MARK = "_disttrain_checkpoint"
STEP_COUNT = 2**62  # a save frequency no training reaches: batches are read back, no save is added


def checkpoint_callback(backup: Any, every_steps: int = 10) -> Any:
    import tensorflow as tf

    class CheckpointOnRequest(tf.keras.callbacks.Callback):  # type: ignore[misc]
        _disttrain_checkpoint = True

        def __init__(self) -> None:
            super().__init__()
            self.epoch, self.steps, self.seen = 0, 0, 0

        def _state(self) -> Any:
            return getattr(self.model, "_training_state", None)

        def on_train_begin(self, logs: Any = None) -> None:
            state = self._state()
            if state is not None and int(state._ckpt_saved_batch.numpy()) >= 0:
                state._save_freq = STEP_COUNT

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch, self.steps = epoch, int(self.params.get("steps") or 0)
            state = self._state()
            if state is not None and self.steps:
                state._ckpt_saved_batch.assign(self.steps - 1)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.seen += 1
            state = self._state()
            if state is None or self.seen % every_steps:
                return
            request = progress.checkpoint_requested()
            if not agreed(self.model.distribute_strategy, request is not None):
                return
            state._ckpt_saved_epoch.assign(self.epoch)
            state._ckpt_saved_batch.assign(batch)
            state.back_up(self.epoch, batch)
            state._ckpt_saved_batch.assign(self.steps - 1 if self.steps else batch)
            state._save_freq = STEP_COUNT
            if request is not None:
                step = self.epoch * self.steps + batch + 1 if self.steps else None
                progress.confirm_checkpoint(request, step=step, path=str(getattr(backup, "backup_dir", "")))

    return CheckpointOnRequest()


def agreed(strategy: Any, mine: bool) -> bool:
    """Whether any worker saw the request: every worker of a MultiWorkerMirroredStrategy calls this
    at the same step, and they all get the same answer."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return mine
    flag = strategy.experimental_distribute_values_from_function(lambda _: tf.constant(int(mine)))
    return int(strategy.reduce(tf.distribute.ReduceOp.SUM, flag, axis=None)) > 0
