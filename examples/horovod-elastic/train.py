"""Elastic Horovod with Keras (TF 2.15, Keras 2): the world grows and shrinks while it trains.

horovodrun runs this on the hosts /etc/mpi/discover_hosts.sh prints (the operator keeps it to the
job's Ready workers) and re-runs the discovery every second. When a host comes or goes, every rank
stops at its next commit, the world is formed again with the new size, the state (weights,
optimizer, epoch, batch) is broadcast from a surviving rank, and `train` goes on where the last
commit left it: no process restart for the ranks that stay, and a worker killed costs only the
batches since the last commit.

Rank 0 also saves a checkpoint at each epoch's end under CHECKPOINT_DIR (a volume the workers
share): a whole-job restart (too few workers for too long) resumes from it. Every rank prints one
JSON line per event: {"event": "world", "size": 3, "rank": 0, "epoch": 1, "batch": 40}.

Environment: EPOCHS (default 4), STEPS_PER_EPOCH (default 50), BATCHES_PER_COMMIT (default 5),
STEP_SECONDS (default 0: a pause per batch, so a demonstration lasts long enough to scale it),
STOP_FILE (optional: once this path exists, training ends at the next epoch's end; rank 0 looks
and every rank follows), CHECKPOINT_DIR (default /tmp/checkpoints).
"""

import hashlib
import json
import os
import sys
import time

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

try:  # the disttrain images' progress client: rank 0 reports epochs, steps and loss to the operator
    import disttrain_progress
except ImportError:  # run elsewhere: nothing to report to
    disttrain_progress = None

LEARNING_RATE = 0.01


def say(**event: object) -> None:
    # One write per line: under PYTHONUNBUFFERED (the images') print writes the text and its newline
    # apart, and mpirun, forwarding every rank's output to one stream, put another rank's line between
    # them (`{...epoch 3...}{"event": "done", "rank": 1...}`, seen in a fresh `make test`).
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class Pace(tf.keras.callbacks.Callback):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        time.sleep(self.seconds)


class StopWhenAsked(tf.keras.callbacks.Callback):
    """Ends training at an epoch's end once `path` exists, on every rank at the same epoch."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if hvd_tf.broadcast_object(bool(self.path) and os.path.exists(self.path), root_rank=0, name="stop"):
            self.model.stop_training = True


class EpochCheckpoint(tf.keras.callbacks.Callback):
    """Rank 0 saves at each epoch's end; the other ranks hold the same weights."""

    def __init__(self, state: "hvd.elastic.KerasState", manager: tf.train.CheckpointManager,
                 epoch: tf.Variable) -> None:
        super().__init__()
        self.state, self.manager, self.epoch = state, manager, epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if hvd.rank() == 0:
            self.epoch.assign(self.state.epoch + 1)
            self.manager.save()
            say(event="epoch_end", epoch=int(self.state.epoch), size=hvd.size(),
                loss=float((logs or {}).get("loss", 0.0)))


def weights_digest(model: tf.keras.Model) -> str:
    return hashlib.sha256(json.dumps([w.tolist() for w in model.get_weights()]).encode()).hexdigest()


def main() -> None:
    hvd.init()
    rng = np.random.RandomState(1234)
    x = rng.rand(1024, 8).astype("float32")
    y = (x @ np.arange(1, 9, dtype="float32").reshape(8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1024, seed=hvd.rank()).batch(32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(8,))])
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LEARNING_RATE * hvd.size()))
    model.compile(optimizer=optimizer, loss="mse")
    # The optimizer's own variables (its step count) exist on every rank before any trains: a rank
    # that joins later would otherwise broadcast fewer variables at the reset than the ranks that
    # trained, and the reset hangs in the broadcast (seen: 2 -> 3, every rank stuck in sync()).
    optimizer.build(model.trainable_variables)

    epochs = int(os.environ.get("EPOCHS", "4"))
    steps = int(os.environ.get("STEPS_PER_EPOCH", "50"))
    epoch = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, epoch=epoch),
                                         os.environ.get("CHECKPOINT_DIR", "/tmp/checkpoints"), max_to_keep=2)
    if manager.latest_checkpoint:  # a whole-job restart: every rank reads the same files
        manager.checkpoint.restore(manager.latest_checkpoint)
    state = hvd.elastic.KerasState(model, batch=0, epoch=int(epoch.numpy()))
    callbacks = [
        hvd.elastic.CommitStateCallback(state, batches_per_commit=int(os.environ.get("BATCHES_PER_COMMIT", "5"))),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        EpochCheckpoint(state, manager, epoch),
        Pace(float(os.environ.get("STEP_SECONDS", "0"))),
        StopWhenAsked(os.environ.get("STOP_FILE", "")),
    ]
    if disttrain_progress:  # rank 0 only: the others' reporter is silent
        callbacks.append(disttrain_progress.keras_callback(disttrain_progress.for_rank(hvd.rank())))

    @hvd.elastic.run
    def train(state: "hvd.elastic.KerasState") -> None:
        # The effective batch is the world's: so is the learning rate. Set here, on every (re)start
        # of every rank: a rank that joins made its optimizer before its world was formed, and a
        # reset callback runs only on the ranks that were there (seen: the joiner kept the old
        # rate, and the ranks' weights parted).
        tf.keras.backend.set_value(state.model.optimizer.lr, LEARNING_RATE * hvd.size())
        say(event="world", size=hvd.size(), rank=hvd.rank(), epoch=int(state.epoch), batch=int(state.batch),
            learning_rate=float(tf.keras.backend.get_value(state.model.optimizer.lr)),
            weights_sha256=weights_digest(state.model))
        state.model.fit(data, steps_per_epoch=steps, initial_epoch=state.epoch, epochs=epochs, verbose=0,
                        callbacks=callbacks)

    train(state)
    say(event="done", rank=hvd.rank(), size=hvd.size(), weights_sha256=weights_digest(model))


if __name__ == "__main__":
    main()
